//! `--reconnect-storm --resume`: N subscribers (SSE or WS) connected and caught up on one
//! session, all dropped at once and all reconnecting at once with their resume position
//! (SSE `Last-Event-ID`, WS `subscribe.from`; AEP-0003 §3.3 #3, §6.5, §7), while a
//! publisher keeps POSTing one Event at a time. Reports the time until every subscriber is
//! subscribed again and until every one has caught up with what was published before the
//! storm, whether each resumed exactly (every `seq` once, in order, across the storm: no
//! gap, no duplicate), the 503s the relay answered at accept (retried after their
//! `Retry-After`), and the POST latency p50/p99/max before and during the storm.
//!
//! A POST's latency is measured twice: as the publisher thread saw it (from before its
//! write to the whole answer read), and up to the kernel's receive time of the answer
//! (`SO_TIMESTAMPNS`; on loopback, taken while the relay's write of the answer is
//! delivered), which leaves out the publisher's own wait for a CPU once the answer is
//! there. The publisher's wait on a run queue during each POST
//! (`/proc/thread-self/schedstat`) and the relay's during the storm
//! (`/proc/PID/schedstat`) are reported with them; `--publisher-fifo` runs the publisher
//! under `SCHED_FIFO`.
//!
//! The subscribers reconnect `--storm-threads` at a time; with `--storm-honor-retry`
//! each first waits the `retry:` its stream was sent, as an `EventSource` does.

use super::*;
use std::collections::VecDeque;
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::sync::Mutex;

/// `"seq":` and the template's 13 digits.
const SEQ: &[u8] = b"\"seq\":";

/// What the reader knows of one subscriber.
#[derive(Default, Clone)]
struct Track {
    /// The last `seq` received (`None`: nothing yet).
    last: Option<u64>,
    gaps: u64,
    dups: u64,
    /// The `retry:` value its stream was sent, ms.
    retry_ms: u64,
}

impl Track {
    /// Scans `data` (after `carry`) for `"seq":` values; keeps an unfinished tail.
    fn feed(&mut self, carry: &mut Vec<u8>, data: &[u8]) {
        carry.extend_from_slice(data);
        if self.retry_ms == 0 {
            if let Some(i) = memmem::find(carry, b"\nretry: ") {
                let v = &carry[i + 8..];
                if let Some(end) = v.iter().position(|b| !b.is_ascii_digit()) {
                    self.retry_ms = std::str::from_utf8(&v[..end])
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                }
            }
        }
        let mut at = 0;
        let mut cut = false;
        while let Some(i) = memmem::find(&carry[at..], SEQ) {
            let start = at + i + SEQ.len();
            // The digits and the byte after them.
            if start + COUNTER_DIGITS >= carry.len() {
                // A record cut by the read: kept whole for the next one.
                at += i;
                cut = true;
                break;
            }
            at = start + COUNTER_DIGITS;
            let digits = &carry[start..at];
            // An Event of the template has more members after its `seq`; a WS frame's own
            // position (`replay-exhausted`'s `earliest`, `closing`'s `delivered`) ends its
            // object there, and may hold as many digits.
            if !digits.iter().all(u8::is_ascii_digit) || carry[at] != b',' {
                at = start;
                continue;
            }
            let n = digits
                .iter()
                .fold(0u64, |v, &d| v * 10 + u64::from(d - b'0'))
                - COUNTER_BASE;
            match self.last {
                Some(l) if n <= l => self.dups += 1,
                Some(l) if n > l + 1 => {
                    self.gaps += n - l - 1;
                    self.last = Some(n);
                }
                _ => self.last = Some(n),
            }
        }
        if !cut {
            // What may be the start of `"seq":`.
            at = at.max(carry.len().saturating_sub(SEQ.len() - 1));
        }
        carry.drain(..at);
    }
}

