//! Reusing the room of a `BytesMut` whose contents were handed out as `Bytes` slices
//! (the fan-out's frame arenas, the WebSocket decoder's text arena).

use bytes::BytesMut;

/// Makes sure `buf` (empty: everything it held was split off) has room for `need`
/// bytes: when it lacks it, its allocation is taken back if no slice points into it
/// any more and it is at least `room` bytes (`try_reclaim`, no allocation), otherwise
/// a fresh allocation of `room` bytes (`room >= need`) replaces it. It is never grown
/// in place: that would copy the bytes already handed out.
pub(crate) fn reclaim_or_fresh(buf: &mut BytesMut, need: usize, room: usize) {
    debug_assert!(buf.is_empty() && room >= need);
    if buf.capacity() < need && !buf.try_reclaim(room) {
        *buf = BytesMut::with_capacity(room);
    }
}
