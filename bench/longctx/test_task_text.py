#!/usr/bin/env python3
"""task_text.py's tokenizer and prompts round-trip through Sieve: a passkey instance written as a
prompt line, encoded by `sieve run` with the written tokenizer, must make the trained model
generate the instance's own passkey digits (the instance's continuation, from --dump-instances).
A tokenizer that encoded a line to other ids (a dummy-prefix space, a byte fallback, a merge) would
shift or corrupt the context and lose the passkey.

  test_task_text.py SIEVE MODEL_DIR WORK_DIR
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    sieve, model, work = sys.argv[1:4]
    length, seed = 512, 77
    subprocess.run([sys.executable, os.path.join(HERE, "task_text.py"), "--sieve", sieve, "--out-dir", work,
                    "--tasks", "passkey", "--length", str(length), "--instances", "1", "--seed", str(seed)],
                   check=True)
    inst = json.loads(subprocess.run([sieve, "eval", "--task", "passkey", "--length", str(length), "--instances", "1",
                                      "--seed", str(seed), "--dump-instances"], check=True, capture_output=True,
                                     text=True).stdout)["instances"][0]
    prompt = open(os.path.join(work, f"prompts_{length}.txt"), encoding="utf-8").readline().rstrip("\n")
    want = inst["continuation"]
    out = subprocess.run([sieve, "run", "--model", model, "--tokenizer", os.path.join(work, "tok256.bin"),
                          "--prompt", prompt, "--steps", str(len(want))], check=True, capture_output=True)
    text = out.stdout.decode("utf-8")
    got = [ord(c) - 0x100 for c in text if 0x100 <= ord(c) < 0x200]
    if got[:len(inst["prompt"]) - 1] != inst["prompt"][1:]:
        sys.exit("the echoed prompt is not the instance's tokens")
    if got[len(inst["prompt"]) - 1:] != want:
        sys.exit(f"generated {got[len(inst['prompt']) - 1:]}, the instance's passkey is {want}")
    print(f"round trip: {len(inst['prompt'])} prompt tokens, passkey {want} generated")


if __name__ == "__main__":
    main()
