#!/usr/bin/python3
"""No function over 120 lines and no source file over 600 lines (docs/architecture.md, "Code shape").

Reads the C++ sources under cli/, core/, onnx_frontend/, backend/, tests/, bench/ and fuzz/. A function is a braced
body at namespace or class scope whose head ends in ")" (plus qualifiers such as const or override, or a
constructor's initializer list); a lambda defined inside a function counts as part of it. Its length runs from the
first line of its head to its closing brace. Braced data (an "= {" initializer) is not a function. Files listed in
tests/style/lengths_allowed.txt (path, then "file" or a function name, then the length allowed) may keep that
length until they are split; a listed entry that has shrunk below the limit must be removed from the list, so the
list only shrinks. Generated tables (files whose first line says "generated") are exempt.

    tests/style/lengths.py [ROOT]     (ROOT: the project folder; default: this file's grandparent)
Prints one line per violation and exits 1, or exits 0.
"""
import os
import re
import sys

MAX_FUNCTION = 120
MAX_FILE = 600
FOLDERS = ("cli", "core", "onnx_frontend", "backend", "tests", "bench", "fuzz")
SCOPE = re.compile(r"\b(namespace|class|struct|union|enum)\b[^()]*$|\bextern\s*$")
HEAD = re.compile(r"\)\s*(const|override|final|noexcept|mutable|->[^{;]*|\s)*$|\)\s*:[^;]*$")


def strip(text):
    """The text with comments, string and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i + 2)
            delim = text[i + 2 : open_paren]
            j = text.find(")" + delim + '"', open_paren)
            j = n if j < 0 else j + len(delim) + 2
            out.append('""' + re.sub(r"[^\n]", " ", text[i + 2 : j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """[(name, first line, length in lines)] of the functions of one source file."""
    code = strip(text)
    found, scopes = [], []  # scopes: per open brace, (kind, head, first line)
    head_start, i = 0, 0
    line_of = [0] * (len(code) + 1)
    line = 1
    for k, ch in enumerate(code):
        line_of[k] = line
        if ch == "\n":
            line += 1
    for i, ch in enumerate(code):
        if ch in ";":
            head_start = i + 1
        elif ch == "{":
            head = code[head_start:i]
            inside = any(kind == "function" for kind, _, _ in scopes)
            if inside:
                kind = "block"
            elif SCOPE.search(head.strip()) and not head.rstrip().endswith(")"):
                kind = "scope"
            elif head.rstrip().endswith("="):
                kind = "data"
            elif HEAD.search(head.rstrip()) or (scopes and scopes[-1][0] == "ctor-init"):
                kind = "function"
            else:
                kind = "other"
            first = head_start + len(head) - len(head.lstrip())
            scopes.append((kind, head, line_of[first]))
            head_start = i + 1
        elif ch == "}":
            if not scopes:
                continue
            kind, head, first = scopes.pop()
            if kind == "function":
                m = re.search(r"([~\w:]+|operator\S+)\s*\(", head)
                found.append((m.group(1) if m else "lambda", first, line_of[i] - first + 1))
            head_start = i + 1
    return found


def main(root):
    allowed = {}
    listed = os.path.join(root, "tests", "style", "lengths_allowed.txt")
    if os.path.exists(listed):
        for entry in open(listed, encoding="utf-8"):
            entry = entry.split("#")[0].split()
            if len(entry) == 3:
                allowed[(entry[0], entry[1])] = int(entry[2])
    used, problems = set(), []
    for folder in FOLDERS:
        for dirpath, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = [d for d in dirs if d != "length_example"]  # the checker's own example (style.lengths_found)
            for f in sorted(files):
                if not f.endswith((".cc", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                text = open(path, encoding="utf-8").read()
                if "generated" in text.split("\n", 1)[0].lower():
                    continue
                checks = [("file", text.count("\n"), MAX_FILE, 1)]
                checks += [(name, length, MAX_FUNCTION, first) for name, first, length in functions(text)]
                for name, length, limit, first in checks:
                    if length <= limit:
                        continue
                    key = (rel, name)
                    if key in allowed and length <= allowed[key]:
                        used.add(key)
                        continue
                    what = "file" if name == "file" else f"function {name}"
                    problems.append(f"{rel}:{first}: {what} is {length} lines (limit {limit})")
    for key in sorted(set(allowed) - used):
        problems.append(f"tests/style/lengths_allowed.txt: {key[0]} {key[1]} is within its limit now: remove it")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))))
