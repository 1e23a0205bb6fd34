//! The history's unit tests: naming, appending, rebuilding.

use super::*;
use crate::store::Store;
use crate::wire::envelope::Event;
use bytes::Bytes;
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::time::SystemTime;

fn ev(agent: &str, session: &str, seq: u64) -> Event {
    let j = serde_json::json!({
        "aep": "0.1", "id": format!("{session}-{seq}"), "type": "tool.completed",
        "time": "2026-07-03T10:00:00Z", "source": "aep://t/agent/a",
        "agent": agent, "session": session, "seq": seq
    });
    Event::parse(Bytes::from(serde_json::to_vec(&j).unwrap())).unwrap()
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("aep-history-unit-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    d
}

/// A small deterministic generator of awkward strings.
fn awkward(seed: u64) -> String {
    let pool = [
        "a", "Z", ".", "..", "/", "\\", "%", "~", "\0", "\n", " ", "é", "É", "😀", "-", "_", "0",
        "%2F", "~x", "A", "a.", ".jsonl",
    ];
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let n = (x >> 60) as usize + 1;
    let mut s = String::new();
    for _ in 0..n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s.push_str(pool[(x >> 33) as usize % pool.len()]);
    }
    s
}

#[test]
fn encoding_is_safe_reversible_and_case_distinct() {
    let mut seen = HashMap::new();
    let mut values: Vec<String> = (0..5000).map(awkward).collect();
    values.extend(["..", ".", "", "Session", "session", "a/b", "a%2Fb"].map(String::from));
    for v in values {
        let e = encode_component(&v);
        assert!(!e.is_empty() && e.len() <= MAX_COMPONENT, "{v:?} -> {e:?}");
        assert!(!e.starts_with('.'), "{v:?} -> {e:?}");
        assert!(e
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b'\\'));
        assert_eq!(decode_component(&e), Some(Decoded::Exact(v.clone())));
        let folded = e.to_ascii_lowercase();
        if let Some(other) = seen.insert(folded, v.clone()) {
            assert_eq!(other, v, "case-folded collision");
        }
    }
}

#[test]
fn long_values_use_a_digest_and_stay_distinct() {
    let a = "s".repeat(1000);
    let b = format!("{}t", "s".repeat(999));
    let (ea, eb) = (encode_component(&a), encode_component(&b));
    assert_ne!(ea, eb);
    for e in [&ea, &eb] {
        assert!(e.len() <= MAX_COMPONENT);
        assert!(matches!(decode_component(e), Some(Decoded::Long { .. })));
    }
    // An escape is never cut in half.
    let c = "É".repeat(200);
    let ec = encode_component(&c);
    let Some(Decoded::Long { prefix, .. }) = decode_component(&ec) else {
        panic!("{ec}")
    };
    assert!(c.as_bytes().starts_with(&prefix));
    assert!(relative_path(&c, &a).to_string_lossy().len() < 600);
}

#[test]
fn foreign_names_do_not_decode() {
    for n in ["A", "%2f", "%61", ".x", "a/b", "x~123", "%G0", "%4"] {
        assert_eq!(decode_component(n), None, "{n}");
    }
}

