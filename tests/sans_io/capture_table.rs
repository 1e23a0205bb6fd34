//! The generator of `src/capture/table.rs`, the AEP-0002 §5.1 capture-gating table, and
//! its drift check.
//!
//! The build never reads `../shared`; the table is generated Rust that is committed. This
//! test reads `../shared/aep-schemas/registry/types.json` and every registered payload
//! schema (`types/{type}.schema.json`) and renders the table:
//!
//! - `AEP_REGEN_CAPTURE_TABLE=1 cargo test --test sans_io capture_table::` writes the file;
//! - without the variable it fails when the committed file differs from what the schemas
//!   produce (regenerate, review the diff, commit).
//!
//! How the schemas are read:
//! - each `properties` member is a field; its `x-aep-capture` is its level (`metadata` when
//!   absent, AEP-0002 §5.1 rule 4);
//! - an object with `properties` nests; an array whose `items` has `properties` nests per
//!   element, and an annotation on `items` raises the array's level;
//! - the `[metadata*]` exceptions (AEP-0002 §5.2 `field_spec`, §5.3 `prompt`,
//!   `options[].label`, `answer.values`; AEP-0006) are `metadata` members whose `$comment`
//!   says "metadata-gated by exception" ("synthesized" → prompt synthesis, "placeholder" →
//!   label placeholder) or describes "type-dependent" gating (`values` → structural entries);
//! - every `x-aep-capture` in a schema file must be reached by that walk, so an annotation
//!   in a construct the walk does not understand (`$ref`, `oneOf`, `if`/`then`, ...) fails
//!   the generator instead of being silently ignored.
//!
//! The two tests that read the schemas are ignored (`cfg(no_fixtures)`, see build.rs) when
//! `../shared` is absent.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

const REGEN_VAR: &str = "AEP_REGEN_CAPTURE_TABLE";

/// `{AEP_SHARED_DIR}/aep-schemas` (`../shared` unless build.rs was told otherwise). The
/// tests that read it are ignored when it is absent (`cfg(no_fixtures)`), so here it must
/// be there.
fn schemas_dir() -> PathBuf {
    let dir = Path::new(env!("AEP_SHARED_DIR")).join("aep-schemas");
    assert!(
        dir.join("registry/types.json").is_file(),
        "{} is absent; the capture table cannot be checked against the schemas",
        dir.display()
    );
    dir
}

fn table_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/capture/table.rs")
}

fn read_json(path: &Path) -> Value {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

#[derive(Debug, Clone, PartialEq)]
enum Shape {
    Leaf,
    Object(Vec<Node>),
    Array(Vec<Node>),
}

#[derive(Debug, Clone, PartialEq)]
struct Node {
    name: String,
    /// `Metadata` | `Redacted` | `Full` (the `Capture` variant name).
    level: &'static str,
    /// `Synthesize` | `Placeholder` | `StructuralEntries` (the `Gate` variant name).
    gate: Option<&'static str>,
    shape: Shape,
}

fn rank(level: &str) -> u8 {
    match level {
        "Metadata" => 1,
        "Redacted" => 2,
        "Full" => 3,
        _ => unreachable!(),
    }
}

/// Reads one `x-aep-capture` annotation (AEP-0002 §5.1: `metadata`, `redacted` or `full`).
fn annotation(schema: &Value, path: &str, seen: &mut usize) -> Option<&'static str> {
    let v = schema.get("x-aep-capture")?;
    *seen += 1;
    Some(match v.as_str() {
        Some("metadata") => "Metadata",
        Some("redacted") => "Redacted",
        Some("full") => "Full",
        _ => panic!("{path}: x-aep-capture {v} is not metadata|redacted|full (AEP-0002 §5.1)"),
    })
}

fn type_is(schema: &Value, want: &str) -> bool {
    match schema.get("type") {
        None => true,
        Some(Value::String(t)) => t == want,
        Some(_) => false,
    }
}

