#!/usr/bin/env python3
"""Train a small Llama on the long-context retrieval tasks (sieve_tasks.py) for a fixed wall-clock
budget, and save it for `sieve run/eval --model`.

Recipe (what a first try without it showed: 4 layers, d256, MQAR 8 pairs in 256 tokens, AdamW
3e-3 with no warmup stayed at chance for 3 minutes):
  - curriculum over lengths (--min-len 128, 256, ... --max-len 8192): a stage ends when every task's held-out
    exact-match accuracy at its length reaches --advance-acc, or at its deadline (a share of the
    budget), so the longest length always gets the last part of it;
  - passkey weighted up at first (the easiest retrieval: one marker, then an offset), the copy
    span and MQAR beside it (both need induction heads); after each held-out evaluation a task's
    share of the batch is 0.25 + (1 - its exact match), so the unsolved tasks get the steps;
  - the loss only on the graded answer tokens; a small vocabulary (256);
  - AdamW (peak 1.5e-3), linear warmup (--warmup-steps 300) then cosine to 10% over the
    wall-clock budget; bf16 autocast on CUDA; gradient clipping at 1;
  - no torch.compile: every curriculum length recompiles (tens of seconds each), more than it
    saves in a budget of minutes on a model this small.
Every --eval-seconds the model is graded on held-out instances (--eval-seed, never the training
seed) at the current and the final length; the curve goes to OUT/curve.jsonl (one JSON object a
line). OUT/ckpt.pt (+ ckpt_opt.pt, checkpoint.py) is written every --ckpt-minutes and at the end;
--resume CKPT continues from it (model, optimizer, stage, instance counters, step; the new call's
--minutes is its own budget).
At the end OUT/model/ holds config.json, model.safetensors and training.json (provenance).
"""
import argparse
import functools
import json
import math
import os
import platform
import queue
import sys
import threading
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checkpoint  # noqa: E402
import sieve_tasks as tasks  # noqa: E402
from llama import Config, Llama, save_for_sieve  # noqa: E402

DEFAULT_TRAIN_SEED = 20261127


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output directory (curve, checkpoint, model/)")
    p.add_argument("--minutes", type=float, required=True, help="wall-clock training budget of this call")
    p.add_argument("--resume", help="checkpoint to continue from")
    p.add_argument("--from-stage", type=int, default=-1,
                   help="with --resume: restart the curriculum at this stage (default: the checkpoint's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=DEFAULT_TRAIN_SEED, help="training instances' seed")
    p.add_argument("--eval-seed", type=int, default=2, help="held-out instances' seed (not --seed)")
    p.add_argument("--tasks", default="passkey,mqar,copy")
    p.add_argument("--min-len", type=int, default=128, help="first curriculum length")
    p.add_argument("--max-len", type=int, default=8192, help="last curriculum length (doubling from --min-len)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--max-positions", type=int, default=0,
                   help="max_position_embeddings of the saved config (0: --max-len)")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--lr", type=float, default=1.5e-3, help="peak learning rate")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=300)
    p.add_argument("--tokens-per-step", type=int, default=65536)
    p.add_argument("--advance-acc", type=float, default=0.9,
                   help="held-out exact-match accuracy of every task that ends a stage early")
    p.add_argument("--first-stage-share", type=float, default=0.4,
                   help="budget share the shortest length may take (where the induction mechanism is learnt)")
    p.add_argument("--last-stage-share", type=float, default=0.25,
                   help="budget share kept for the longest length (the middle stages' deadlines spread between)")
    p.add_argument("--eval-seconds", type=float, default=20.0,
                   help="held-out evaluation period (also when a stage may end early)")
    p.add_argument("--eval-instances", type=int, default=64)
    p.add_argument("--ckpt-minutes", type=float, default=2.0)
    p.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: the budget only)")
    a = p.parse_args(argv)
    a.tasks = a.tasks.split(",")
    for t in a.tasks:
        if t not in tasks.TASKS:
            p.error(f"unknown task {t!r}")
    if a.seed == a.eval_seed:
        p.error("--eval-seed must differ from --seed (held-out instances)")
    if a.min_len > a.max_len or any(a.min_len < tasks.min_length(t) for t in a.tasks):
        p.error("--min-len must fit every task and not exceed --max-len")
    return a


def curriculum(a):
    lengths, L = [], a.min_len
    while L < a.max_len:
        lengths.append(L)
        L *= 2
    lengths.append(a.max_len)
    n = len(lengths)
    # Deadlines (share of the budget) of every stage but the last: the first at --first-stage-share,
    # the middle ones evenly from there to 1 - --last-stage-share.
    first, last = a.first_stage_share, 1.0 - a.last_stage_share
    deadlines = [first + (last - first) * k / max(1, n - 2) for k in range(n - 1)] + [math.inf]
    return lengths, deadlines


