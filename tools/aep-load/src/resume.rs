//! `--reconnect-storm --resume`: N SSE subscribers connected and caught up on one
//! session, all dropped at once and all reconnecting at once with their resume position
//! (`Last-Event-ID`, AEP-0003 §3.3 #3, §7), while a publisher keeps POSTing one Event at
//! a time. Reports the time until every subscriber is subscribed again and until every
//! one has caught up with what was published before the storm, whether each resumed
//! exactly (every `seq` once, in order, across the storm: no gap, no duplicate), the
//! 503s the relay answered at accept (retried after their `Retry-After`), and the POST
//! latency p50/p99/max before and during the storm.
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
            if start + COUNTER_DIGITS > carry.len() {
                // A record cut by the read: kept whole for the next one.
                at += i;
                cut = true;
                break;
            }
            let mut v = 0u64;
            for &d in &carry[start..start + COUNTER_DIGITS] {
                v = v * 10 + u64::from(d.wrapping_sub(b'0'));
            }
            let n = v - COUNTER_BASE;
            match self.last {
                Some(l) if n <= l => self.dups += 1,
                Some(l) if n > l + 1 => {
                    self.gaps += n - l - 1;
                    self.last = Some(n);
                }
                _ => self.last = Some(n),
            }
            at = start + COUNTER_DIGITS;
        }
        if !cut {
            // What may be the start of `"seq":`.
            at = at.max(carry.len().saturating_sub(SEQ.len() - 1));
        }
        carry.drain(..at);
    }
}

