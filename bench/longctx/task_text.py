#!/usr/bin/env python3
"""Task instances as text for the commands that only read prompt files.

`sieve calibrate delta`, `sieve calibrate dpxa` take prompts through a llama2.c tokenizer; the
long-context model (hosts/sieve/models/longctx) has a 256-token task vocabulary and none. This
writes a tokenizer whose piece i is the one code point U+0100+i (two UTF-8 bytes, no " " piece,
no two-piece merge), so the tokenizer encodes a line back to exactly its token ids, and a prompts
file with one line per instance of `sieve eval --task T --length L --seed S --dump-instances`
(the leading BOS left to the tokenizer's bos=true).

  task_text.py --sieve BIN --out-dir DIR --tasks passkey,copy --length L --instances N --seed S
writes DIR/tok256.bin and DIR/prompts_L.txt.
"""
import argparse
import json
import os
import struct
import subprocess
import sys

VOCAB = 256
BOS = 1


def piece(i):
    return chr(0x100 + i).encode("utf-8")


def write_tokenizer(path):
    pieces = [piece(i) for i in range(VOCAB)]
    with open(path, "wb") as f:
        f.write(struct.pack("<i", max(len(p) for p in pieces)))
        for p in pieces:
            f.write(struct.pack("<fi", 0.0, len(p)) + p)


def line_of(prompt):
    if not prompt or prompt[0] != BOS:
        raise ValueError("an instance prompt must start with BOS")
    return "".join(chr(0x100 + t) for t in prompt[1:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sieve", required=True)
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--tasks", default="passkey,copy")
    ap.add_argument("--length", type=int, required=True)
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--seed", type=int, required=True)
    a = ap.parse_args()
    os.makedirs(a.out_dir, exist_ok=True)
    write_tokenizer(os.path.join(a.out_dir, "tok256.bin"))
    lines = []
    for task in a.tasks.split(","):
        cmd = [a.sieve, "eval", "--task", task, "--length", str(a.length), "--instances", str(a.instances),
               "--seed", str(a.seed), "--dump-instances"]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"task_text.py: {' '.join(cmd)} failed: {out.stderr.strip()}")
        lines += [line_of(i["prompt"]) for i in json.loads(out.stdout)["instances"]]
    path = os.path.join(a.out_dir, f"prompts_{a.length}.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    print(path)


if __name__ == "__main__":
    main()
