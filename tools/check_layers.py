#!/usr/bin/env python3
"""Checks the layering and size rules of ARCHITECTURE.md on the source tree; exits 1 naming every violation.

- Every #include "a/b.h" of a file under src/ must name a header of the file's own library or of a
  library its library depends on (the DEPS of its wan_library line in CMakeLists.txt, transitively).
  The front ends (src/cli, the `wan` executable) may include any library.
- A GPU file (a name with "_gpu", or any file in src/kernels) must not include a CPU model header
  (models/*/*_cpu.h): shared plain structs belong in the model's config or weights header.
- Only the CLI (make-checkpoint) and tests include src/testing.
- No source file is over MAX_LINES lines, except the data tables listed in EXEMPT; no top-level function
  is over MAX_FUNCTION_LINES lines; every file opens with a comment of at most MAX_TOP_COMMENT lines
  saying its job and invariants (longer notes go next to the code they describe).

Usage: tools/check_layers.py [SOURCE_DIR]   (default: the repository this file is in)
"""
import fnmatch
import os
import re
import sys

MAX_LINES = 800
MAX_FUNCTION_LINES = 120
MAX_TOP_COMMENT = 16
EXEMPT = {"src/text/unicode_tables.cpp", "src/text/html_tables.cpp", "src/text/grapheme_tables.cpp"}
SOURCE_EXT = (".h", ".cpp", ".cu", ".cuh")


def parse_libraries(cmake_text):
    """wan_library(name GLOBS g... [EXCLUDE "re"] [DEPS d...]) -> {name: (globs, exclude, deps)}."""
    libs = {}
    for m in re.finditer(r"^wan_library\(([^)]*)\)", cmake_text, re.M):
        words = m.group(1).split()
        name, section = words[0], None
        globs, deps, exclude = [], [], None
        for w in words[1:]:
            if w in ("GLOBS", "DEPS", "EXCLUDE"):
                section = w
            elif w in ("GPU_BY_NAME", "GPU_ONLY"):
                section = None
            elif section == "GLOBS":
                globs.append(w)
            elif section == "DEPS":
                deps.append(w)
            elif section == "EXCLUDE":
                exclude = w.strip('"').replace("\\\\", "\\")
        libs[name] = (globs, exclude, deps)
    return libs


def glob_match(pattern, path):
    """CMake file(GLOB) semantics for one pattern: '*' never crosses a '/'."""
    p, q = pattern.split("/"), path.split("/")
    return len(p) == len(q) and all(fnmatch.fnmatchcase(b, a) for a, b in zip(p, q))


def library_of(rel, libs):
    """The library a path under src/ belongs to (headers follow the same globs as sources)."""
    stem = os.path.splitext(rel)[0]
    for name, (globs, exclude, _) in libs.items():
        if exclude and not exclude.startswith("${") and re.search(exclude, stem + ".cpp"):
            continue
        if any(glob_match(g, stem) for g in globs):
            return name
    return None


def size_problems(rel, text):
    """Long top-level functions (a definition at column 0 up to its closing brace at column 0) and a
    missing or long top-of-file comment."""
    problems, lines = [], text.split("\n")
    top = 0
    while top < len(lines) and lines[top].startswith("//"):
        top += 1
    if top == 0:
        problems.append(f"src/{rel}: no top-of-file comment saying its job")
    elif top > MAX_TOP_COMMENT:
        problems.append(f"src/{rel}: top-of-file comment of {top} lines (over {MAX_TOP_COMMENT})")
    start = None
    for i, line in enumerate(lines):
        if start is None and re.match(r"^[A-Za-z].*\)\s*(const\s*)?(noexcept\s*)?\{\s*$", line) and not re.match(
                r"^(namespace|struct|class|enum|union|extern)\b", line):
            start = i
        elif start is not None and line.startswith("}"):
            if i - start + 1 > MAX_FUNCTION_LINES:
                problems.append(f"src/{rel}:{start + 1}: function of {i - start + 1} lines (over "
                                f"{MAX_FUNCTION_LINES}): {lines[start].strip()[:60]}")
            start = None
    return problems


def closure(libs):
    memo = {}

    def deps(n):
        if n not in memo:
            memo[n] = {n}
            for d in libs[n][2]:
                memo[n] |= deps(d)
        return memo[n]

    return {n: deps(n) for n in libs}


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    libs = parse_libraries(open(os.path.join(root, "CMakeLists.txt")).read())
    allowed = closure(libs)
    errors, files = [], 0
    for dirpath, _, names in os.walk(os.path.join(root, "src")):
        for fn in sorted(names):
            if not fn.endswith(SOURCE_EXT):
                continue
            path = os.path.join(dirpath, fn)
            rel = os.path.relpath(path, os.path.join(root, "src")).replace(os.sep, "/")
            files += 1
            text = open(path, encoding="utf-8").read()
            lines = text.count("\n")
            if "src/" + rel not in EXEMPT:
                if lines > MAX_LINES:
                    errors.append(f"src/{rel}: {lines} lines (over {MAX_LINES}): split it")
                errors += size_problems(rel, text)
            front_end = rel.startswith("cli/")
            lib = None if front_end else library_of(rel, libs)
            if not front_end and lib is None:
                errors.append(f"src/{rel}: in no library of CMakeLists.txt")
                continue
            gpu = "_gpu" in fn or rel.startswith("kernels/")
            for n, line in enumerate(text.splitlines(), 1):
                m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                if not m:
                    continue
                inc = m.group(1)
                if not os.path.exists(os.path.join(root, "src", inc)):
                    continue  # a system or generated header
                where = f"src/{rel}:{n}: includes {inc}"
                if inc.startswith("testing/") and not (front_end or rel.startswith("testing/")):
                    errors.append(f"{where}: only tests and make-checkpoint use the checkpoint writer")
                if gpu and re.match(r"models/[^/]+/[^/]+_cpu\.h$", inc):
                    errors.append(f"{where}: a GPU file borrows from a CPU model (move the struct to weights.h)")
                if front_end:
                    continue
                to = library_of(inc, libs)
                if inc.startswith("cli/"):
                    errors.append(f"{where}: a library includes the command line")
                elif to is not None and to not in allowed[lib]:
                    errors.append(f"{where}: wan_{lib} does not depend on wan_{to} (arrows point down)")
    for e in errors:
        print(e)
    print(f"check_layers: {files} files, {len(errors)} violation(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
