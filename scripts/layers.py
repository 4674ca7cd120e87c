#!/usr/bin/env python3
"""The server library's floors: every `crate::` path in src/ (the library, not src/bin/) must
name a module on a floor below its own, no files may import each other in a circle, and no
file is longer than MAX_LINES.
docs/architecture.md draws the floors.

A floor lists modules that do not use each other: a module names only modules on lower floors
(a path to a module of its own floor is a sideways arrow, and fails like an upward one, so no
two modules can ever import each other). A module's files are `src/NAME.rs` and everything
under `src/NAME/`. Within a module the files must not form a circle (see `circles`).
Paths are read as text: `use crate::x::...` lines (with their braces) and `crate::x::` inside
code. Comments and strings are skipped as far as a line-based reader can.

  scripts/layers.py              check; exit 1 on an upward or sideways path or a circle
  scripts/layers.py --list       every upward or sideways path, with its line, and the circles
  scripts/layers.py --self-test  plants each kind of slip in a copy and checks it is caught
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
    ["wheel"],
    ["keys"],
    ["namespace", "auth"],
    ["timer"],
    ["recurring"],
    ["command"],
    ["raft_types"],
    ["metrics", "tls"],
    ["listen"],
    ["config"],
    ["storage"],
    ["cluster"],
    ["node"],
    ["push"],
    ["api"],
    ["server"],
]

# Longest file of the library (STYLE: files under ~600 lines; the test command holds it).
MAX_LINES = 600

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
                if name != me and floors[name] >= floors[me]:
                    found.append((os.path.relpath(path, root), name, n))
    return found, unknown



# ---- Circles between files ---------------------------------------------------------------
# Within a module the floors say nothing, so files are checked for circles: file A names
# something file B defines, and B (or a file B names, and so on) names A. A module's root file
# (`mod.rs`, `NAME.rs`) is its front door: its `mod` lines and its `pub use` re-exports are
# not arrows (a name re-exported there is taken as the file that defines it), the rest of its
# code is. `#[cfg(test)]` files (tests.rs, tests/) are left out: a test may name what it tests.

PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^}]*)\}")


def module_file(src, parts):
    """The file of module `parts` (a list of names from the crate root), or None."""
    if not parts:
        return os.path.join(src, "lib.rs")
    base = os.path.join(src, *parts)
    for cand in (base + ".rs", os.path.join(base, "mod.rs")):
        if os.path.exists(cand):
            return cand
    return None


def module_parts(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] == "mod":
        rel = rel[:-1]
    return rel


def reexports(path):
    """Names a module's root file re-exports: name -> the submodule path it comes from."""
    out = {}
    text = "\n".join(code_lines(open(path, encoding="utf-8").read()))
    for m in re.finditer(r"pub use ([a-z_][a-z0-9_]*)::(\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)\s*;", text):
        sub, names = m.group(1), m.group(2).strip("{}")
        for n in names.split(","):
            n = n.strip().split(" as ")[-1].strip()
            if n:
                out[n] = sub
    return out


def resolve(src, parts):
    """The file a path names: the deepest module file on it, or the file a name re-exported
    there comes from."""
    found = module_file(src, [])
    i = 0
    while i < len(parts):
        nxt = module_file(src, parts[: i + 1])
        if nxt is None:
            break
        found = nxt
        i += 1
    if i < len(parts) and found:
        sub = reexports(found).get(parts[i])
        if sub:
            deeper = module_file(src, parts[:i] + [sub])
            if deeper:
                found = deeper
    return found


def is_test_file(src, path):
    rel = os.path.relpath(path, src).split(os.sep)
    return "tests" in rel or rel[-1] == "tests.rs"


