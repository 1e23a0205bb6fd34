//! The replay store: per-session ring buffers (AEP-0003 §5, §7) (stub).