/// Classifies a `[metadata*]` exception from its `$comment` (see the module doc).
fn exception(
    schema: &Value,
    level: &str,
    siblings: &Map<String, Value>,
    path: &str,
) -> Option<&'static str> {
    let comment = schema.get("$comment").and_then(Value::as_str).unwrap_or("");
    let gate = if comment.contains("type-dependent") {
        assert!(
            type_is(schema, "object") && schema.get("properties").is_none(),
            "{path}: type-dependent gating is only understood on a free-form object (answer.values)"
        );
        "StructuralEntries"
    } else if comment.contains("by exception") {
        assert!(
            type_is(schema, "string"),
            "{path}: a [metadata*] exception must be a string"
        );
        if comment.contains("synthesized") {
            assert!(
                siblings.contains_key("kind"),
                "{path}: prompt synthesis (AEP-0003 §9.2) needs a sibling `kind`"
            );
            "Synthesize"
        } else if comment.contains("placeholder") {
            assert!(
                siblings.contains_key("id"),
                "{path}: a label placeholder needs a sibling `id`"
            );
            "Placeholder"
        } else {
            panic!("{path}: unclassified [metadata*] exception: {comment}")
        }
    } else {
        return None;
    };
    assert_eq!(
        level, "Metadata",
        "{path}: a [metadata*] exception is annotated metadata"
    );
    Some(gate)
}

fn members(props: &Value, path: &str, seen: &mut usize) -> Vec<Node> {
    let props = props
        .as_object()
        .unwrap_or_else(|| panic!("{path}: `properties` is not an object"));
    props
        .iter()
        .map(|(name, schema)| node(name, schema, props, &format!("{path}.{name}"), seen))
        .collect()
}

fn node(
    name: &str,
    schema: &Value,
    siblings: &Map<String, Value>,
    path: &str,
    seen: &mut usize,
) -> Node {
    let mut level = annotation(schema, path, seen).unwrap_or("Metadata");
    let gate = exception(schema, level, siblings, path);
    let shape = if let Some(props) = schema.get("properties") {
        assert!(
            type_is(schema, "object"),
            "{path}: `properties` on a non-object type"
        );
        Shape::Object(members(props, path, seen))
    } else if let Some(items) = schema.get("items") {
        let item_path = format!("{path}[]");
        if let Some(item_level) = annotation(items, &item_path, seen) {
            if rank(item_level) > rank(level) {
                level = item_level;
            }
        }
        assert!(
            items.get("items").is_none(),
            "{item_path}: nested arrays are not supported"
        );
        match items.get("properties") {
            Some(props) => {
                assert!(
                    type_is(items, "object"),
                    "{item_path}: `properties` on a non-object type"
                );
                Shape::Array(members(props, &item_path, seen))
            }
            None => Shape::Leaf,
        }
    } else {
        Shape::Leaf
    };
    assert!(
        gate.is_none() || shape == Shape::Leaf,
        "{path}: exception on a nested member"
    );
    Node {
        name: name.to_owned(),
        level,
        gate,
        shape,
    }
}

/// Counts every `x-aep-capture` member anywhere in a schema document.
fn count_annotations(v: &Value) -> usize {
    match v {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| usize::from(k == "x-aep-capture") + count_annotations(v))
            .sum(),
        Value::Array(a) => a.iter().map(count_annotations).sum(),
        _ => 0,
    }
}

/// `(type, top-level fields)` for every registered type with a schema, in registry order.
fn read_tables(dir: &Path) -> Vec<(String, Vec<Node>)> {
    let registry = read_json(&dir.join("registry/types.json"));
    let types = registry["types"]
        .as_array()
        .expect("registry/types.json: `types` array");
    let mut out = Vec::new();
    for entry in types {
        let ty = entry["type"]
            .as_str()
            .expect("registry entry without `type`");
        let Some(file) = entry["schema"].as_str() else {
            continue; // reserved / free-form payload: no table, `data` drops whole
        };
        let schema = read_json(&dir.join("types").join(file));
        assert!(
            type_is(&schema, "object"),
            "{file}: payload schema is not an object"
        );
        let mut seen = 0;
        let fields = match schema.get("properties") {
            Some(props) => members(props, ty, &mut seen),
            None => Vec::new(),
        };
        assert_eq!(
            seen,
            count_annotations(&schema),
            "{file}: some x-aep-capture annotations sit where the generator does not look"
        );
        out.push((ty.to_owned(), fields));
    }
    out
}

