#!/usr/bin/env python3
"""Finds import cycles between the modules of each crate: a module that names another
(by `use` or by a path in the code) which names it back, directly or through others.
A module reaching its own parent or children does not count: those are one unit.

    scripts/modcycles.py [CRATE_SRC_DIR...]     (default: every crate of the workspace)

Modules are read from file paths (src/p2p/node.rs is p2p::node); comments and inline
test modules are skipped. Prints each cycle and exits 1 if there is any, else says how
many modules it read.
"""
import os
import re
import sys

DEFAULT = ["src", "nemesis-shm/src", "nemesis-net/src", "lmt/src", "tools/src"]


def modules(root):
    """Module path -> file, by file path."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(dirpath, f)
            parts = os.path.relpath(path, root)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main"):
                parts = parts[:-1]
            out["::".join(parts)] = path
    return out


def edges(mods):
    """Module -> the modules (not its ancestors or descendants) its code names."""
    out = {m: set() for m in mods}
    for m, path in mods.items():
        with open(path, encoding="utf-8") as f:
            src = f.read()
        src = re.split(r"#\[cfg\(test\)\]\s*mod tests\s*\{", src)[0]
        src = re.sub(r"//[^\n]*", "", src)
        here = m.split("::") if m else []
        for base, rest in re.findall(r"\b(crate|super)((?:::\w+)+)", src):
            segs = [s for s in rest.split("::") if s]
            target = segs if base == "crate" else here[:-1] + segs
            for k in range(len(target), 0, -1):
                t = "::".join(target[:k])
                if t in mods:
                    related = t == m or m.startswith(t + "::") or t.startswith(m + "::")
                    if m and not related:
                        out[m].add(t)
                    break
    return out


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []
    counter = [0]

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
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0
    roots = argv or DEFAULT
    bad = 0
    read = 0
    for root in roots:
        if not os.path.isdir(root):
            print(f"modcycles: {root} is not a directory", file=sys.stderr)
            return 2
        mods = modules(root)
        read += len(mods)
        graph = edges(mods)
        for comp in cycles(graph):
            bad += 1
            links = [f"{a} -> {b}" for a in comp for b in sorted(graph[a]) if b in comp]
            print(f"{root}: import cycle among {', '.join(comp)} ({'; '.join(links)})")
    if bad:
        return 1
    print(f"modcycles: no import cycles among {read} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
