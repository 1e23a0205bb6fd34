//! Storms held, over real sockets: the per-address connection limit and the accept
//! bucket answer 503 with `Retry-After` before reading a request; SSE streams carry a
//! jittered `retry:`; a graceful shutdown ends its streams spread out, not all at once; a
//! POST is answered before a fan-out wider than the reactor's writes per turn. No
//! assertion here is on how fast anything is: bounds are on counts, values, turns and
//! (generous) spreads.

use crate::support;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::*;

/// `name{labels} value` of `/metrics`, fetched through a fresh connection, retried
/// while the accept bucket refuses it.
fn metric(relay: &TestRelay, name_and_labels: &str) -> f64 {
    let until = Instant::now() + WAIT;
    let text = loop {
        match agent().get(&relay.url("/metrics")).call() {
            Ok(r) => break r.into_string().unwrap(),
            Err(ureq::Error::Status(503, _)) if Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("{e}"),
        }
    };
    text.lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {name_and_labels} missing in:\n{text}"))
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn healthz(s: &mut TcpStream) -> u16 {
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    read_response(s).0
}

/// Over `max_connections_per_ip`, a connection is answered 503 at once, though it sent
/// nothing: the request is never read. Once one of the address's connections closes,
/// the address is served again.
#[test]
fn per_address_limit_answers_503_with_retry_after_before_reading() {
    let relay = TestRelay::with(|c| {
        c.max_connections_per_ip = 2;
        c.accept_rate = 0;
    });
    let mut a = relay.tcp();
    let mut b = relay.tcp();
    assert_eq!(healthz(&mut a), 200);
    assert_eq!(healthz(&mut b), 200);
    // The third sends nothing, and is answered all the same.
    let mut c = relay.tcp();
    let (status, headers, body) = read_response(&mut c);
    assert_eq!(status, 503);
    assert_eq!(header(&headers, "retry-after"), Some("5"));
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"], "too-many-connections-per-ip");
    // And closed after the answer.
    let mut rest = Vec::new();
    assert_eq!(c.read_to_end(&mut rest).unwrap_or(0), 0);

    drop(a);
    // The relay sees the close on its next turn: until then the address is still full.
    let until = Instant::now() + WAIT;
    let mut d = loop {
        let mut d = relay.tcp();
        d.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        match read_response(&mut d).0 {
            200 => break d,
            503 if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            s => panic!("status {s}"),
        }
    };
    assert_eq!(healthz(&mut d), 200, "served as any connection");
    drop((b, d));
    assert!(metric(&relay, "aep_connections_refused_total{reason=\"per-ip\"}") >= 1.0);
    assert!(
        metric(
            &relay,
            "aep_events_rejected_total{reason=\"too-many-connections-per-ip\"}"
        ) >= 1.0
    );
    assert_eq!(
        metric(
            &relay,
            "aep_connections_refused_total{reason=\"max-connections\"}"
        ),
        0.0
    );
}

/// Past the accept bucket's burst, connections are answered 503 `accept-rate-limited`
/// with a `Retry-After` of whole seconds, without their request being read; the bucket
/// refills at its rate.
#[test]
fn accept_bucket_answers_503_past_its_burst_and_refills() {
    let relay = TestRelay::with(|c| {
        c.accept_rate = 1;
        c.accept_burst = 2;
    });
    let t = Instant::now();
    let (mut served, mut refused) = (Vec::new(), 0u32);
    for _ in 0..10 {
        let mut s = relay.tcp();
        // Nothing sent: a refused one is answered anyway, a served one waits.
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut buf = [0u8; 1];
        match s.peek(&mut buf) {
            Ok(n) if n > 0 => {
                s.set_read_timeout(Some(WAIT)).unwrap();
                let (status, headers, body) = read_response(&mut s);
                assert_eq!(status, 503);
                let after: u64 = header(&headers, "retry-after").unwrap().parse().unwrap();
                assert!((1..=60).contains(&after), "Retry-After {after}");
                let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(json["error"], "accept-rate-limited");
                refused += 1;
            }
            _ => served.push(s),
        }
    }
    // At most the burst plus one a second (and one for the rounding) are served.
    let bound = 2 + t.elapsed().as_secs() as usize + 1;
    assert!(
        served.len() <= bound,
        "{} served, bound {bound}",
        served.len()
    );
    assert!(refused >= 1);
    for s in &mut served {
        s.set_read_timeout(Some(WAIT)).unwrap();
        assert_eq!(healthz(s), 200);
    }
    drop(served);
    assert!(
        metric(
            &relay,
            "aep_connections_refused_total{reason=\"accept-rate\"}"
        ) >= 1.0
    );
}

/// Reads an SSE stream's head and first lines up to its `retry:` field; its value.
fn retry_of(relay: &TestRelay) -> (u64, BufReader<TcpStream>) {
    let mut s = relay.tcp();
    s.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut r = BufReader::new(s);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "the stream ended");
        if let Some(v) = line.strip_prefix("retry: ") {
            return (v.trim_end().parse().unwrap(), r);
        }
        assert!(!line.starts_with("data:"), "an Event before retry:");
    }
}

/// Each live SSE stream starts with a `retry:` field (WHATWG HTML, server-sent events):
/// the base plus a jitter drawn per stream, within bounds, not all alike.
#[test]
fn sse_streams_send_a_jittered_retry() {
    let relay = TestRelay::with(|c| {
        c.sse_retry = Duration::from_millis(1000);
        c.sse_retry_jitter = Duration::from_millis(500);
    });
    let got: Vec<u64> = (0..20).map(|_| retry_of(&relay).0).collect();
    assert!(got.iter().all(|v| (1000..=1500).contains(v)), "{got:?}");
    let mut distinct = got.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() > 1, "no jitter: {got:?}");
    // Without jitter, exactly the base.
    let relay = TestRelay::with(|c| {
        c.sse_retry = Duration::from_millis(2500);
        c.sse_retry_jitter = Duration::ZERO;
    });
    assert_eq!(retry_of(&relay).0, 2500);
}

