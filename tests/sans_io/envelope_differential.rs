//! Differential test of the envelope scanner (`Event::scan`) against `serde_json` as the
//! oracle (DESIGN.md: "anything `serde_json` would reject, it rejects").
//!
//! For every input: `Event::scan` accepts exactly when
//! 1. `serde_json::from_slice` accepts it and it is one JSON object,
//! 2. no top-level member name repeats (AEP-0001 §5; serde_json itself would keep the last),
//! 3. each top-level value obeys the per-attribute value rules `Event::scan` enforces
//!    (AEP-0001 §5.1: string attributes non-empty strings, `seq`/`epoch` integers >= 0,
//!    enums in range, `data` an object, never `null`; §5.4: extension names
//!    `[a-z0-9]{1,20}` not core, scalar values),
//!
//! and when it accepts, every extracted attribute equals serde_json's value (and the
//! `data` span re-reads to serde_json's `data`).
//!
//! Inputs are deterministic pseudo-random mutations of the golden Events (byte flips,
//! truncations, insertions of `"`, `\`, `{`, digits, escape and member snippets, spliced
//! ranges) plus generated strings, numbers and nestings at the edges. No new dependency:
//! a xorshift generator with fixed seeds, so a failure reproduces exactly.

use crate::support;
use support::fixture;

use aep_relay::wire::envelope::{is_valid_extension_name, Attr, Capture, Event, Scalar, Severity};
use bytes::Bytes;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::collections::HashSet;
use std::fmt;