fn const_name(ty: &str) -> String {
    ty.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect()
}

fn render_fields(out: &mut String, fields: &[Node], indent: usize, used: &mut Used) {
    for f in fields {
        let pad = " ".repeat(indent);
        used.levels[usize::from(rank(f.level))] = true;
        match &f.shape {
            Shape::Leaf => {
                used.leaf = true;
                let _ = write!(out, "{pad}leaf({:?}, {})", f.name, f.level);
                if let Some(g) = f.gate {
                    used.gates.push(g);
                    let _ = write!(out, ".gated({g})");
                }
                out.push_str(",\n");
            }
            Shape::Object(children) | Shape::Array(children) => {
                let ctor = if matches!(f.shape, Shape::Object(_)) {
                    used.object = true;
                    "object"
                } else {
                    used.array = true;
                    "array"
                };
                let _ = writeln!(out, "{pad}{ctor}({:?}, {}, &[", f.name, f.level);
                render_fields(out, children, indent + 4, used);
                let _ = writeln!(out, "{pad}]),");
            }
        }
    }
}

#[derive(Default)]
struct Used {
    leaf: bool,
    object: bool,
    array: bool,
    levels: [bool; 4],
    gates: Vec<&'static str>,
}

fn render(tables: &[(String, Vec<Node>)]) -> String {
    let mut used = Used::default();
    let mut body = String::new();
    for (ty, fields) in tables {
        let _ = writeln!(body, "\nstatic {}: &[Field] = &[", const_name(ty));
        render_fields(&mut body, fields, 4, &mut used);
        body.push_str("];\n");
    }

    let mut out = String::new();
    out.push_str(
        "// @generated by tests/sans_io/capture_table.rs from ../shared/aep-schemas (registry/types.json\n\
         // and every registered types/{type}.schema.json). Do not edit by hand: regenerate with\n\
         //     AEP_REGEN_CAPTURE_TABLE=1 cargo test --test sans_io capture_table::\n\
         // and commit the result; without the variable that test fails when this file and the\n\
         // schemas disagree. Not formatted by rustfmt (`#[rustfmt::skip]` on the module).\n\
         \n\
         //! The AEP-0002 §5.1 capture-gating table: for every registered type with a payload\n\
         //! schema, each member's `x-aep-capture` level, nested objects and arrays of objects,\n\
         //! and the `[metadata*]` exceptions (AEP-0002 §5.2, §5.3; AEP-0006). See [`super::Field`].\n\n",
    );
    let mut ctors: Vec<&str> = vec!["Field"];
    if used.array {
        ctors.push("array");
    }
    if used.leaf {
        ctors.push("leaf");
    }
    if used.object {
        ctors.push("object");
    }
    ctors.sort_unstable();
    let _ = writeln!(out, "use super::{{{}}};", ctors.join(", "));
    let levels: Vec<&str> = ["None", "Metadata", "Redacted", "Full"]
        .iter()
        .enumerate()
        .filter(|(i, _)| used.levels[*i])
        .map(|(_, l)| *l)
        .collect();
    let _ = writeln!(
        out,
        "use crate::wire::envelope::Capture::{{{}}};",
        levels.join(", ")
    );
    used.gates.sort_unstable();
    used.gates.dedup();
    if !used.gates.is_empty() {
        let _ = writeln!(out, "use super::Gate::{{{}}};", used.gates.join(", "));
    }
    out.push_str(
        "\n/// The table of `event_type`, or `None` for a type without a registered schema.\n\
         pub(super) fn lookup(event_type: &str) -> Option<&'static [Field]> {\n    \
         Some(match event_type {\n",
    );
    for (ty, _) in tables {
        let _ = writeln!(out, "        {ty:?} => {},", const_name(ty));
    }
    out.push_str("        _ => return None,\n    })\n}\n");
    out.push_str(&body);
    out
}

