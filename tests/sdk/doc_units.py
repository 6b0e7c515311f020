#!/usr/bin/env python3
"""Write the code blocks of a Markdown guide to files, so that the SDK test compiles what the guide
shows instead of a copy that could drift from it.

A fenced block whose info string names a unit (```c unit=guide.c) is appended to OUT_DIR/<unit>;
the blocks of one unit are joined in document order. A block in a language a compiler or CMake
reads (c, cpp, cmake) that names no unit fails the run, so no code in the guide escapes the test.
Prints the units written, one per line.

usage: doc_units.py GUIDE.md OUT_DIR
"""
import pathlib
import re
import sys

COMPILED = {"c", "cpp", "c++", "cmake"}


def main(guide, out_dir):
    units, untagged, block, unit = {}, [], None, None
    for number, line in enumerate(pathlib.Path(guide).read_text().splitlines(), 1):
        if line.startswith("```"):
            if block is None:
                info = line[3:].split()
                lang = info[0] if info else ""
                tags = dict(t.split("=", 1) for t in info[1:] if "=" in t)
                unit, block = tags.get("unit"), []
                if unit is None and lang in COMPILED:
                    untagged.append(f"{guide}:{number}: a ```{lang} block without unit=<file>")
            else:
                if unit is not None:
                    units.setdefault(unit, []).append("\n".join(block) + "\n")
                block = None
            continue
        if block is not None:
            block.append(line)
    if block is not None:
        untagged.append(f"{guide}: a fenced block is never closed")
    for problem in untagged:
        print(problem, file=sys.stderr)
    if untagged:
        return 1
    for unit, blocks in units.items():
        if not re.fullmatch(r"[A-Za-z0-9_./-]+", unit) or ".." in unit:
            print(f"{guide}: unit name '{unit}' is not a relative file name", file=sys.stderr)
            return 1
        path = pathlib.Path(out_dir, unit)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(blocks))
        print(unit)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[-1])
    sys.exit(main(sys.argv[1], sys.argv[2]))