/// SIGTERM ends the live streams spread over the first half of
/// `--shutdown-deadline-secs`, not all at once: the `: shutting-down` of 24 streams
/// arrive over more than a fifth of that half (a bound far below the even spread it
/// aims at), and the relay still drains and exits 0.
#[test]
fn sigterm_spreads_the_ends_of_streams() {
    let relay = RelayProcess::spawn(&["--shutdown-deadline-secs", "4"]);
    let streams: Vec<BufReader<TcpStream>> = (0..24)
        .map(|_| {
            let mut s = TcpStream::connect(relay.addr).unwrap();
            s.set_read_timeout(Some(WAIT)).unwrap();
            s.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            let mut r = BufReader::new(s);
            let mut line = String::new();
            while !line.starts_with("retry: ") {
                line.clear();
                assert!(r.read_line(&mut line).unwrap() > 0);
            }
            r
        })
        .collect();
    relay.signal("TERM");
    let ends: Vec<Instant> = std::thread::scope(|sc| {
        let hs: Vec<_> = streams
            .into_iter()
            .map(|mut r| {
                sc.spawn(move || {
                    let mut line = String::new();
                    loop {
                        line.clear();
                        assert!(r.read_line(&mut line).unwrap() > 0, "ended without notice");
                        if line == ": shutting-down\n" {
                            return Instant::now();
                        }
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let first = *ends.iter().min().unwrap();
    let last = *ends.iter().max().unwrap();
    assert!(
        last - first >= Duration::from_millis(400),
        "the ends came within {:?}",
        last - first
    );
    let (status, stderr) = relay.wait();
    assert!(status.success(), "exit status {status}; stderr:\n{stderr}");
    assert!(
        stderr.contains("ending 24 streams spread over 2s"),
        "{stderr}"
    );
    assert!(stderr.contains("shutdown complete"), "{stderr}");
}

/// Raises this process's soft limit on open files to at least `n` (within the hard
/// limit): the test below holds both ends of a thousand connections.
fn raise_open_files(n: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer, then the same struct back.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < n {
            assert!(
                lim.rlim_max >= n,
                "this test needs {n} open files; the hard limit is {}",
                lim.rlim_max
            );
            lim.rlim_cur = n;
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
}

/// Appends what `s` has to read now (non-blocking) to `got`.
fn read_ready(s: &mut TcpStream, got: &mut Vec<u8>) {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => panic!("the relay closed a connection"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("{e}"),
        }
    }
}

/// A POST's answer does not wait behind its Event's fan-out: the reactor writes a bounded
/// number of connections per turn, answers first, so with more subscribers than that the
/// turn that reads the POST writes its `202` and only part of the deliveries; the rest
/// follow in the next turns. Driven turn by turn with `Relay::poll_once`, the clients in
/// the same thread: between two turns nothing moves.
#[test]
fn an_answer_is_written_before_a_fan_out_wider_than_a_turn() {
    const N: usize = 1200;
    raise_open_files(2 * N as u64 + 256);
    let mut relay = aep_relay::Relay::bind(aep_relay::Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        ..aep_relay::Config::default()
    })
    .unwrap();
    let addr = relay.local_addr();
    let turn =
        |relay: &mut aep_relay::Relay| relay.poll_once(Some(Duration::from_millis(5))).unwrap();
    let until = Instant::now() + WAIT;
    // Subscribers, a hundred at a time (the listen backlog is bounded), each until its
    // stream is open.
    let mut subs: Vec<(TcpStream, Vec<u8>)> = Vec::new();
    while subs.len() < N {
        for _ in 0..100 {
            let mut s = TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            s.set_nonblocking(true).unwrap();
            subs.push((s, Vec::new()));
        }
        turn(&mut relay);
    }
    let open = |got: &[u8]| got.windows(12).any(|w| w == b"stream open\n");
    while !subs.iter().all(|(_, got)| open(got)) {
        assert!(Instant::now() < until, "the streams did not open");
        turn(&mut relay);
        for (s, got) in subs.iter_mut() {
            read_ready(s, got);
        }
    }
    let body = ev("a", "s_turn", 0);
    let mut post = TcpStream::connect(addr).unwrap();
    write!(
        post,
        "POST /events HTTP/1.1\r\nHost: x\r\nAEP-Version: 0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    post.set_nonblocking(true).unwrap();
    let (mut answer, mut turns_after_answer) = (Vec::new(), 0);
    loop {
        assert!(Instant::now() < until, "the fan-out did not complete");
        turn(&mut relay);
        read_ready(&mut post, &mut answer);
        let mut delivered = 0;
        for (s, got) in subs.iter_mut() {
            read_ready(s, got);
            delivered += usize::from(got.windows(6).any(|w| w == b"data: "));
        }
        if answer.is_empty() {
            assert_eq!(delivered, 0, "a delivery went out before the answer");
            continue;
        }
        assert!(answer.starts_with(b"HTTP/1.1 202"), "{answer:?}");
        if turns_after_answer == 0 {
            assert!(
                delivered < N,
                "all {N} deliveries were written in the turn that answered"
            );
        }
        turns_after_answer += 1;
        if delivered == N {
            break;
        }
    }
}