/// Connects and writes `req` until the relay accepts it, retrying a 503 after its
/// `Retry-After` (until `until`). Returns the socket, the bytes read past the accepted
/// head, and how many 503s it got.
fn accepted(args: &Args, req: &[u8], ok: &[u8], until: Instant) -> (TcpStream, Vec<u8>, u64) {
    let mut refused = 0;
    loop {
        let mut s = connect(args.addr);
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        // A refused connection may be closed before the request is written.
        let _ = s.write_all(req);
        let mut got = read_until(
            &mut s,
            |b| memmem::find(b, b"\r\n\r\n").is_some(),
            "subscribe head",
        );
        let end = memmem::find(&got, b"\r\n\r\n").unwrap() + 4;
        if got.starts_with(ok) {
            return (s, got.split_off(end), refused);
        }
        if !got.starts_with(b"HTTP/1.1 503") || Instant::now() > until {
            fail(format!(
                "subscribe refused: {}",
                String::from_utf8_lossy(&got)
            ));
        }
        refused += 1;
        let after = header_number(&got[..end], "retry-after:").unwrap_or(1);
        thread::sleep(Duration::from_secs(after));
    }
}

/// Opens one subscriber of `args.target`, resuming after `last` (Event number) when
/// given; retries a 503 after its `Retry-After`. Returns the socket, the bytes of its
/// stream read past the subscription's opening, and how many 503s it got.
fn open_sub(
    args: &Args,
    session: &str,
    last: Option<u64>,
    until: Instant,
) -> (TcpStream, Vec<u8>, u64) {
    if args.target == Target::Ws {
        return open_ws(args, session, last, until);
    }
    let resume = last.map_or(String::new(), |n| {
        format!("Last-Event-ID: {session}:0:{}\r\n", COUNTER_BASE + n)
    });
    let req = format!(
        "GET /stream HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n{resume}\r\n",
        args.addr
    );
    let (s, rest, refused) = accepted(args, req.as_bytes(), b"HTTP/1.1 200", until);
    s.set_read_timeout(None).ok();
    (s, rest, refused)
}

/// One server-to-client WebSocket frame at the start of `b` (RFC 6455 §5.2): its
/// payload's range, or `None` while `b` does not hold all of it.
fn ws_server_frame(b: &[u8]) -> Option<std::ops::Range<usize>> {
    let (&b1, len7) = (b.get(1)?, usize::from(*b.get(1)? & 0x7F));
    let (len, mut at) = match len7 {
        126 => (
            usize::from(u16::from_be_bytes(b.get(2..4)?.try_into().ok()?)),
            4,
        ),
        127 => (
            u64::from_be_bytes(b.get(2..10)?.try_into().ok()?) as usize,
            10,
        ),
        n => (n, 2),
    };
    if b1 & 0x80 != 0 {
        at += 4; // a masking key (servers send none)
    }
    (b.len() >= at + len).then_some(at..at + len)
}

/// Reads whole frames from `s` (after `buf`) until one whose payload holds `want`; fails
/// on an `error` frame. Returns the bytes after that frame.
fn ws_await(s: &mut TcpStream, mut buf: Vec<u8>, want: &[u8], what: &str) -> Vec<u8> {
    loop {
        while let Some(p) = ws_server_frame(&buf) {
            let payload = &buf[p.clone()];
            if memmem::find(payload, want).is_some() {
                return buf.split_off(p.end);
            }
            if memmem::find(payload, b"\"type\":\"error\"").is_some() {
                fail(format!(
                    "{what} refused: {}",
                    String::from_utf8_lossy(payload)
                ));
            }
            buf.drain(..p.end);
        }
        buf.extend(read_until(s, |b| !b.is_empty(), what));
    }
}

