#!/usr/bin/python3
"""No include cycle between the modules of core/ (docs/architecture.md, "Modules").

A module is a folder under core/ (core/ir, core/rules, core/partition, ...). A file of module A that includes
"core/B/..." makes an edge A -> B. The graph of these edges must be acyclic: a cycle means two modules that can only
be understood, built and tested together. On a cycle, prints each edge of it with the file that makes it, and exits 1.

    tests/style/core_include_cycles.py [ROOT]     (ROOT: the project folder; default: this file's grandparent)
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"core/([^/"]+)/')


def module_edges(core):
    """{module: {included module: first file that includes it}} over core/'s .h and .cc files."""
    edges = {}
    for root, _, files in os.walk(core):
        rel = os.path.relpath(root, core)
        if rel == ".":
            continue
        module = rel.split(os.sep)[0]
        for f in sorted(files):
            if not f.endswith((".h", ".cc")):
                continue
            path = os.path.join(root, f)
            with open(path, encoding="utf-8") as src:
                for line in src:
                    m = INCLUDE.match(line)
                    if m and m.group(1) != module:
                        edges.setdefault(module, {}).setdefault(m.group(1), os.path.relpath(path, os.path.dirname(core)))
    return edges


def cycles(edges):
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
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
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    edges = module_edges(os.path.join(root, "core"))
    found = cycles(edges)
    for comp in found:
        print("include cycle between core modules: " + ", ".join(comp))
        for a in comp:
            for b, path in sorted(edges.get(a, {}).items()):
                if b in comp:
                    print(f"  core/{a} -> core/{b} ({path})")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