/// Flattens a table into `(type, path, level, gate)` rows, `[]` marking array elements.
fn rows(
    tables: &[(String, Vec<Node>)],
) -> Vec<(String, String, &'static str, Option<&'static str>)> {
    fn walk(
        ty: &str,
        prefix: &str,
        fields: &[Node],
        out: &mut Vec<(String, String, &'static str, Option<&'static str>)>,
    ) {
        for f in fields {
            let path = if prefix.is_empty() {
                f.name.clone()
            } else {
                format!("{prefix}.{}", f.name)
            };
            out.push((ty.to_owned(), path.clone(), f.level, f.gate));
            match &f.shape {
                Shape::Leaf => {}
                Shape::Object(c) => walk(ty, &path, c, out),
                Shape::Array(c) => walk(ty, &format!("{path}[]"), c, out),
            }
        }
    }
    let mut out = Vec::new();
    for (ty, fields) in tables {
        walk(ty, "", fields, &mut out);
    }
    out
}

#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-schemas")]
fn capture_table_matches_schemas() {
    let dir = schemas_dir();
    let generated = render(&read_tables(&dir));
    let path = table_path();
    if std::env::var_os(REGEN_VAR).is_some_and(|v| v == "1") {
        std::fs::write(&path, &generated)
            .unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale against {}: regenerate with `{REGEN_VAR}=1 cargo test --test sans_io capture_table::`, \
         review the diff and commit it",
        path.display(),
        dir.display()
    );
}

/// The `[metadata*]` sites the schemas mark are exactly the ones the spec text names:
/// AEP-0002 §5.3 `attention.requested.prompt` and `options[].label`, §5.2 `field_spec.label`
/// and `choices[].label` (AEP-0006), §5.3 `attention.answered.answer.values`, and the
/// `control.attention.respond` command that carries the same `answer` (AEP-0004 §5).
#[test]
#[cfg_attr(no_fixtures, ignore = "needs ../shared/aep-schemas")]
fn metadata_star_exceptions_match_spec() {
    let dir = schemas_dir();
    let tables = read_tables(&dir);
    let found: Vec<(String, String, &str)> = rows(&tables)
        .into_iter()
        .filter_map(|(ty, path, _, gate)| gate.map(|g| (ty, path, g)))
        .collect();
    let want = [
        ("attention.requested", "prompt", "Synthesize"),
        ("attention.requested", "options[].label", "Placeholder"),
        ("attention.requested", "fields[].label", "Placeholder"),
        (
            "attention.requested",
            "fields[].choices[].label",
            "Placeholder",
        ),
        ("attention.answered", "answer.values", "StructuralEntries"),
        (
            "control.attention.respond",
            "answer.values",
            "StructuralEntries",
        ),
    ];
    let want: Vec<(String, String, &str)> = want
        .iter()
        .map(|(t, p, g)| (t.to_string(), p.to_string(), *g))
        .collect();
    assert_eq!(found, want);
}