/// A WS subscriber: the upgrade, `hello` as a consumer (AEP-0003 §4), then `subscribe`
/// with `from` at `last` (§6.5, §7) when given; returns once `subscribed` is read, with
/// the bytes after it (its replay's first frames).
fn open_ws(
    args: &Args,
    session: &str,
    last: Option<u64>,
    until: Instant,
) -> (TcpStream, Vec<u8>, u64) {
    let req = format!(
        "GET /socket HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        args.addr
    );
    let (mut s, rest, refused) = accepted(args, req.as_bytes(), b"HTTP/1.1 101", until);
    let mut out = Vec::new();
    let hello = format!(
        r#"{{"type":"hello","versions":["0.1"],"role":"consumer","identity":{{"agent":"aep-load","instance":"aep-load/{}"}}}}"#,
        std::process::id()
    );
    ws_frame(hello.as_bytes(), &mut out);
    s.write_all(&out)
        .unwrap_or_else(|e| fail(format!("ws hello: {e}")));
    let rest = ws_await(&mut s, rest, b"\"type\":\"hello\"", "ws hello");
    let from = last.map_or(String::new(), |n| {
        format!(
            r#","from":[{{"session":"{session}","epoch":0,"seq":{}}}]"#,
            COUNTER_BASE + n
        )
    });
    out.clear();
    ws_frame(
        format!(r#"{{"type":"subscribe","id":"load","filter":{{}}{from}}}"#).as_bytes(),
        &mut out,
    );
    s.write_all(&out)
        .unwrap_or_else(|e| fail(format!("ws subscribe: {e}")));
    let rest = ws_await(&mut s, rest, b"\"type\":\"subscribed\"", "ws subscribe");
    s.set_read_timeout(None).ok();
    (s, rest, refused)
}

/// One phase's POST latencies, ns.
struct PostHists {
    /// From before the write to the whole answer read by the publisher thread.
    seen: Hist,
    /// From before the write to the kernel's receive time of the answer's last bytes.
    arrived: Hist,
    /// The publisher thread's wait on a run queue during the POST.
    queued: Hist,
}

impl PostHists {
    fn new() -> PostHists {
        PostHists {
            seen: Hist::new(),
            arrived: Hist::new(),
            queued: Hist::new(),
        }
    }
}

/// The publisher: one keep-alive connection, one Event per POST at `rate` a second,
/// numbered from 0; records each POST's latencies in the histograms of the phase it
/// began in.
struct Publisher {
    /// Events published (the next one's number).
    next: AtomicU64,
    stop: AtomicBool,
    /// 0 before the storm, 1 during it, 2 after.
    phase: AtomicUsize,
    hists: Mutex<[PostHists; 3]>,
    errors: AtomicU64,
    /// How the publisher thread is scheduled: `default`, `fifo:50`, or why
    /// `--publisher-fifo` did not take effect.
    sched: Mutex<String>,
}

/// Puts the calling thread under `SCHED_FIFO` at `prio` and reads the policy back:
/// `fifo:PRIO` when it holds, else the error.
fn fifo(prio: i32) -> String {
    let param = libc::sched_param {
        sched_priority: prio,
    };
    // SAFETY: plain calls on the calling thread with a valid `sched_param`.
    let err =
        unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &param) };
    if err != 0 {
        return format!("failed: {}", io::Error::from_raw_os_error(err));
    }
    let (mut policy, mut got) = (0, libc::sched_param { sched_priority: 0 });
    // SAFETY: as above; both out-pointers are valid.
    let err = unsafe { libc::pthread_getschedparam(libc::pthread_self(), &mut policy, &mut got) };
    if err == 0 && policy == libc::SCHED_FIFO {
        format!("fifo:{}", got.sched_priority)
    } else {
        format!("failed: the policy read back is {policy}")
    }
}

