#!/usr/bin/env python3
"""Write the README of a trained model (its provenance) from what the training call left:
training.json (seed, steps, device, torch, arguments, final held-out accuracy), curve.jsonl and
the first lines of train.log (date, GPU, commit).

usage: model_readme.py RUN_DIR MODEL_DIR [--command TEXT]
  RUN_DIR    the call's $OUT (train.log, train/curve.jsonl)
  MODEL_DIR  where the model is committed (config.json, model.safetensors, training.json);
             README.md is written there
"""
import argparse
import json
import os


def main():
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("model_dir")
    p.add_argument("--command", default="bash gpu/h-longctx.sh")
    a = p.parse_args()
    info = json.load(open(os.path.join(a.model_dir, "training.json")))
    cfg = json.load(open(os.path.join(a.model_dir, "config.json")))
    curve = [json.loads(line) for line in open(os.path.join(a.run_dir, "train", "curve.jsonl"))]
    header = []
    log = os.path.join(a.run_dir, "train.log")
    if os.path.exists(log):
        for line in open(log):
            if line.startswith("{"):
                break
            header.append(line.rstrip())
    tasks = sorted({k.split("@")[0] for row in curve for k in row["eval"]})
    final_len = info["curriculum"][-1]
    out = [
        "# longctx: a Llama trained for long-context retrieval with a ground truth",
        "",
        "Trained by `bench/train/train.py` (issue 23) on the synthetic tasks of `bench/train/sieve_tasks.py`;",
        "evaluated by `sieve eval --model hosts/sieve/models/longctx --task passkey|mqar|copy`.",
        "",
        f"- shape: {cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}, FFN {cfg['intermediate_size']}, "
        f"{cfg['num_attention_heads']} query / {cfg['num_key_value_heads']} KV heads of {cfg['head_dim']}, "
        f"vocabulary {cfg['vocab_size']}, RoPE theta {cfg['rope_theta']:g}, {cfg['max_position_embeddings']} positions",
        f"- training seed {info['train_seed']} (sieve eval refuses it), held-out curve seed {info['eval_seed']}",
        f"- {info['steps']} steps, {info['seconds']:.0f} s on {info['device']}, torch {info['torch']}, "
        f"curriculum {info['curriculum']}",
        f"- command: `{a.command}`",
    ]
    out += ["", "Call header (train.log):", "", "```"] + header + ["```", ""]
    def table(title, length_of):
        rows = [title, "", "| t (s) | step | stage length | " + " | ".join(tasks) + " |",
                "| --- | --- | --- | " + " | ".join("---" for _ in tasks) + " |"]
        for row in curve:
            cells = []
            for t in tasks:
                e = row["eval"].get(f"{t}@{length_of(row)}")
                cells.append(f"{e['accuracy']:.3f} / {e['exact']:.3f}" if e else "")
            rows.append(f"| {row['t']:.0f} | {row['step']} | {row['length']} | " + " | ".join(cells) + " |")
        return rows + [""]

    n = info["args"]["eval_instances"]
    out += table(f"Held-out accuracy at the stage's own length (graded tokens right / instances all right), "
                 f"{n} instances per task:", lambda row: row["length"])
    out += table(f"Held-out accuracy at {final_len} tokens, the same instances' kind:", lambda row: final_len)
    out += ["", "Arguments:", "", "```", json.dumps(info["args"], indent=1, sort_keys=True), "```", ""]
    with open(os.path.join(a.model_dir, "README.md"), "w") as f:
        f.write("\n".join(out))
    print("wrote", os.path.join(a.model_dir, "README.md"))


if __name__ == "__main__":
    main()