/// Spot checks of the generated table through the public API, against the AEP-0002 §5.2 /
/// §5.3 / §5.4 text (not only against the generator).
#[test]
fn table_agrees_with_spec_text() {
    use aep_relay::capture::{schema, Field, Gate, Shape};
    use aep_relay::wire::envelope::Capture::{self, *};

    fn at(fields: &'static [Field], path: &[&str]) -> (Capture, Gate) {
        let (first, rest) = path.split_first().unwrap();
        let f = fields
            .iter()
            .find(|f| f.name == *first)
            .unwrap_or_else(|| panic!("no member {first}"));
        match (rest.is_empty(), f.shape) {
            (true, _) => (f.level, f.gate),
            (false, Shape::Object(c) | Shape::Array(c)) => at(c, rest),
            (false, Shape::Leaf) => panic!("{first} has no members"),
        }
    }
    let t = |ty: &str, path: &[&str]| at(schema(ty).unwrap(), path);

    assert_eq!(t("session.started", &["label"]), (Redacted, Gate::Plain));
    assert_eq!(t("session.started", &["cwd"]), (Redacted, Gate::Plain));
    assert_eq!(
        t("session.started", &["client", "version"]),
        (Metadata, Gate::Plain)
    );
    assert_eq!(
        t("run.started", &["gen_ai.usage.input_tokens"]),
        (Metadata, Gate::Plain)
    );
    assert_eq!(t("tool.requested", &["args"]), (Full, Gate::Plain));
    assert_eq!(
        t("tool.requested", &["args_redacted"]),
        (Redacted, Gate::Plain)
    );
    assert_eq!(t("tool.completed", &["result"]), (Full, Gate::Plain));
    assert_eq!(
        t("tool.failed", &["error", "message"]),
        (Redacted, Gate::Plain)
    );
    assert_eq!(t("attention.requested", &["context"]), (Full, Gate::Plain));
    assert_eq!(
        t("attention.requested", &["prompt"]),
        (Metadata, Gate::Synthesize)
    );
    assert_eq!(
        t("attention.requested", &["fields", "choices", "label"]),
        (Metadata, Gate::Placeholder)
    );
    assert_eq!(
        t("attention.answered", &["answer", "text"]),
        (Redacted, Gate::Plain)
    );
    assert_eq!(
        t("attention.answered", &["answer", "values"]),
        (Metadata, Gate::StructuralEntries)
    );
    assert_eq!(
        t("resource.retrieval.returned", &["documents", "content"]),
        (Full, Gate::Plain)
    );
    assert_eq!(
        t(
            "resource.citation.recorded",
            &["citations", "source", "uri"]
        ),
        (Redacted, Gate::Plain)
    );
    assert_eq!(
        t(
            "assessment.guardrail.recorded",
            &["guardrail", "explanation"]
        ),
        (Redacted, Gate::Plain)
    );
    assert_eq!(t("state.delta", &["delta"]), (Redacted, Gate::Plain));
    assert!(schema("control.pause").is_some_and(<[Field]>::is_empty));
    assert!(
        schema("message.user.submitted").is_none(),
        "reserved, no schema"
    );
    assert!(schema("x.acme.session.custom_blob").is_none());
}

/// The generator's reading rules on synthetic schemas (no `../shared` needed).
#[test]
fn generator_rules() {
    let schema: Value = serde_json::json!({
        "type": "object",
        "properties": {
            "plain": {"type": "string"},
            "items_raise": {"type": "array", "x-aep-capture": "metadata",
                "items": {"type": "object", "x-aep-capture": "redacted",
                    "properties": {"id": {"type": "string"}}}},
            "ask": {"type": "string", "x-aep-capture": "metadata",
                "$comment": "metadata-gated by exception: ... synthesized ..."},
            "kind": {"enum": ["input"]}
        }
    });
    let mut seen = 0;
    let fields = members(&schema["properties"], "t", &mut seen);
    assert_eq!(seen, count_annotations(&schema));
    assert_eq!(
        (fields[0].level, fields[0].gate),
        ("Metadata", None),
        "unannotated → metadata"
    );
    assert_eq!(
        fields[1].level, "Redacted",
        "an items annotation raises the array"
    );
    assert!(matches!(fields[1].shape, Shape::Array(ref c) if c.len() == 1));
    assert_eq!(fields[2].gate, Some("Synthesize"));
    assert_eq!(const_name("a.b_c"), "A_B_C");
}

#[test]
#[should_panic(expected = "where the generator does not look")]
fn generator_refuses_annotations_it_cannot_place() {
    struct TempDir(PathBuf);
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let tmp =
        TempDir(std::env::temp_dir().join(format!("aep-capture-table-{}", std::process::id())));
    let dir = &tmp.0;
    std::fs::create_dir_all(dir.join("registry")).unwrap();
    std::fs::create_dir_all(dir.join("types")).unwrap();
    std::fs::write(
        dir.join("registry/types.json"),
        r#"{"types": [{"type": "x.t", "schema": "x.t.schema.json"}]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("types/x.t.schema.json"),
        r#"{"type": "object", "properties": {"a": {"oneOf": [{"x-aep-capture": "full"}]}}}"#,
    )
    .unwrap();
    let _ = read_tables(dir);
}
