#!/usr/bin/env python3
"""Fails on a function over 120 lines or a file over 1,200 lines in src/.

A function is counted from its `fn` line to the line of its closing brace (the code is
rustfmt-formatted, so that brace sits alone at the `fn` line's indentation). A file's
lines are counted outside its tests: a `tests.rs` file, and a `#[cfg(test)]` item (its
`mod tests { … }`), are left out. Functions in tests count too: a long test is as hard to
read as long code.

Prints each one over its limit with file:line and exits 1, or one line of totals.
Python 3 standard library only. Usage: python3 .ci/sizes.py
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")
MAX_FN = 120
MAX_FILE = 1200
FN = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))? )?(?:const )?(?:async )?(?:unsafe )?fn \w+")


def functions(lines):
    """(first line number, length, name) of each function with a body."""
    out = []
    for i, line in enumerate(lines):
        m = FN.match(line)
        if not m:
            continue
        indent = m.group(1)
        j = i
        while j < len(lines) and not lines[j].rstrip().endswith(("{", ";")):
            j += 1
        if j == len(lines) or lines[j].rstrip().endswith(";"):
            continue  # a declaration without a body (a trait item)
        if lines[j].rstrip().endswith("{}"):
            continue
        k = j + 1
        while k < len(lines) and lines[k] != indent + "}":
            k += 1
        name = line.strip().split("fn ", 1)[1].split("(")[0].split("<")[0]
        out.append((i + 1, k - i + 1, name))
    return out


def lines_outside_tests(lines):
    """The file's line count without its `#[cfg(test)]` items."""
    n, i = 0, 0
    while i < len(lines):
        if lines[i].strip() == "#[cfg(test)]":
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            j = i + 1
            if j < len(lines) and lines[j].rstrip().endswith("{"):
                while j < len(lines) and lines[j] != indent + "}":
                    j += 1
            i = j + 1
            continue
        n += 1
        i += 1
    return n


def main():
    over, files, fns = [], 0, 0
    for dirpath, _, names in os.walk(SRC):
        for f in sorted(names):
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, ROOT)
            lines = open(path, encoding="utf-8").read().split("\n")
            files += 1
            for first, length, name in functions(lines):
                fns += 1
                if length > MAX_FN:
                    over.append(f"{rel}:{first}: fn {name} is {length} lines (at most {MAX_FN})")
            if f != "tests.rs":
                n = lines_outside_tests(lines)
                if n > MAX_FILE:
                    over.append(f"{rel}: {n} lines outside tests (at most {MAX_FILE})")
    if over:
        print("\n".join(sorted(over)))
        return 1
    print(f"sizes: {fns} functions in {files} files of src/, none over {MAX_FN} lines; "
          f"no file over {MAX_FILE} lines outside tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