/// The top-level members in wire order, duplicates kept (a `Value` map would merge them).
struct Members(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Members, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Members, A::Error> {
                let mut out = Vec::new();
                while let Some(kv) = m.next_entry::<String, Value>()? {
                    out.push(kv);
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// What the oracle expects `Event::scan` to extract.
#[derive(Debug, PartialEq)]
struct Expected {
    text: Vec<Option<String>>,
    seq: Option<u64>,
    epoch: Option<u64>,
    severity: Option<Severity>,
    capture: Option<Capture>,
    extensions: Vec<(String, Value)>,
    data: Option<Value>,
}

fn oracle(bytes: &[u8]) -> Result<Expected, String> {
    let as_value = serde_json::from_slice::<Value>(bytes);
    let members = serde_json::from_slice::<Members>(bytes);
    // The two serde readings agree on well-formedness (same parser, same limits).
    match (&as_value, &members) {
        (Ok(Value::Object(_)), Ok(_)) | (Err(_), Err(_)) => {}
        (Ok(v), Err(_)) if !v.is_object() => {}
        (v, m) => panic!(
            "serde readings disagree: Value {:?} vs Members {:?}",
            v.as_ref().map(|_| ()),
            m.as_ref().map(|_| ())
        ),
    }
    let Members(members) = members.map_err(|e| format!("serde: {e}"))?;
    let mut names = HashSet::new();
    let mut exp = Expected {
        text: vec![None; Attr::COUNT],
        seq: None,
        epoch: None,
        severity: None,
        capture: None,
        extensions: Vec::new(),
        data: None,
    };
    for (k, v) in members {
        if !names.insert(k.clone()) {
            return Err(format!("duplicate {k}"));
        }
        if v.is_null() {
            return Err(format!("null {k}"));
        }
        if let Some(a) = Attr::from_name(&k) {
            match v.as_str() {
                Some(s) if !s.is_empty() => exp.text[a as usize] = Some(s.to_owned()),
                _ => return Err(format!("{k} not a non-empty string")),
            }
            continue;
        }
        match k.as_str() {
            "seq" => exp.seq = Some(v.as_u64().ok_or("seq")?),
            "epoch" => exp.epoch = Some(v.as_u64().ok_or("epoch")?),
            "severity" => {
                exp.severity = Some(v.as_str().and_then(Severity::parse).ok_or("severity")?)
            }
            "capture" => exp.capture = Some(v.as_str().and_then(Capture::parse).ok_or("capture")?),
            "data" => {
                if !v.is_object() {
                    return Err("data not an object".into());
                }
                exp.data = Some(v);
            }
            _ => {
                if !is_valid_extension_name(&k) {
                    return Err(format!("bad extension name {k:?}"));
                }
                let scalar = v.is_string() || v.is_boolean() || v.is_i64() || v.is_u64();
                if !scalar {
                    return Err(format!("extension {k} not scalar"));
                }
                exp.extensions.push((k, v));
            }
        }
    }
    Ok(exp)
}

fn extracted(ev: &Event) -> Expected {
    let data = ev.data().map(|raw| {
        serde_json::from_slice::<Value>(raw).unwrap_or_else(|e| {
            panic!(
                "data span {:?} is not JSON: {e}",
                String::from_utf8_lossy(raw)
            )
        })
    });
    Expected {
        text: Attr::ALL
            .iter()
            .map(|&a| ev.attr(a).map(str::to_owned))
            .collect(),
        seq: ev.seq(),
        epoch: ev.epoch_declared(),
        severity: ev.severity_declared(),
        capture: ev.capture_declared(),
        extensions: ev
            .extensions()
            .map(|(k, v)| {
                let v = match v {
                    Scalar::Str(s) => Value::from(s),
                    Scalar::Bool(b) => Value::from(b),
                    Scalar::Int(i) => match u64::try_from(i) {
                        Ok(u) => Value::from(u),
                        Err(_) => Value::from(i64::try_from(i).expect("Int within i64 ∪ u64")),
                    },
                };
                (k.to_owned(), v)
            })
            .collect(),
        data,
    }
}

/// Runs one input through both and asserts agreement. Returns whether it was accepted.
fn check(input: &[u8]) -> bool {
    let want = oracle(input);
    let got = Event::scan(Bytes::copy_from_slice(input));
    let shown = || String::from_utf8_lossy(input).into_owned();
    match (want, got) {
        (Ok(want), Ok(ev)) => {
            assert_eq!(extracted(&ev), want, "attributes differ for {:?}", shown());
            // Zero-copy trim: the kept bytes are the input minus JSON whitespace.
            let trimmed = input
                .iter()
                .position(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
                .map(|s| {
                    let e = input
                        .iter()
                        .rposition(|b| !matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
                        .unwrap();
                    &input[s..=e]
                })
                .unwrap_or_default();
            assert_eq!(&ev.bytes()[..], trimmed);
            // SSE and the history rewrite line breaks only when this says so.
            let breaks = trimmed.iter().any(|b| matches!(b, b'\n' | b'\r'));
            assert_eq!(ev.has_line_breaks(), breaks, "line breaks of {:?}", shown());
            true
        }
        (Err(_), Err(e)) => {
            assert!(!e.detail.is_empty());
            if let Some(at) = e.at {
                assert!(
                    at <= input.len(),
                    "error offset {at} beyond input for {:?}",
                    shown()
                );
            }
            false
        }
        (Ok(_), Err(e)) => panic!("scan refused ({e}) what the oracle accepts: {:?}", shown()),
        (Err(why), Ok(_)) => panic!(
            "scan accepted what the oracle refuses ({why}): {:?}",
            shown()
        ),
    }
}

/// xorshift64*: small, deterministic, good enough to spread mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

const BYTES: &[u8] = b"\"\\{}[]:,0123456789-+.eEu \t\n\r\x00\x1f\x7ftfnalsrx/bU\x0c\xc3\xa9\xff\xed\xa0\x80\xef\xbb\xbf";

const SNIPPETS: &[&str] = &[
    "\\u00e9",
    "\\ud83d\\ude00",
    "\\ud800",
    "\\udc00",
    "\\ud800\\u0041",
    "\\u",
    "\\x",
    "\\/",
    "é",
    "\u{1F600}",
    "\"acme\":1,",
    "\"acme\":\"\",",
    "\"acme\":-9223372036854775808,",
    "\"acme\":18446744073709551616,",
    "\"acme\":1.5,",
    "\"acme\":null,",
    "\"acme\":[],",
    "\"type\":\"tool.x\",",
    "\"typ\\u0065\":\"tool.x\",",
    "\"seq\":-0,",
    "\"seq\":1e2,",
    "\"seq\":18446744073709551615,",
    "\"epoch\":00,",
    "\"data\":{},",
    "\"data\":[],",
    "\"data\":null,",
    "\"severity\":\"fatal\",",
    "\"capture\":\"ful\\u006c\",",
    "\"Acme\":true,",
    "\"\":1,",
    "1e400",
    "-1",
    "0.5e-400",
    "[[[[[[[[",
    "{\"a\":{\"b\":[1,{\"c\":null}]}}",
    "null",
    "true",
    "fals",
    ",",
    "  ",
];

fn mutate(rng: &mut Rng, base: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..1 + rng.below(3) {
        let at = rng.below(v.len() + 1);
        match rng.below(7) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = *rng.pick(BYTES);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next() as u8;
            }
            2 => v.truncate(at),
            3 => v.insert(at, *rng.pick(BYTES)),
            4 if at < v.len() => {
                v.remove(at);
            }
            5 => {
                let s = rng.pick(SNIPPETS).as_bytes();
                v.splice(at..at, s.iter().copied());
            }
            _ => {
                // Splice a copy of another range in (duplicates members, nests values).
                if !v.is_empty() {
                    let a = rng.below(v.len());
                    let b = (a + rng.below(80)).min(v.len());
                    let piece = v[a..b].to_vec();
                    let at = at.min(v.len());
                    v.splice(at..at, piece);
                }
            }
        }
    }
    v
}

fn golden() -> Vec<String> {
    fixture("aep-fixtures/golden/golden.jsonl")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

/// A small Event to plant generated pieces into (needs no fixture).
const TEMPLATE: &str = r#"{"aep":"0.1","id":"01J","type":"tool.completed","time":"2026-07-03T10:15:04.221Z","source":"aep://h/agent/a","agent":"a","session":"s","seq":1,"acme":"v","data":{"k":[1,2.5,"x",true,null]}}"#;

/// Mutations per golden Event (`AEP_DIFF_ITERS`, default 400) and the generator seed
/// (`AEP_DIFF_SEED`), so a long soak runs the same test:
/// `AEP_DIFF_ITERS=50000 AEP_DIFF_SEED=7 cargo test --release --test sans_io envelope_differential::`.
fn soak() -> (usize, u64) {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let iters = env("AEP_DIFF_ITERS").unwrap_or(400) as usize;
    let seed = env("AEP_DIFF_SEED").map_or(0x9E37_79B9_7F4A_7C15, |s| {
        s.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
    });
    (iters, seed)
}

#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-fixtures")]
fn mutated_golden_events_agree_with_serde() {
    let lines = golden();
    let (iters, seed) = soak();
    let mut rng = Rng(seed);
    let (mut accepted, mut total) = (0, 0);
    for line in &lines {
        assert!(check(line.as_bytes()), "golden line refused: {line}");
        for _ in 0..iters {
            let input = mutate(&mut rng, line.as_bytes());
            total += 1;
            if check(&input) {
                accepted += 1;
            }
        }
    }
    // The mix must exercise both outcomes, or the test proves little.
    assert!(
        accepted > total / 50,
        "only {accepted}/{total} mutations accepted"
    );
    assert!(accepted < total, "every mutation accepted");
    eprintln!("{accepted}/{total} mutated Events accepted, all in agreement with serde_json");
}

#[test]
fn mutated_template_agrees_with_serde() {
    let (iters, seed) = soak();
    let mut rng = Rng(seed ^ 0xD1B5_4A32_D192_ED03 | 1);
    for _ in 0..iters * 50 {
        check(&mutate(&mut rng, TEMPLATE.as_bytes()));
    }
}

/// Random strings from escape pieces and raw characters, placed as a routing attribute's
/// value, an extension value, a member name, and inside `data`.
#[test]
fn generated_strings_agree_with_serde() {
    const PIECES: &[&str] = &[
        "a",
        "Z",
        "0",
        "_",
        " ",
        "é",
        "中",
        "\u{1F600}",
        "\\\"",
        "\\\\",
        "\\/",
        "\\b",
        "\\f",
        "\\n",
        "\\r",
        "\\t",
        "\\u0000",
        "\\u001f",
        "\\u0041",
        "\\u00E9",
        "\\uFFFF",
        "\\ud83d",
        "\\ude00",
        "\\uDBFF\\uDFFF",
        "\\ud800\\udc00",
        "\\u12",
        "\\q",
        "\t",
        "\u{7f}",
        "\"",
        "\\",
        "\\u0065",
    ];
    let (iters, seed) = soak();
    let mut rng = Rng(seed ^ 0xA076_1D64_78BD_642F | 1);
    for i in 0..iters * 50 {
        let s: String = (0..rng.below(6)).map(|_| *rng.pick(PIECES)).collect();
        let input = match i % 5 {
            0 => TEMPLATE.replace("\"01J\"", &format!("\"{s}\"")),
            1 => TEMPLATE.replace("\"acme\":\"v\"", &format!("\"acme\":\"{s}\"")),
            2 => TEMPLATE.replace("\"acme\"", &format!("\"{s}\"")),
            3 => TEMPLATE.replace("\"k\"", &format!("\"{s}\"")),
            _ => TEMPLATE.replace("\"s\"", &format!("\"{s}\"")),
        };
        check(input.as_bytes());
    }
}

/// Numbers at the edges of u64/i64/f64 and of the grammar, in every numeric position.
#[test]
fn generated_numbers_agree_with_serde() {
    let mut numbers: Vec<String> = [
        "0",
        "-0",
        "1",
        "-1",
        "01",
        "-01",
        "1.0",
        "1.",
        ".1",
        "1e2",
        "1E2",
        "1e+2",
        "1e-2",
        "1e",
        "1e+",
        "-",
        "+1",
        "0.0",
        "-0.0",
        "9007199254740993",
        "9223372036854775807",
        "9223372036854775808",
        "-9223372036854775808",
        "-9223372036854775809",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999",
        "1e308",
        "1e309",
        "1.7976931348623157e308",
        "1.7976931348623159e308",
        "17976931348623158e292",
        "17976931348623157e292",
        "18446744073709551615e289",
        "18446744073709551615e288",
        "1844674407370955161e290",
        "18446744073709551616e288",
        "184467440737095516150e288",
        "1844674407370955161.5e290",
        "0e999999999999",
        "1e999999999999",
        "1e-999999999999",
        "0.0000000000000000000000001e330",
        "100000000000000000000000000000e280",
        "1e2147483647",
        "1e2147483648",
        "0.1e-2147483648",
        "123.456e-789",
        "1e00308",
        "-1e309",
        "2.5E+307",
        "4.9e-324",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut rng = Rng(0xE703_7ED1_A0B4_28DB);
    for _ in 0..3000 {
        let digits = |rng: &mut Rng, n: usize| -> String {
            (0..n)
                .map(|_| char::from(b'0' + rng.below(10) as u8))
                .collect()
        };
        let mut n = String::new();
        if rng.below(3) == 0 {
            n.push('-');
        }
        let int_len = 1 + rng.below(25);
        n.push_str(&digits(&mut rng, int_len));
        if rng.below(2) == 0 {
            n.push('.');
            let frac = rng.below(22);
            n.push_str(&digits(&mut rng, frac));
        }
        if rng.below(2) == 0 {
            n.push(*rng.pick(&['e', 'E']));
            if rng.below(2) == 0 {
                n.push(*rng.pick(&['+', '-']));
            }
            n.push_str(&(270 + rng.below(60)).to_string());
        }
        numbers.push(n);
    }
    for n in &numbers {
        for input in [
            TEMPLATE.replace("\"seq\":1", &format!("\"seq\":{n}")),
            TEMPLATE.replace("\"seq\":1", &format!("\"seq\":1,\"epoch\":{n}")),
            TEMPLATE.replace("\"acme\":\"v\"", &format!("\"acme\":{n}")),
            TEMPLATE.replace("2.5", n),
        ] {
            check(input.as_bytes());
        }
    }
}

/// Nesting around serde_json's recursion limit, in `data` and in an extension value.
#[test]
fn generated_nesting_agrees_with_serde() {
    for levels in 120..=131 {
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            // `levels` counts every container including the Event object and `data`.
            let inner = levels - 2;
            let nest = format!("{}1{}", open.repeat(inner), close.repeat(inner));
            let input = TEMPLATE.replace("\"k\":[1,2.5,\"x\",true,null]", &format!("\"k\":{nest}"));
            let accepted = check(input.as_bytes());
            // serde_json refuses the 128th nested container (AEP-0001 §5: strict JSON).
            assert_eq!(accepted, levels <= 127, "levels {levels}");
        }
    }
}

/// Whitespace, BOMs and trailing bytes around the object.
#[test]
fn framing_agrees_with_serde() {
    for pre in ["", " ", "\t\r\n", "\u{feff}", "\u{c}", "\u{a0}", "x"] {
        for post in [
            "", " ", "\n", "\r\n", "\u{c}", "x", "{}", ",", "\0", "\u{feff}",
        ] {
            check(format!("{pre}{TEMPLATE}{post}").as_bytes());
        }
    }
    for input in [
        "",
        " ",
        "{}",
        "[]",
        "1",
        "\"x\"",
        "null",
        "{",
        "}",
        "{\"aep\"}",
        "{,}",
    ] {
        check(input.as_bytes());
    }
    check(b"{\"aep\":\"0.1\xff\"}");
    check(b"{\"aep\":\"0.1\xc3\"}");
    check(b"{\"aep\":\"\xed\xa0\x80\"}");
}
