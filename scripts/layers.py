#!/usr/bin/env python3
"""The server library's floors: every `crate::` path in src/ (the library, not src/bin/) must
name a module on the same floor or below its own. docs/architecture.md draws the floors.

A floor lists modules that may use each other (none does today across a floor's modules
unless listed together); a module's files are `src/NAME.rs` and everything under `src/NAME/`.
Paths are read as text: `use crate::x::...` lines (with their braces) and `crate::x::` inside
code. Comments and strings are skipped as far as a line-based reader can.

The check is a ratchet while issue 35 takes the upward imports out: KNOWN lists the ones that
were there when the check came (file, module it reaches up to). An upward path not in KNOWN
fails; so does an entry of KNOWN that no longer occurs (take it out: the list only shrinks).

  scripts/layers.py            check; exit 1 on a new upward path or a stale KNOWN entry
  scripts/layers.py --list     every upward path, known or not, with its line
  scripts/layers.py --self-test  plants an upward import in a copy and checks it is caught
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# Bottom floor first. A module missing here fails the check (a new module takes a floor).
FLOORS = [
    ["error", "alloc_count", "codec"],
    ["sim"],
    ["clock"],
    ["wheel", "recur"],
    ["namespace", "auth"],
    ["timer", "series"],
    ["command"],
    ["raft_types"],
    ["metrics", "tls", "listen"],
    ["config"],
    ["storage"],
    ["cluster"],
    ["node", "membership", "backup", "sample"],
    ["push"],
    ["api"],
    ["server"],
]

USE_RE = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")


def floor_of():
    out = {}
    for i, floor in enumerate(FLOORS):
        for m in floor:
            out[m] = i
    return out


def module_of(root, path):
    rel = os.path.relpath(path, os.path.join(root, "src"))
    first = rel.split(os.sep)[0]
    return first[:-3] if first.endswith(".rs") else first


def library_files(root):
    src = os.path.join(root, "src")
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        if rel == "bin" or rel.startswith("bin" + os.sep):
            continue
        for f in filenames:
            if f.endswith(".rs") and not (rel == "." and f in ("lib.rs",)):
                yield os.path.join(dirpath, f)


def code_lines(text):
    """Lines with comments and string literals blanked (a line-based approximation)."""
    in_block = False
    for line in text.splitlines():
        out = []
        i = 0
        in_str = False
        while i < len(line):
            if in_block:
                end = line.find("*/", i)
                if end < 0:
                    i = len(line)
                    continue
                in_block = False
                i = end + 2
                continue
            c = line[i]
            if in_str:
                if c == "\\":
                    i += 2
                    continue
                if c == '"':
                    in_str = False
                i += 1
                continue
            if line.startswith("//", i):
                break
            if line.startswith("/*", i):
                in_block = True
                i += 2
                continue
            if c == '"':
                in_str = True
                i += 1
                continue
            out.append(c)
            i += 1
        yield "".join(out)


def upward(root):
    floors = floor_of()
    found = []
    unknown = set()
    for path in sorted(library_files(root)):
        me = module_of(root, path)
        if me not in floors:
            unknown.add(me)
            continue
        text = open(path, encoding="utf-8").read()
        # A `use crate::{a, b::c}` group names several modules.
        for n, line in enumerate(code_lines(text), 1):
            names = USE_RE.findall(line)
            group = re.search(r"\bcrate::\{([^}]*)", line)
            if group:
                names += re.findall(r"(?:^|[,{\s])([a-z_][a-z0-9_]*)(?=::|\s*[,}]|$)", group.group(1))
            for name in names:
                if name in ("Error", "Result") or name not in floors and name[0].isupper():
                    continue
                if name not in floors:
                    # `crate::Result`, macros, items re-exported at the root.
                    continue
                if floors[name] > floors[me]:
                    found.append((os.path.relpath(path, root), name, n))
    return found, unknown


def known(root):
    path = os.path.join(root, "scripts", "layers-known.txt")
    out = set()
    if os.path.exists(path):
        for line in open(path, encoding="utf-8"):
            line = line.split("#")[0].strip()
            if line:
                f, m = line.split()
                out.add((f, m))
    return out


def check(root, verbose=True):
    found, unknown = upward(root)
    ok = True
    if unknown:
        print(f"modules with no floor in scripts/layers.py: {sorted(unknown)}")
        ok = False
    allowed = known(root)
    seen = {(f, m) for f, m, _ in found}
    new = [(f, m, n) for f, m, n in found if (f, m) not in allowed]
    stale = sorted(allowed - seen)
    for f, m, n in new:
        print(f"{f}:{n}: reaches up to `{m}` (floor {floor_of()[m]}); its own is lower")
    for f, m in stale:
        print(f"scripts/layers-known.txt: `{f} {m}` no longer occurs; take it out")
    if new or stale:
        ok = False
    if verbose:
        print(
            f"layers: {len(found)} upward path(s) in {len(seen)} file/module pair(s), "
            f"{len(allowed)} known; {'ok' if ok else 'FAILED'}"
        )
    return ok


def self_test(root):
    with tempfile.TemporaryDirectory() as tmp:
        copy = os.path.join(tmp, "repo")
        shutil.copytree(os.path.join(root, "src"), os.path.join(copy, "src"))
        shutil.copytree(os.path.join(root, "scripts"), os.path.join(copy, "scripts"))
        assert check(copy, verbose=False), "the tree as it is must pass"
        plant = os.path.join(copy, "src", "wheel.rs")
        with open(plant, "a", encoding="utf-8") as f:
            f.write("\n#[allow(unused_imports)]\nuse crate::server::RunningNode;\n")
        assert not check(copy, verbose=False), "a planted upward import was not caught"
        # Comments and strings do not count.
        shutil.copy(os.path.join(root, "src", "wheel.rs"), plant)
        with open(plant, "a", encoding="utf-8") as f:
            f.write('\n// use crate::server::RunningNode;\nconst _S: &str = "crate::api::x";\n')
        assert check(copy, verbose=False), "a comment or a string was taken for an import"
    print("layers: self-test ok (a planted upward import is caught; comments are not imports)")


if __name__ == "__main__":
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--self-test" in sys.argv:
        self_test(root)
    elif "--list" in sys.argv:
        found, unknown = upward(root)
        for f, m, n in found:
            print(f"{f}:{n} -> {m}")
        if unknown:
            print("no floor:", sorted(unknown))
    else:
        sys.exit(0 if check(root) else 1)