def file_arrows(root):
    src = os.path.join(root, "src")
    arrows = {}
    for path in sorted(library_files(root)):
        if is_test_file(src, path):
            continue
        me = module_parts(src, path)
        is_root = os.path.basename(path) == "mod.rs" or os.path.isdir(path[:-3])
        targets = set()
        for line in code_lines(open(path, encoding="utf-8").read()):
            s = line.strip()
            if s.startswith("#[cfg(test)]"):
                break  # the file's test module comes last
            if is_root and (s.startswith("pub use ") or re.match(r"(pub(\([a-z]+\))? )?mod ", s)):
                continue
            paths = []
            for g in GROUP_RE.finditer(line):
                for item in g.group(3).split(","):
                    item = item.strip().split(" as ")[0].split("::")
                    paths.append((g.group(1), g.group(2).split("::")[1:] + [p for p in item if p]))
            line2 = GROUP_RE.sub("", line)
            for m in PATH_RE.finditer(line2):
                paths.append((m.group(1), m.group(2).split("::")[1:]))
            for head, rest in paths:
                if head == "crate":
                    parts = rest
                elif head == "self":
                    parts = me + rest
                else:
                    up = me[:-1]
                    while rest and rest[0] == "super":
                        up, rest = up[:-1], rest[1:]
                    parts = up + rest
                target = resolve(src, [p for p in parts if p and p != "self"])
                if target and target != path and not is_test_file(src, target):
                    targets.add(target)
        arrows[path] = targets
    return arrows


def circles(root):
    """Strongly connected groups of more than one file (Tarjan)."""
    graph = file_arrows(root)
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(os.path.relpath(p, root) for p in group))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)

def check(root, verbose=True):
    found, unknown = upward(root)
    ok = True
    if unknown:
        print(f"modules with no floor in scripts/layers.py: {sorted(unknown)}")
        ok = False
    for f, m, n in found:
        print(f"{f}:{n}: reaches up (or sideways) to `{m}` (floor {floor_of()[m]}); its own is not higher")
    if found:
        ok = False
    long = [
        (os.path.relpath(p, root), n)
        for p in sorted(library_files(root))
        for n in [sum(1 for _ in open(p, encoding="utf-8"))]
        if n > MAX_LINES
    ]
    for f, n in long:
        print(f"{f}: {n} lines; a file of the library holds at most {MAX_LINES} (split it by concern)")
    if long:
        ok = False
    loops = circles(root)
    for group in loops:
        print("circle of files (they reach each other): " + " -> ".join(group))
    if loops:
        ok = False
    if verbose:
        print(
            f"layers: {len(found)} upward or sideways path(s); {len(loops)} circle(s) of files; "
            f"{'ok' if ok else 'FAILED'}"
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
        shutil.copy(os.path.join(root, "src", "wheel.rs"), plant)
        # Sideways: auth is on namespace's floor.
        side = os.path.join(copy, "src", "namespace", "mod.rs")
        with open(side, "a", encoding="utf-8") as f:
            f.write("\n#[allow(unused_imports)]\nuse crate::auth::AccessState;\n")
        assert not check(copy, verbose=False), "a planted sideways import was not caught"
        shutil.copy(os.path.join(root, "src", "namespace", "mod.rs"), side)
        # A file grown past the bound.
        with open(plant, "a", encoding="utf-8") as f:
            f.write("\n" * (MAX_LINES + 1))
        assert not check(copy, verbose=False), "a file over the bound was not caught"
        shutil.copy(os.path.join(root, "src", "wheel.rs"), plant)
        # A circle of files inside one module: driver.rs already names workers.rs.
        workers = os.path.join(copy, "src", "cluster", "workers.rs")
        assert os.path.exists(workers), "the self-test's circle plant names a file that is gone"
        with open(workers, "a", encoding="utf-8") as f:
            f.write("\n#[allow(unused_imports)]\nuse super::driver::FireDriver;\n")
        assert not check(copy, verbose=False), "a planted circle of files was not caught"
    print(
        "layers: self-test ok (planted upward and sideways imports, a long file and a circle of "
        "files are caught; comments are not imports)"
    )


if __name__ == "__main__":
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--self-test" in sys.argv:
        self_test(root)
    elif "--list" in sys.argv:
        found, unknown = upward(root)
        for f, m, n in found:
            print(f"{f}:{n} -> {m}")
        for group in circles(root):
            print("circle:", " ".join(group))
        if unknown:
            print("no floor:", sorted(unknown))
    else:
        sys.exit(0 if check(root) else 1)