/// `CLOCK_REALTIME` in ns, the clock of `SO_TIMESTAMPNS`.
fn realtime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A task's time waiting on a run queue so far, ns: the second field of its schedstat
/// file (`/proc/thread-self/schedstat`, `/proc/PID/schedstat`); 0 where the kernel does
/// not keep it.
fn runqueue_wait_ns(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Reads from `s` into `buf` with the kernel's receive time of the bytes read
/// (`SO_TIMESTAMPNS`, ns since the Unix epoch) when it gave one.
fn recv_stamped(s: &TcpStream, buf: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
    use std::os::fd::AsRawFd;
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // u64s: aligned for `cmsghdr`; room for one `timespec` message.
    let mut control = [0u64; 8];
    // SAFETY: `msghdr` is plain data; zeroed is its empty value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at `iov` (over `buf`) and `control`, both live for the call.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut at = None;
    // SAFETY: the kernel filled `msg`'s control messages within `control`; the CMSG
    // macros walk them without leaving it, and the data is read unaligned.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                at = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, at))
}

/// Whether `b` holds a whole HTTP answer (head and `Content-Length` body).
fn whole_answer(b: &[u8]) -> bool {
    memmem::find(b, b"\r\n\r\n").is_some_and(|e| {
        let len = header_number(&b[..e], "content-length:").unwrap_or(0);
        b.len() as u64 >= e as u64 + 4 + len
    })
}

fn publish_loop(args: &Args, p: &Publisher, rate: u64) {
    if args.publisher_fifo {
        *p.sched.lock().unwrap() = fifo(50);
    }
    let template = Template::new(args.size);
    let s = connect(args.addr);
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and option value.
    let stamped = unsafe {
        use std::os::fd::AsRawFd;
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    } == 0;
    if !stamped {
        eprintln!("aep-load: SO_TIMESTAMPNS: {}", io::Error::last_os_error());
    }
    let schedstat = "/proc/thread-self/schedstat";
    let gap = Duration::from_secs_f64(1.0 / rate as f64);
    let mut at = Instant::now();
    let (mut req, mut got, mut buf) = (Vec::new(), Vec::new(), vec![0u8; 4096]);
    while !p.stop.load(Ordering::Relaxed) {
        let n = p.next.load(Ordering::Relaxed);
        req.clear();
        req.extend_from_slice(
            format!(
                "POST /events HTTP/1.1\r\nHost: {}\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                args.addr,
                template.bytes.len()
            )
            .as_bytes(),
        );
        template.write(n, clock(), &mut req);
        let phase = p.phase.load(Ordering::Relaxed);
        let queued0 = runqueue_wait_ns(schedstat);
        let (t, t_real) = (Instant::now(), realtime_ns());
        (&s).write_all(&req)
            .unwrap_or_else(|e| fail(format!("publish: {e}")));
        got.clear();
        let mut stamp = None;
        while !whole_answer(&got) {
            match recv_stamped(&s, &mut buf) {
                Ok((0, _)) => fail("publish answer: the server closed the connection"),
                Ok((k, st)) => {
                    got.extend_from_slice(&buf[..k]);
                    stamp = st.or(stamp);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => fail(format!("publish answer: {e}")),
            }
        }
        let took = t.elapsed().as_nanos() as u64;
        let queued = runqueue_wait_ns(schedstat).saturating_sub(queued0);
        {
            let mut h = p.hists.lock().unwrap();
            let h = &mut h[phase];
            h.seen.record(took);
            h.queued.record(queued);
            if let Some(arrived) = stamp.and_then(|st| st.checked_sub(t_real)) {
                h.arrived.record(arrived);
            }
        }
        if !got.starts_with(b"HTTP/1.1 202") {
            p.errors.fetch_add(1, Ordering::Relaxed);
            eprintln!("aep-load: POST answered {}", String::from_utf8_lossy(&got));
        }
        p.next.store(n + 1, Ordering::Relaxed);
        at += gap;
        if let Some(d) = at.checked_duration_since(Instant::now()) {
            thread::sleep(d);
        } else {
            at = Instant::now();
        }
    }
}

/// A subscriber socket handed to the reader, with the bytes read past its head.
type Handoff = (usize, TcpStream, Vec<u8>);

/// What the reader and the storm share.
struct Watch {
    stop: AtomicBool,
    /// Set to have the reader drop every socket; it answers in `dropped`.
    drop_all: AtomicBool,
    /// The tracks as they were when every socket was dropped.
    dropped: Mutex<Option<Vec<Track>>>,
    /// A copy of the tracks, renewed every 20 ms.
    tracks: Mutex<Vec<Track>>,
}

/// Reads every subscriber on one poll; tracks each one's `seq`s. On `drop_all`, drops
/// every socket and hands back the tracks.
fn read_loop(n: usize, rx: mpsc::Receiver<Handoff>, waker_token: Token, mut poll: Poll, w: &Watch) {
    let (stop, drop_all, dropped, tracks_out) = (&w.stop, &w.drop_all, &w.dropped, &w.tracks);
    let mut tracks = vec![Track::default(); n];
    let mut socks: Vec<Option<(mio::net::TcpStream, Vec<u8>)>> = (0..n).map(|_| None).collect();
    let mut events = Events::with_capacity(1024);
    let mut buf = vec![0u8; 64 * 1024];
    let mut snapshot_every = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let _ = poll.poll(&mut events, Some(Duration::from_millis(5)));
        if drop_all.load(Ordering::Relaxed) {
            for s in socks.iter_mut() {
                if let Some((mut sock, _)) = s.take() {
                    let _ = poll.registry().deregister(&mut sock);
                }
            }
            // Whatever was still in flight to the dropped sockets is not theirs.
            *dropped.lock().unwrap() = Some(tracks.clone());
            drop_all.store(false, Ordering::Relaxed);
        }
        while let Ok((i, s, rest)) = rx.try_recv() {
            s.set_nonblocking(true)
                .unwrap_or_else(|e| fail(format!("nonblocking: {e}")));
            let mut sock = mio::net::TcpStream::from_std(s);
            poll.registry()
                .register(&mut sock, Token(i), Interest::READABLE)
                .unwrap_or_else(|e| fail(format!("register: {e}")));
            let mut carry = Vec::new();
            tracks[i].retry_ms = 0;
            tracks[i].feed(&mut carry, &rest);
            socks[i] = Some((sock, carry));
            // Its readiness edge may have passed: read it now.
            read_one(&mut socks[i], &mut tracks[i], &mut buf);
        }
        for e in events.iter() {
            if e.token() == waker_token {
                continue;
            }
            let i = e.token().0;
            read_one(&mut socks[i], &mut tracks[i], &mut buf);
        }
        if snapshot_every.elapsed() > Duration::from_millis(20) {
            tracks_out.lock().unwrap().clone_from(&tracks);
            snapshot_every = Instant::now();
        }
    }
    tracks_out.lock().unwrap().clone_from(&tracks);
}

fn read_one(s: &mut Option<(mio::net::TcpStream, Vec<u8>)>, t: &mut Track, buf: &mut [u8]) {
    let Some((sock, carry)) = s else {
        return;
    };
    loop {
        match sock.read(buf) {
            Ok(0) => {
                *s = None;
                return;
            }
            Ok(n) => t.feed(carry, &buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                *s = None;
                return;
            }
        }
    }
}

/// Connects (or reconnects) every subscriber `threads` at a time, each after its due
/// time; returns the 503s answered.
fn connect_all(
    args: &Args,
    session: &str,
    due: Vec<(Duration, Option<u64>)>,
    tx: &mpsc::Sender<Handoff>,
    waker: &mio::Waker,
    until: Instant,
) -> u64 {
    let threads = args.storm_threads.clamp(1, due.len().max(1));
    let t0 = Instant::now();
    thread::scope(|sc| {
        let hs: Vec<_> = (0..threads)
            .map(|k| {
                let tx = tx.clone();
                let due = &due;
                sc.spawn(move || {
                    let mut mine: VecDeque<(Duration, usize)> = (k..due.len())
                        .step_by(threads)
                        .map(|i| (due[i].0, i))
                        .collect();
                    mine.make_contiguous().sort_unstable();
                    let mut refused = 0;
                    while let Some((at, i)) = mine.pop_front() {
                        if let Some(d) = at.checked_sub(t0.elapsed()) {
                            thread::sleep(d);
                        }
                        let (s, rest, r) = open_sub(args, session, due[i].1, until);
                        refused += r;
                        let _ = tx.send((i, s, rest));
                        let _ = waker.wake();
                    }
                    refused
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| fail("a storm thread panicked")))
            .sum()
    })
}

/// Waits until `pred` holds for every track (polling the reader's snapshot), or
/// `until`; returns the seconds it took from `t0`.
fn wait_all(
    tracks: &Mutex<Vec<Track>>,
    t0: Instant,
    until: Instant,
    pred: impl Fn(&Track) -> bool,
) -> f64 {
    loop {
        if tracks.lock().unwrap().iter().all(&pred) {
            return t0.elapsed().as_secs_f64();
        }
        if Instant::now() > until {
            let left = tracks.lock().unwrap().iter().filter(|t| !pred(t)).count();
            fail(format!(
                "--reconnect-storm --resume: {left} subscribers not there by --timeout"
            ));
        }
        thread::sleep(Duration::from_millis(2));
    }
}

/// What one storm measured, for its report.
struct Outcome {
    connect_s: f64,
    subscribed_s: f64,
    caught_s: f64,
    refused: u64,
    exact: usize,
    gaps: u64,
    dups: u64,
    /// Events published in all.
    events: u64,
    /// The relay's CPU seconds and run-queue wait (s) from the drop to all caught up.
    server_cpu_s: f64,
    server_queued_s: f64,
    retry_max_ms: u64,
}

pub(crate) fn storm_resume(args: &Args) {
    let n = args.subscribers;
    let until = Instant::now() + Duration::from_secs(args.timeout);
    let session = format!("s_load{:x}", std::process::id());
    let rate = if args.rate == 0 { 200 } else { args.rate };
    let poll = Poll::new().unwrap_or_else(|e| fail(format!("poll: {e}")));
    let waker_token = Token(usize::MAX - 1);
    let waker = mio::Waker::new(poll.registry(), waker_token)
        .unwrap_or_else(|e| fail(format!("waker: {e}")));
    let (tx, rx) = mpsc::channel::<Handoff>();
    let watch = Watch {
        stop: AtomicBool::new(false),
        drop_all: AtomicBool::new(false),
        dropped: Mutex::new(None),
        tracks: Mutex::new(vec![Track::default(); n]),
    };
    let (stop, drop_all, dropped, tracks) =
        (&watch.stop, &watch.drop_all, &watch.dropped, &watch.tracks);
    let publisher = Publisher {
        next: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        phase: AtomicUsize::new(0),
        hists: Mutex::new([PostHists::new(), PostHists::new(), PostHists::new()]),
        errors: AtomicU64::new(0),
        sched: Mutex::new("default".into()),
    };
    let server_schedstat = args.server_pid.map(|pid| format!("/proc/{pid}/schedstat"));
    let server_queued = || server_schedstat.as_deref().map(runqueue_wait_ns);
    let outcome = thread::scope(|sc| {
        sc.spawn(|| read_loop(n, rx, waker_token, poll, &watch));
        // Live subscribers first, then the publisher: each sees every Event from 0.
        let t = Instant::now();
        connect_all(
            args,
            &session,
            vec![(Duration::ZERO, None); n],
            &tx,
            &waker,
            until,
        );
        let connect_s = t.elapsed().as_secs_f64();
        let ph = sc.spawn(|| publish_loop(args, &publisher, rate));
        // Caught up: every subscriber has an Event published after 1 s of steady state.
        thread::sleep(Duration::from_secs(1));
        let mark = publisher.next.load(Ordering::Relaxed).saturating_sub(1);
        wait_all(tracks, Instant::now(), until, |t| {
            t.last.is_some_and(|l| l >= mark)
        });
        // The storm: every subscriber dropped at once, then all reconnect at once.
        drop_all.store(true, Ordering::Relaxed);
        let _ = waker.wake();
        let before = loop {
            if let Some(d) = dropped.lock().unwrap().take() {
                break d;
            }
            thread::sleep(Duration::from_millis(1));
        };
        let (cpu_storm, queued_storm) = (args.server_pid.and_then(cpu_seconds), server_queued());
        let t0 = Instant::now();
        publisher.phase.store(1, Ordering::Relaxed);
        let high = publisher.next.load(Ordering::Relaxed).saturating_sub(1);
        let due: Vec<(Duration, Option<u64>)> = before
            .iter()
            .map(|t| {
                let wait = if args.storm_honor_retry {
                    t.retry_ms
                } else {
                    0
                };
                (Duration::from_millis(wait), t.last)
            })
            .collect();
        // The positions carry over: a reconnected stream's seqs count against the dropped
        // one's last, so a gap or a repeat across the storm is seen.
        let refused = connect_all(args, &session, due, &tx, &waker, until);
        let subscribed_s = t0.elapsed().as_secs_f64();
        let caught_s = wait_all(tracks, t0, until, |t| t.last.is_some_and(|l| l >= high));
        publisher.phase.store(2, Ordering::Relaxed);
        let (cpu_after, queued_after) = (args.server_pid.and_then(cpu_seconds), server_queued());
        thread::sleep(Duration::from_millis(500));
        publisher.stop.store(true, Ordering::Relaxed);
        ph.join().unwrap_or_else(|_| fail("the publisher panicked"));
        let last = publisher.next.load(Ordering::Relaxed).saturating_sub(1);
        wait_all(tracks, Instant::now(), until, |t| {
            t.last.is_some_and(|l| l >= last)
        });
        stop.store(true, Ordering::Relaxed);
        let _ = waker.wake();
        let final_tracks = tracks.lock().unwrap().clone();
        let diff = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => b - a,
            _ => f64::NAN,
        };
        let ns = |v: Option<u64>| v.map(|v| v as f64 / 1e9);
        Outcome {
            connect_s,
            subscribed_s,
            caught_s,
            refused,
            exact: final_tracks
                .iter()
                .filter(|t| t.gaps == 0 && t.dups == 0 && t.last == Some(last))
                .count(),
            gaps: final_tracks.iter().map(|t| t.gaps).sum(),
            dups: final_tracks.iter().map(|t| t.dups).sum(),
            events: last + 1,
            server_cpu_s: diff(cpu_storm, cpu_after),
            server_queued_s: diff(ns(queued_storm), ns(queued_after)),
            retry_max_ms: before.iter().map(|t| t.retry_ms).max().unwrap_or(0),
        }
    });
    let errors = publisher.errors.load(Ordering::Relaxed);
    report(args, rate, &outcome, &publisher);
    if outcome.exact != n || errors > 0 {
        std::process::exit(1);
    }
}

/// Prints one storm's outcome: text, or one JSON line with `--json`.
fn report(args: &Args, rate: u64, o: &Outcome, p: &Publisher) {
    let n = args.subscribers;
    let hists = p.hists.lock().unwrap();
    let ms = |v: u64| v as f64 / 1e6;
    // p50, p99, max of one histogram, ms.
    let q = |h: &Hist| [ms(h.quantile(0.5)), ms(h.quantile(0.99)), ms(h.max)];
    let (b, d) = (&hists[0], &hists[1]);
    let errors = p.errors.load(Ordering::Relaxed);
    let sched = p.sched.lock().unwrap().clone();
    let target = args.target.name();
    if args.json {
        let mut phases = String::new();
        for (name, h) in [("before", b), ("storm", d)] {
            for (what, hist) in [
                ("", &h.seen),
                ("arrived_", &h.arrived),
                ("queued_", &h.queued),
            ] {
                let [p50, p99, max] = q(hist);
                phases += &format!(
                    ",\"post_{what}{name}_p50_ms\":{p50:.3},\"post_{what}{name}_p99_ms\":{p99:.3},\"post_{what}{name}_max_ms\":{max:.3}"
                );
            }
        }
        println!(
            "{{\"target\":\"{target}\",\"mode\":\"reconnect-storm-resume\",\"subscribers\":{n},\"threads\":{},\"honor_retry\":{},\"rate\":{rate},\"publisher_sched\":\"{sched}\",\"connect_s\":{:.3},\"resubscribed_s\":{:.3},\"caught_up_s\":{:.3},\"refused_503\":{},\"exact\":{},\"gaps\":{},\"duplicates\":{},\"events\":{},\"post_before_n\":{},\"post_storm_n\":{}{phases},\"post_errors\":{errors},\"server_cpu_s\":{:.2},\"server_queued_s\":{:.3},\"retry_max_ms\":{}}}",
            args.storm_threads,
            args.storm_honor_retry,
            o.connect_s,
            o.subscribed_s,
            o.caught_s,
            o.refused,
            o.exact,
            o.gaps,
            o.dups,
            o.events,
            b.seen.n,
            d.seen.n,
            o.server_cpu_s,
            o.server_queued_s,
            o.retry_max_ms,
        );
        return;
    }
    println!(
        "{target} reconnect storm with resume: {n} subscribers, {} at a time{}; a POST every {:.1} ms; publisher thread {sched}",
        args.storm_threads,
        if args.storm_honor_retry { ", each after its retry:" } else { ", at once" },
        1000.0 / rate as f64
    );
    println!(
        "  first connect {:.3} s; after the drop: all subscribed again in {:.3} s ({} answered 503 and retried), all caught up in {:.3} s; server {:.2} CPU s, {:.3} s waiting for its CPU",
        o.connect_s, o.subscribed_s, o.refused, o.caught_s, o.server_cpu_s, o.server_queued_s
    );
    println!(
        "  resumed exactly: {} of {n} ({} Events missed, {} duplicates) over {} Events",
        o.exact, o.gaps, o.dups, o.events
    );
    for (name, h) in [("before the storm", b), ("during the storm", d)] {
        let line = |hist: &Hist| {
            let [p50, p99, max] = q(hist);
            format!("p50 {p50:.3} / p99 {p99:.3} / max {max:.3} ms")
        };
        println!(
            "  POST {name} ({} POSTs): seen {}; answer in the kernel {}; publisher waiting for a CPU {}",
            h.seen.n,
            line(&h.seen),
            line(&h.arrived),
            line(&h.queued)
        );
    }
    println!("  POST errors {errors}");
}

/// The number a response head's header `name` (lowercase, with its colon) holds.
fn header_number(head: &[u8], name: &str) -> Option<u64> {
    String::from_utf8_lossy(head)
        .to_ascii_lowercase()
        .lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().parse::<u64>()))?
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `seq` is read once wherever the reads cut the stream; a gap and a
    /// duplicate are counted.
    fn stream(seqs: &[u64]) -> Vec<u8> {
        let t = Template::new(200);
        let mut out = b": aep-relay stream open\n\nretry: 1234\n\n".to_vec();
        for &n in seqs {
            out.extend_from_slice(b"event: tool.completed\ndata: ");
            t.write(n, 0, &mut out);
            out.extend_from_slice(b"\n\n");
        }
        out
    }

    #[test]
    fn seqs_across_read_boundaries() {
        let s = stream(&[0, 1, 2, 4, 4, 5]);
        for cut in 1..64 {
            let (mut t, mut carry) = (Track::default(), Vec::new());
            for piece in s.chunks(cut) {
                t.feed(&mut carry, piece);
            }
            assert_eq!((t.last, t.gaps, t.dups), (Some(5), 1, 1), "reads of {cut}");
        }
        let (mut t, mut carry) = (Track::default(), Vec::new());
        t.feed(&mut carry, &s);
        assert_eq!(t.retry_ms, 1234);
    }

    /// One server-to-client text frame (unmasked).
    fn server_frame(payload: &[u8], out: &mut Vec<u8>) {
        out.push(0x81);
        match payload.len() {
            n if n < 126 => out.push(n as u8),
            n => {
                out.push(126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        out.extend_from_slice(payload);
    }

    /// A WS stream: frame headers between the Events, and a frame's own `seq` (not an
    /// Event's) is not counted, wherever the reads cut it.
    #[test]
    fn ws_seqs_across_read_boundaries() {
        let t = Template::new(300);
        let mut s = Vec::new();
        server_frame(br#"{"type":"subscribed","id":"load"}"#, &mut s);
        server_frame(
            br#"{"type":"replay-exhausted","sub":"load","session":"s","earliest":{"epoch":0,"seq":7}}"#,
            &mut s,
        );
        for n in [3, 4, 6, 6, 7] {
            let mut e = Vec::new();
            t.write(n, 0, &mut e);
            server_frame(&e, &mut s);
        }
        fed_in_every_cut(&s, 2, (Some(7), 1, 1));
    }

    /// Feeds `stream` to a track whose last `seq` was `last`, in reads of every size
    /// from 1 to 63 bytes, and checks what it ends with: (last `seq`, gaps, duplicates).
    fn fed_in_every_cut(stream: &[u8], last: u64, want: (Option<u64>, u64, u64)) {
        for cut in 1..64 {
            let (mut tr, mut carry) = (Track::default(), Vec::new());
            tr.last = Some(last);
            for piece in stream.chunks(cut) {
                tr.feed(&mut carry, piece);
            }
            assert_eq!((tr.last, tr.gaps, tr.dups), want, "reads of {cut}");
        }
    }

    /// A frame's own position holds a `seq` as long as an Event's (the relay's
    /// `replay-exhausted` names the earliest Event held, `closing` the last delivered):
    /// it is not counted as an Event, wherever the reads cut it.
    #[test]
    fn a_frames_own_position_of_an_events_length_is_not_an_event() {
        let t = Template::new(300);
        let seq = COUNTER_BASE + 5;
        let mut s = Vec::new();
        server_frame(
            format!(r#"{{"type":"replay-exhausted","sub":"load","session":"s","earliest":{{"epoch":0,"seq":{seq}}}}}"#).as_bytes(),
            &mut s,
        );
        for n in [5, 6] {
            let mut e = Vec::new();
            t.write(n, 0, &mut e);
            server_frame(&e, &mut s);
        }
        server_frame(
            format!(r#"{{"type":"closing","reason":"idle","delivered":[{{"sub":"load","session":"s","source":"aep://h","epoch":0,"seq":{}}}],"dropped":0}}"#, seq + 1).as_bytes(),
            &mut s,
        );
        fed_in_every_cut(&s, 4, (Some(6), 0, 0));
    }

    #[test]
    fn ws_server_frames_are_found_whole() {
        let mut s = Vec::new();
        server_frame(b"{}", &mut s);
        server_frame(&[b'x'; 300], &mut s);
        assert_eq!(ws_server_frame(&s), Some(2..4));
        let long = &s[4..];
        assert_eq!(ws_server_frame(long), Some(4..304));
        for end in 0..long.len() {
            assert_eq!(ws_server_frame(&long[..end]), None, "{end} bytes");
        }
        // A masked frame's key is skipped.
        assert_eq!(
            ws_server_frame(&[0x81, 0x82, 0, 0, 0, 0, b'{', b'}']),
            Some(6..8)
        );
    }
}
