#!/usr/bin/env python3
"""Checks the layering rules of ARCHITECTURE.md on the source tree; exits 1 naming every violation.

- Every #include "a/b.h" of a file under src/ must name a header of the file's own library or of a
  library its library depends on (the DEPS of its wan_library line in CMakeLists.txt, transitively).
  The front ends (src/cli, the `wan` executable) may include any library.
- A GPU file (a name with "_gpu", or any file in src/kernels) must not include a CPU model header
  (models/*/*_cpu.h): shared plain structs belong in the model's config or weights header.
- Only the CLI (make-checkpoint) and tests include src/testing.
- No source file is over MAX_LINES lines, except the data tables listed in EXEMPT.

Usage: tools/check_layers.py [SOURCE_DIR]   (default: the repository this file is in)
"""
import fnmatch
import os
import re
import sys

MAX_LINES = 800
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
            if lines > MAX_LINES and "src/" + rel not in EXEMPT:
                errors.append(f"src/{rel}: {lines} lines (over {MAX_LINES}): split it")
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