#[test]
fn append_rebuild_round_trip_with_lru_and_dedupe() {
    let dir = tmp("roundtrip");
    let mut store = Store::new(3, 10);
    let mut cfg = HistoryConfig::new(&dir);
    cfg.max_open_files = 2;
    cfg.fsync = Fsync::Never;
    let (mut h, stats) = History::open(cfg.clone(), &mut store).unwrap();
    assert_eq!(stats, RebuildStats::default());
    let batch: Vec<_> = (0..5)
        .flat_map(|i| [ev("a", "s1", i), ev("a", "s2", i), ev("B", "s3", i)])
        .collect();
    let dup = batch[0].clone();
    let mut with_dup = batch.clone();
    with_dup.push(dup.clone());
    assert_eq!(h.append_batch(&with_dup, &store).unwrap(), 15);
    assert!(h.open_files() <= 2);
    for e in &batch {
        store.admit(e);
    }
    // Held: not written again.
    assert_eq!(h.append_batch(&[ev("a", "s1", 4)], &store).unwrap(), 0);
    let text = fs::read_to_string(dir.join("a/s1.jsonl")).unwrap();
    assert_eq!(text.lines().count(), 5);
    assert!(dir.join("%42/s3.jsonl").exists());

    // Torn tail: cut off on rebuild.
    let mut f = OpenOptions::new()
        .append(true)
        .open(dir.join("a/s2.jsonl"))
        .unwrap();
    f.write_all(b"{\"aep\":\"0.1\",\"id").unwrap();
    drop(f);
    drop(h); // the first relay is gone: it held DIR's lock
    let mut fresh = Store::new(3, 10);
    let (_, stats) = History::open(cfg, &mut fresh).unwrap();
    assert_eq!((stats.files, stats.torn, stats.invalid), (3, 1, 0));
    let mut got = Vec::new();
    let marker = fresh.replay_after("s2", (0, 0), &mut |e| got.push(e.seq().unwrap()));
    assert_eq!(got, vec![2, 3, 4]);
    assert_eq!(
        marker.iter().map(|m| m.earliest).collect::<Vec<_>>(),
        [(0, 2)]
    );
    assert!(fs::read(dir.join("a/s2.jsonl")).unwrap().ends_with(b"}\n"));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_window_smaller_than_the_file_still_reports_exhaustion() {
    let dir = tmp("window");
    let mut store = Store::new(2, 10);
    let cfg = HistoryConfig {
        fsync: Fsync::Never,
        ..HistoryConfig::new(&dir)
    };
    let (mut h, _) = History::open(cfg.clone(), &mut store).unwrap();
    let batch: Vec<_> = (0..100).map(|i| ev("a", "s", i)).collect();
    h.append_batch(&batch, &store).unwrap();
    drop(h); // the first relay is gone: it held DIR's lock
    let mut fresh = Store::new(2, 10);
    let (_, stats) = History::open(cfg, &mut fresh).unwrap();
    assert_eq!(stats.events, 2 * 2 + 16, "only the window is read");
    let mut got = Vec::new();
    let marker = fresh.replay_after("s", (0, 10), &mut |e| got.push(e.seq().unwrap()));
    let marker: Vec<_> = marker.iter().map(|m| m.earliest).collect();
    assert_eq!((got, marker), (vec![98, 99], vec![(0, 98)]));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn foreign_events_from_another_file_are_never_lost_on_rebuild() {
    let dir = tmp("foreign");
    let cfg = HistoryConfig {
        fsync: Fsync::Never,
        ..HistoryConfig::new(&dir)
    };
    let mut live = Store::new(10, 10);
    let (mut h, _) = History::open(cfg.clone(), &mut live).unwrap();
    let routed = serde_json::json!({
        "aep": "0.1", "id": "r1", "type": "attention.routed", "time": "2026-07-03T10:00:00Z",
        "source": "aep://t/agent/router", "agent": "router", "session": "s", "subject": "x"
    });
    let routed = Event::parse(Bytes::from(routed.to_string())).unwrap();
    let mut arrivals: Vec<Event> = (0..2).map(|i| ev("a", "s", i)).collect();
    arrivals.push(routed.clone());
    arrivals.extend((2..5).map(|i| ev("a", "s", i)));
    for e in &arrivals {
        h.append_batch(std::slice::from_ref(e), &live).unwrap();
        live.admit(e);
    }
    let ids = |st: &Store<Event>, after| {
        let mut v = Vec::new();
        st.replay_after("s", (0, after), &mut |e| v.push(e.id().to_string()));
        v
    };
    assert_eq!(ids(&live, 1), ["r1", "s-2", "s-3", "s-4"]);
    // The router's file was last written before the session's own file.
    for (f, secs) in [("router/s.jsonl", 1_000_000), ("a/s.jsonl", 1_000_010)] {
        File::options()
            .write(true)
            .open(dir.join(f))
            .unwrap()
            .set_modified(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs))
            .unwrap();
    }
    drop(h); // the first relay is gone: it held DIR's lock
    let mut rebuilt = Store::new(10, 10);
    History::open(cfg, &mut rebuilt).unwrap();
    for after in 0..5 {
        let got = ids(&rebuilt, after);
        for want in ids(&live, after) {
            assert!(
                got.contains(&want),
                "resume from {after}: {want} lost: {got:?}"
            );
        }
    }
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn only_the_newest_sessions_are_rebuilt() {
    let dir = tmp("newest");
    let mut store = Store::new(5, 100);
    let cfg = HistoryConfig {
        fsync: Fsync::Never,
        ..HistoryConfig::new(&dir)
    };
    let (mut h, _) = History::open(cfg.clone(), &mut store).unwrap();
    for i in 0..4 {
        h.append_batch(&[ev("a", &format!("s{i}"), 0)], &store)
            .unwrap();
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000 + i);
        File::options()
            .write(true)
            .open(dir.join(format!("a/s{i}.jsonl")))
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
    drop(h); // the first relay is gone: it held DIR's lock
    let mut fresh = Store::new(5, 2);
    let (_, stats) = History::open(cfg, &mut fresh).unwrap();
    assert_eq!((stats.files, stats.files_read), (4, 2));
    let names: Vec<_> = fresh.sessions().map(|s| s.name.to_string()).collect();
    assert_eq!(names, ["s2", "s3"]);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn an_unwritable_file_refuses_the_batch_and_rolls_back() {
    let dir = tmp("full");
    let mut store = Store::new(5, 10);
    let cfg = HistoryConfig::new(&dir);
    let (mut h, _) = History::open(cfg, &mut store).unwrap();
    h.append_batch(&[ev("a", "ok", 0)], &store).unwrap();
    // /dev/full answers every write with ENOSPC: a full disk.
    fs::create_dir_all(dir.join("a")).unwrap();
    std::os::unix::fs::symlink("/dev/full", dir.join("a/full.jsonl")).unwrap();
    let err = h
        .append_batch(&[ev("a", "ok", 1), ev("a", "full", 0)], &store)
        .unwrap_err();
    assert!(err.to_string().contains("full.jsonl"), "{err}");
    let text = fs::read_to_string(dir.join("a/ok.jsonl")).unwrap();
    assert_eq!(
        text.lines().count(),
        1,
        "the batch's first append was cut back"
    );
    // It recovers: the next batch reopens the file.
    assert_eq!(h.append_batch(&[ev("a", "ok", 1)], &store).unwrap(), 1);
    let _ = fs::remove_dir_all(&dir);
}