/// Opens one SSE subscriber, resuming after `last` (Event number) when given; retries a
/// 503 after its `Retry-After`. Returns the socket, the bytes read past the head, and
/// how many 503s it got.
fn open_sse(
    args: &Args,
    session: &str,
    last: Option<u64>,
    until: Instant,
) -> (TcpStream, Vec<u8>, u64) {
    let mut refused = 0;
    loop {
        let mut s = connect(args.addr);
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let resume = last.map_or(String::new(), |n| {
            format!("Last-Event-ID: {session}:0:{}\r\n", COUNTER_BASE + n)
        });
        let req = format!(
            "GET /stream HTTP/1.1\r\nHost: {}\r\nAccept: text/event-stream\r\n{resume}\r\n",
            args.addr
        );
        // A refused connection may be closed before the request is written.
        let _ = s.write_all(req.as_bytes());
        let got = read_until(
            &mut s,
            |b| memmem::find(b, b"\r\n\r\n").is_some(),
            "sse head",
        );
        let end = memmem::find(&got, b"\r\n\r\n").unwrap() + 4;
        if got.starts_with(b"HTTP/1.1 200") {
            s.set_read_timeout(None).ok();
            return (s, got[end..].to_vec(), refused);
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

/// The publisher: one keep-alive connection, one Event per POST at `rate` a second,
/// numbered from 0; records each POST's latency (write to whole answer) in the
/// histogram of the phase it began in.
struct Publisher {
    /// Events published (the next one's number).
    next: AtomicU64,
    stop: AtomicBool,
    /// 0 before the storm, 1 during it, 2 after.
    phase: AtomicUsize,
    hists: Mutex<[Hist; 3]>,
    errors: AtomicU64,
}

fn publish_loop(args: &Args, p: &Publisher, rate: u64) {
    let template = Template::new(args.size);
    let mut s = connect(args.addr);
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let gap = Duration::from_secs_f64(1.0 / rate as f64);
    let mut at = Instant::now();
    let mut body = Vec::new();
    while !p.stop.load(Ordering::Relaxed) {
        let n = p.next.load(Ordering::Relaxed);
        body.clear();
        template.write(n, clock(), &mut body);
        let head = format!(
            "POST /events HTTP/1.1\r\nHost: {}\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            args.addr,
            body.len()
        );
        let phase = p.phase.load(Ordering::Relaxed);
        let t = Instant::now();
        let mut req = head.into_bytes();
        req.extend_from_slice(&body);
        s.write_all(&req)
            .unwrap_or_else(|e| fail(format!("publish: {e}")));
        let got = read_until(
            &mut s,
            |b| {
                memmem::find(b, b"\r\n\r\n").is_some_and(|e| {
                    let len = header_number(&b[..e], "content-length:").unwrap_or(0);
                    b.len() as u64 >= e as u64 + 4 + len
                })
            },
            "publish answer",
        );
        let took = t.elapsed().as_nanos() as u64;
        p.hists.lock().unwrap()[phase].record(took);
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
                        let (s, rest, r) = open_sse(args, session, due[i].1, until);
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

pub(crate) fn storm_resume(args: &Args) {
    if args.target != Target::Sse || args.tls {
        fail("--reconnect-storm --resume: --target sse without --tls");
    }
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
        hists: Mutex::new([Hist::new(), Hist::new(), Hist::new()]),
        errors: AtomicU64::new(0),
    };
    thread::scope(|sc| {
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
        let cpu_storm = args.server_pid.and_then(cpu_seconds);
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
        // The reader must not count a reconnected stream's seqs against the dropped ones'
        // positions otherwise than as resumed: the positions carry over.
        let refused = connect_all(args, &session, due, &tx, &waker, until);
        let subscribed_s = t0.elapsed().as_secs_f64();
        let caught_s = wait_all(tracks, t0, until, |t| t.last.is_some_and(|l| l >= high));
        publisher.phase.store(2, Ordering::Relaxed);
        let cpu_after = args.server_pid.and_then(cpu_seconds);
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
        let gaps: u64 = final_tracks.iter().map(|t| t.gaps).sum();
        let dups: u64 = final_tracks.iter().map(|t| t.dups).sum();
        let exact = final_tracks
            .iter()
            .filter(|t| t.gaps == 0 && t.dups == 0 && t.last == Some(last))
            .count();
        let hists = publisher.hists.lock().unwrap();
        let q = |h: &Hist, p: f64| h.quantile(p) as f64 / 1e6;
        let (b, d) = (&hists[0], &hists[1]);
        let cpu = match (cpu_storm, cpu_after) {
            (Some(a), Some(b)) => b - a,
            _ => f64::NAN,
        };
        let retry_max = before.iter().map(|t| t.retry_ms).max().unwrap_or(0);
        let (before_p50, before_p99) = (q(b, 0.5), q(b, 0.99));
        let (storm_p50, storm_p99) = (q(d, 0.5), q(d, 0.99));
        let storm_max = d.max as f64 / 1e6;
        let errors = publisher.errors.load(Ordering::Relaxed);
        if args.json {
            println!(
                "{{\"target\":\"relay-sse\",\"mode\":\"reconnect-storm-resume\",\"subscribers\":{n},\"threads\":{},\"honor_retry\":{},\"rate\":{rate},\"connect_s\":{connect_s:.3},\"resubscribed_s\":{subscribed_s:.3},\"caught_up_s\":{caught_s:.3},\"refused_503\":{refused},\"exact\":{exact},\"gaps\":{gaps},\"duplicates\":{dups},\"events\":{},\"post_before_p50_ms\":{:.3},\"post_before_p99_ms\":{:.3},\"post_storm_n\":{},\"post_storm_p50_ms\":{:.3},\"post_storm_p99_ms\":{:.3},\"post_storm_max_ms\":{:.3},\"post_errors\":{},\"server_cpu_s\":{cpu:.2},\"retry_max_ms\":{retry_max}}}",
                args.storm_threads,
                args.storm_honor_retry,
                last + 1,
                before_p50,
                before_p99,
                d.n,
                storm_p50,
                storm_p99,
                storm_max,
                errors,
            );
        } else {
            println!(
                "relay-sse reconnect storm with resume: {n} subscribers, {} at a time{}; a POST every {:.1} ms",
                args.storm_threads,
                if args.storm_honor_retry { ", each after its retry:" } else { ", at once" },
                1000.0 / rate as f64
            );
            println!("  first connect {connect_s:.3} s; after the drop: all subscribed again in {subscribed_s:.3} s ({refused} answered 503 and retried), all caught up in {caught_s:.3} s; server {cpu:.2} CPU s");
            println!("  resumed exactly: {exact} of {n} ({gaps} Events missed, {dups} duplicates) over {} Events", last + 1);
            println!(
                "  POST before: p50 {:.3} ms, p99 {:.3} ms; during the storm ({} POSTs): p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; errors {}",
                before_p50,
                before_p99,
                d.n,
                storm_p50,
                storm_p99,
                storm_max,
                errors
            );
        }
        if exact != n || errors > 0 {
            std::process::exit(1);
        }
    });
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
}
