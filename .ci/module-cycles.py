#!/usr/bin/env python3
"""Fails on any import cycle among the library's top-level modules, or among the
modules inside `core/`.

The top-level modules are the `mod` items of src/lib.rs; the core's are those of
src/core/mod.rs. A module's files (src/NAME.rs, src/NAME/**.rs) and their submodules count
as part of it. An edge A -> B is any path in A's code that names its sibling B:
`crate::B…` (`crate::core::B…` inside the core; in a `use` or inline, `use crate::{B::…,
…}` groups too), a re-export the parent takes from B (`crate::Code` is `refusal`'s), or a
`super::` path that climbs out of A to the parent. What a parent file itself holds (the
core's `Core`) is no sibling. Comments and string literals are not code, so a doc link
(`[`crate::B`]`) is no edge: rustdoc resolves those whatever the layering.

Prints, per scope, the graph's strongly connected components that have more than one
module (every cycle lies in one) with each edge inside, file:line of where it is named;
exits 1 if there is any. Python 3 standard library only.
Usage: python3 .ci/module-cycles.py [--graph]
"""

import os
import re
import sys
from collections import defaultdict

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def strip(text):
    """The code of a Rust file with comments and string/char literals blanked out.

    Newlines are kept so line numbers still hold."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:i + 300])) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = '"' + m.group(1)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j + 1
        elif c == "'":
            # A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
            if text.startswith("\\", i + 1):
                j = text.find("'", i + 3)
                out.append("' '")
                i = j + 1
            elif i + 2 < n and text[i + 2] == "'":
                out.append("' '")
                i += 3
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def modules_of(scope):
    """The modules of `scope` (the `mod` items of src/lib.rs for [], of src/core/mod.rs for
    ['core']) and the parent's re-exports: name -> module."""
    parent = os.path.join(SRC, *scope, "mod.rs") if scope else os.path.join(SRC, "lib.rs")
    code = strip(open(parent, encoding="utf-8").read())
    mods = re.findall(r"^\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+([a-z_0-9]+)\s*;", code, re.M)
    reexports = {}
    for m in re.finditer(r"^\s*pub\s+use\s+([^;]+);", code, re.M | re.S):
        tree = m.group(1).strip()
        for prefix in ["crate::" + "".join(p + "::" for p in scope), "self::"]:
            if tree.startswith(prefix):
                tree = tree[len(prefix):]
        head = IDENT.match(tree)
        if not head or head.group(0) not in mods:
            continue
        owner, rest = head.group(0), tree[head.end():]
        brace = rest.find("{")
        names = rest[brace + 1:rest.rfind("}")] if brace >= 0 else rest.rsplit("::", 1)[-1]
        for item in split_group(names):
            alias = re.search(r"\bas\s+([A-Za-z_0-9]+)$", item)
            name = alias.group(1) if alias else item.split("::")[-1].strip()
            if name and name != "self":
                reexports[name] = owner
    return mods, reexports


def split_group(s):
    """The top-level items of a use group's inside (`a, b::{c, d}, e as f`)."""
    items, depth, cur = [], 0, []
    for ch in s:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        items.append("".join(cur).strip())
    return items


def group_heads(code, start):
    """The first identifier of each item of the use group opening at code[start] == '{'."""
    depth, j = 0, start
    while j < len(code):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                break
        j += 1
    heads = []
    for item in split_group(code[start + 1:j]):
        if item.startswith("{"):
            continue
        m = IDENT.match(item)
        if m:
            heads.append(m.group(0))
    return heads


def module_path(rel):
    """src-relative file -> its module path (['core', 'conn']), or None for the binary."""
    parts = rel[:-3].split(os.sep)
    if parts[-1] == "mod":
        parts = parts[:-1]
    return parts


def inline_mod_depth(code):
    """For each offset's line, how many inline `mod x { … }` blocks enclose it."""
    depth_at_line, stack, brace, line = [0], [], 0, 0
    for m in re.finditer(r"\bmod\s+[a-z_0-9]+\s*\{|[{}\n]", code):
        t = m.group(0)
        if t == "\n":
            line += 1
            depth_at_line.append(len(stack))
        elif t == "{":
            brace += 1
        elif t == "}":
            if stack and stack[-1] == brace:
                stack.pop()
            brace -= 1
        else:
            brace += 1
            stack.append(brace)
    return depth_at_line


def check(scope, show_graph):
    """Prints the cycles among the modules of `scope`; returns how many there are."""
    mods, reexports = modules_of(scope)
    depth = len(scope)
    where_name = "src/lib.rs" if not scope else f"src/{'/'.join(scope)}/mod.rs"
    edges = defaultdict(list)  # (a, b) -> ["file:line", ...]

    def resolve(name):
        if name in mods:
            return name
        return reexports.get(name)

    for dirpath, _, files in os.walk(SRC):
        for f in sorted(files):
            if not f.endswith(".rs"):
                continue
            full = os.path.join(dirpath, f)
            rel = os.path.relpath(full, SRC)
            path = module_path(rel)
            if path[:depth] != scope or len(path) <= depth or path[depth] not in mods:
                continue  # the parent file itself, another scope, the binary (main.rs, cli/)
            a = path[depth]
            code = strip(open(full, encoding="utf-8").read())
            line_of = lambda off: code.count("\n", 0, off) + 1
            inline = inline_mod_depth(code)

            def add_edges(k, ln):
                """The edges of the path (or `{…}` group) starting at offset `k`."""
                targets = group_heads(code, k) if code.startswith("{", k) else []
                if not targets:
                    ident = IDENT.match(code, k)
                    targets = [ident.group(0)] if ident else []
                for t in targets:
                    b = resolve(t)
                    if b and b != a:
                        edges[(a, b)].append(f"src/{rel}:{ln}")

            crate_path = r"(?<![A-Za-z0-9_$])crate::" + "".join(p + "::" for p in scope)
            for m in re.finditer(crate_path, code):
                add_edges(m.end(), line_of(m.start()))

            for m in re.finditer(r"(?<![A-Za-z0-9_:])((?:super::)+)", code):
                ups = m.group(1).count("super::")
                ln = line_of(m.start())
                here = path + ["<inline>"] * inline[ln - 1]
                if ups > len(here) or here[: len(here) - ups] != scope:
                    continue  # still inside its own module, or climbed past the parent
                add_edges(m.end(), ln)

    graph = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)

    if show_graph:
        print(f"{where_name}:")
        for a in sorted(mods):
            print(f"{a} -> {', '.join(sorted(graph[a])) or '(none)'}")
        print()

    # Tarjan's strongly connected components.
    index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            sccs.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(mods):
        if v not in index:
            visit(v)

    cycles = [c for c in sccs if len(c) > 1]
    if not cycles:
        print(f"module-cycles: no cycle among the {len(mods)} modules of {where_name} "
              f"({sum(len(s) for s in graph.values())} edges)")
        return 0
    for comp in sorted(cycles):
        members = set(comp)
        print(f"module-cycles: {len(comp)} modules of {where_name} form a cycle: {', '.join(comp)}")
        for (a, b), where in sorted(edges.items()):
            if a in members and b in members:
                more = f" (+{len(where) - 3} more)" if len(where) > 3 else ""
                print(f"  {a} -> {b}: {', '.join(where[:3])}{more}")
    return len(cycles)


def main():
    show_graph = "--graph" in sys.argv
    found = sum(check(scope, show_graph) for scope in ([], ["core"]))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