def task_weights(a, stage, exact=None):
    """Each task's share of a batch: passkey twice the others until the first evaluation; then
    0.25 + (1 - held-out exact match at the stage's length), so the unsolved tasks get the batch."""
    if exact:
        w = {t: 0.25 + (1.0 - exact.get(t, 0.0)) for t in a.tasks}
    else:
        w = {t: (2.0 if (t == "passkey" and stage == 0) else 1.0) for t in a.tasks}
    s = sum(w.values())
    return {t: v / s for t, v in w.items()}


class Batches:
    """Training batches built on a background thread: {task: (tokens, scored)} per step."""

    def __init__(self, a, counters, pin):
        self.a, self.counters, self.pin = a, counters, pin
        self.q = queue.Queue(maxsize=3)
        self.length, self.stage, self.exact = None, None, None
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def set_weights(self, exact):
        with self.lock:
            self.exact = dict(exact)

    def set_stage(self, stage, length):
        with self.lock:
            self.stage, self.length = stage, length
        # Drop what was made for the previous length.
        while True:
            try:
                self.q.get_nowait()
            except queue.Empty:
                break

    def _make(self, stage, length, exact):
        per = max(len(self.a.tasks), self.a.tokens_per_step // length)
        out = {}
        for t, w in task_weights(self.a, stage, exact).items():
            b = max(1, round(per * w))
            start = self.counters[t]
            self.counters[t] += b
            tok, scored, _ = tasks.generate(t, length, self.a.seed, np.arange(start, start + b))
            # Where each graded token is predicted from (row, position - 1), found here on the
            # CPU so that the step needs no device-to-host synchronisation.
            rows, cols = np.nonzero(scored)
            parts = [torch.from_numpy(x) for x in (tok, rows, cols - 1)]
            out[t] = [p.pin_memory() for p in parts] if self.pin else parts
        return length, out

    def _run(self):
        while True:
            with self.lock:
                stage, length, exact = self.stage, self.length, self.exact
            if length is None:
                time.sleep(0.01)
                continue
            item = self._make(stage, length, exact)
            while True:
                with self.lock:
                    if self.length != length:
                        break
                try:
                    self.q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue

    def next(self, length):
        while True:
            L, item = self.q.get()
            if L == length:
                return item


def answer_loss(model, tokens, rows, cols, autocast):
    """Cross-entropy of the graded tokens tokens[rows, cols + 1], predicted at (rows, cols)."""
    with autocast():
        h = model.hidden(tokens[:, :-1])
        logits = model.lm_head(h[rows, cols])
    return F.cross_entropy(logits.float(), tokens[rows, cols + 1])


@functools.lru_cache(maxsize=None)
def held_out(task, length, seed, n):
    return tasks.generate(task, length, seed, np.arange(n))


@torch.no_grad()
def grade(model, task, length, seed, n, device, autocast, tokens_per_call):
    """Held-out accuracy: (fraction of graded tokens right, fraction of instances all right)."""
    tok, scored, _ = held_out(task, length, seed, n)
    right_tokens = total_tokens = right_inst = 0
    per = max(1, tokens_per_call // length)
    for s in range(0, n, per):
        t = torch.from_numpy(tok[s:s + per]).to(device)
        sc = torch.from_numpy(scored[s:s + per]).to(device)
        with autocast():
            h = model.hidden(t[:, :-1])
            pred = model.lm_head(h).argmax(-1)
        ok = (pred == t[:, 1:]) | ~sc[:, 1:]
        right_tokens += int((ok & sc[:, 1:]).sum())
        total_tokens += int(sc[:, 1:].sum())
        right_inst += int(ok.all(dim=1).sum())
    return right_tokens / total_tokens, right_inst / n


def lr_at(a, step, frac):
    warm = min(1.0, (step + 1) / max(1, a.warmup_steps))
    return a.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def main(argv=None):
    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    device = torch.device(a.device)
    torch.manual_seed(a.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

        def autocast():
            return torch.autocast("cuda", dtype=torch.bfloat16)
    else:
        import contextlib

        autocast = contextlib.nullcontext
    lengths, deadlines = curriculum(a)

    state = None
    if a.resume:
        state, opt_state = checkpoint.load(a.resume)
        cfg = Config(**state["config"])
    else:
        cfg = Config(vocab_size=tasks.VOCAB, dim=a.dim, n_layers=a.layers, n_heads=a.heads, n_kv_heads=a.kv_heads,
                     max_len=a.max_positions or a.max_len, rope_theta=a.rope_theta)
    model = Llama(cfg).to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and "embed" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.98), eps=1e-8)
    step, stage, counters, history = 0, 0, {t: 0 for t in a.tasks}, []
    if state:
        model.load_state_dict(state["model"])
        if opt_state is not None:
            opt.load_state_dict(opt_state)
        stage = min(state["stage"] if a.from_stage < 0 else a.from_stage, len(lengths) - 1)
        step = state["step"]
        counters.update(state["counters"])
        history = state.get("history", [])
        print(f"resumed {a.resume}: step {state['step']}, stage {stage}, {state['elapsed']:.0f} s trained before")
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters, {cfg.to_dict()}; device {device}; "
          f"curriculum {lengths}", flush=True)

    budget = a.minutes * 60.0
    batches = Batches(a, counters, pin=device.type == "cuda")
    batches.set_stage(stage, lengths[stage])
    curve = open(os.path.join(a.out, "curve.jsonl"), "a")
    t0 = time.time()
    last_eval = last_ckpt = t0
    loss_sum, loss_n, tokens_seen = 0.0, 0, 0
    prior = state["elapsed"] if state else 0.0

    def evaluate(now, final=False):
        row = {"t": round(now - t0 + prior, 1), "step": step, "stage": stage, "length": lengths[stage],
               "lr": lr_at(a, step, (now - t0) / budget), "loss": float(loss_sum) / max(1, loss_n),
               "tokens_per_s": tokens_seen / max(1e-9, now - t0), "eval": {}}
        model.eval()
        for L in sorted({lengths[stage], lengths[-1]}):
            for t in a.tasks:
                acc, exact = grade(model, t, L, a.eval_seed, a.eval_instances, device, autocast, a.tokens_per_step)
                row["eval"][f"{t}@{L}"] = {"accuracy": round(acc, 4), "exact": round(exact, 4)}
        model.train()
        row["final"] = final
        curve.write(json.dumps(row) + "\n")
        curve.flush()
        history.append(row)
        print(json.dumps(row), flush=True)
        return row

    def save_checkpoint(now):
        checkpoint.save(os.path.join(a.out, "ckpt.pt"), model, opt,
                        {"config": cfg.to_dict(), "step": step, "stage": stage, "counters": dict(counters),
                         "elapsed": now - t0 + prior, "args": vars(a), "history": history})

    model.train()
    while True:
        now = time.time()
        frac = (now - t0) / budget
        if frac >= 1.0 or (a.max_steps and step >= a.max_steps):
            break
        if now - last_eval >= a.eval_seconds:
            row = evaluate(now)
            last_eval = time.time()
            loss_sum, loss_n = 0.0, 0
            L = lengths[stage]
            exact = {t: row["eval"][f"{t}@{L}"]["exact"] for t in a.tasks}
            batches.set_weights(exact)
            if stage < len(lengths) - 1 and all(e >= a.advance_acc for e in exact.values()):
                stage += 1
                batches.set_stage(stage, lengths[stage])
        if stage < len(lengths) - 1 and frac >= deadlines[stage]:
            stage += 1
            batches.set_stage(stage, lengths[stage])
        lr = lr_at(a, step, frac)
        for g in opt.param_groups:
            g["lr"] = lr
        item = batches.next(lengths[stage])
        n_scored = sum(len(rows) for _, rows, _ in item.values())
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for tok, rows, cols in item.values():
            graded = len(rows)
            tok, rows, cols = (x.to(device, non_blocking=True) for x in (tok, rows, cols))
            # Weighted by graded tokens, so every answer token counts the same whatever its task.
            loss = answer_loss(model, tok, rows, cols, autocast) * (graded / n_scored)
            loss.backward()
            total = total + loss.detach()  # a device scalar: read only when logged
            tokens_seen += tok.numel()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        loss_sum = loss_sum + total
        loss_n += 1
        if time.time() - last_ckpt >= a.ckpt_minutes * 60:
            save_checkpoint(time.time())
            last_ckpt = time.time()

    end = time.time()
    row = evaluate(end, final=True)
    save_checkpoint(end)
    model_dir = os.path.join(a.out, "model")
    save_for_sieve(model, model_dir, {"format": "pt", "sieve_train_seed": a.seed})
    with open(os.path.join(model_dir, "training.json"), "w") as f:
        json.dump({"train_seed": a.seed, "eval_seed": a.eval_seed, "steps": step, "stage": stage,
                   "curriculum": lengths, "seconds": row["t"], "device": device_description(device),
                   "torch": torch.__version__, "python": platform.python_version(),
                   "args": vars(a), "final_eval": row["eval"]}, f, indent=2)
        f.write("\n")
    print(f"saved {model_dir} after {step} steps, {row['t']:.0f} s", flush=True)


def device_description(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


if __name__ == "__main__":
    main()
