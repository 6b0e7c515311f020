"""The training script's pieces on the CPU at a tiny size: the task instances are what their
layout says, the training loop runs, checkpoints and resumes, and the saved model is the torch
model (read back from its safetensors file; with SIEVE_BIN set, Sieve's host loads it and its
instances and logits are the torch side's).

    /usr/bin/python3 -m pytest bench/train/test_train.py      (ctest: train_script)
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sieve_tasks as tasks  # noqa: E402
from llama import Config, Llama, save_for_sieve  # noqa: E402

SIEVE = os.environ.get("SIEVE_BIN")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[b:end], dtype="<f4").copy()).view(e["shape"])
    return out


@pytest.mark.parametrize("length", [64, 300, 1024])
def test_passkey_layout(length):
    tok, scored, prompt = tasks.generate("passkey", length, 5, np.arange(20))
    assert tok.shape == (20, length) and prompt == length - 5
    for row, sc in zip(tok, scored):
        assert row[0] == tasks.BOS and row[length - 6] == tasks.QUERY
        (p,) = np.nonzero(row == tasks.KEY)[0]
        assert list(row[p + 1:p + 6]) == list(row[length - 5:])  # the answer is the planted passkey
        assert all(tasks.DIGIT0 <= d < tasks.DIGIT0 + 10 for d in row[length - 5:])
        assert list(np.nonzero(sc)[0]) == list(range(length - 5, length))
        others = np.delete(row, list(range(p, p + 6)) + [0, length - 6] + list(range(length - 5, length)))
        assert ((others >= tasks.FILLER0) & (others < tasks.FILLER0 + tasks.N_FILLER)).all()


@pytest.mark.parametrize("length", [64, 512, 2048])
def test_mqar_layout(length):
    m = tasks.mqar_pairs(length)
    tok, scored, prompt = tasks.generate("mqar", length, 5, np.arange(10))
    assert prompt == length - 2 * m + 1
    for row, sc in zip(tok, scored):
        ctx = row[:length - 2 * m - 1]
        pairs = {}
        for i in np.nonzero((ctx >= tasks.KEY0) & (ctx < tasks.KEY0 + tasks.N_KEYS))[0]:
            assert ctx[i] not in pairs  # distinct keys
            pairs[ctx[i]] = ctx[i + 1]
        assert len(pairs) == m and row[length - 2 * m - 1] == tasks.SEP
        queries = row[length - 2 * m:]
        assert sorted(queries[0::2]) == sorted(pairs)  # every pair queried once
        for k, v in zip(queries[0::2], queries[1::2]):
            assert pairs[k] == v and tasks.VALUE0 <= v < tasks.VALUE0 + tasks.N_VALUES
        assert list(np.nonzero(sc)[0]) == list(range(length - 2 * m + 1, length, 2))


def test_copy_layout():
    S = tasks.COPY_SPAN
    tok, scored, prompt = tasks.generate("copy", 200, 9, np.arange(10))
    assert prompt == 200 - S + 1
    for row in tok:
        span = row[200 - S:]
        assert len(set(span)) == S and row[200 - S - 1] == tasks.COPY
        starts = [i for i in range(1, 200 - 2 * S) if list(row[i:i + S]) == list(span)]
        assert len(starts) == 1


def test_instances_depend_on_seed_and_index_only():
    a, _, _ = tasks.generate("mqar", 256, 3, np.arange(8))
    b, _, _ = tasks.generate("mqar", 256, 3, np.array([5, 6, 7]))
    c, _, _ = tasks.generate("mqar", 256, 4, np.arange(8))
    assert (a[5:] == b).all()  # instance 5 is the same whether drawn alone or in a batch
    assert (a != c).any()
    with pytest.raises(ValueError):
        tasks.generate("mqar", 32, 3, np.arange(1))
    with pytest.raises(ValueError):
        tasks.generate("sorting", 256, 3, np.arange(1))


def tiny_args(out, *extra):
    return ["--out", str(out), "--minutes", "5", "--device", "cpu", "--dim", "128", "--heads", "2",
            "--kv-heads", "1", "--layers", "2", "--min-len", "64", "--max-len", "128", "--tokens-per-step", "1024",
            "--eval-seconds", "1000", "--eval-instances", "8", "--warmup-steps", "2", *extra]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    import train

    out = tmp_path_factory.mktemp("train")
    train.main(tiny_args(out, "--max-steps", "6", "--max-positions", "4096"))
    return out


def test_training_writes_model_checkpoint_and_curve(trained):
    rows = [json.loads(line) for line in open(trained / "curve.jsonl")]
    assert rows[-1]["final"] and rows[-1]["step"] == 6
    for key in ("passkey@128", "mqar@128", "copy@128"):
        assert 0.0 <= rows[-1]["eval"][key]["accuracy"] <= 1.0
    info = json.load(open(trained / "model" / "training.json"))
    assert info["train_seed"] != info["eval_seed"] and info["steps"] == 6
    cfg = json.load(open(trained / "model" / "config.json"))
    assert cfg["max_position_embeddings"] == 4096 and cfg["head_dim"] == 64


def test_resume_continues_the_run(trained, tmp_path):
    import train

    # Evaluating before every step also runs the re-weighting of the tasks from the held-out curve.
    train.main(tiny_args(tmp_path, "--max-steps", "8", "--resume", str(trained / "ckpt.pt"), "--eval-seconds", "0"))
    rows = [json.loads(line) for line in open(tmp_path / "curve.jsonl")]
    assert [r["step"] for r in rows] == [6, 7, 8]  # 6 steps restored, 2 more
    assert rows[0]["length"] == 64 and rows[-1]["length"] == 64  # the checkpoint's stage


def test_resume_can_restart_the_curriculum(trained, tmp_path):
    import train

    train.main(tiny_args(tmp_path, "--max-steps", "7", "--resume", str(trained / "ckpt.pt"), "--from-stage", "1"))
    rows = [json.loads(line) for line in open(tmp_path / "curve.jsonl")]
    assert rows[-1]["step"] == 7 and rows[-1]["length"] == 128


def test_unsolved_tasks_get_the_batch():
    import train

    a = train.parse_args(["--out", "x", "--minutes", "1"])
    assert train.task_weights(a, 0) == {"passkey": 0.5, "mqar": 0.25, "copy": 0.25}
    assert train.task_weights(a, 1) == {"passkey": 1 / 3, "mqar": 1 / 3, "copy": 1 / 3}
    w = train.task_weights(a, 0, {"passkey": 1.0, "mqar": 0.0, "copy": 0.5})
    assert w == pytest.approx({"passkey": 0.25 / 2.25, "mqar": 1.25 / 2.25, "copy": 0.75 / 2.25})


def test_saved_file_is_the_torch_model(trained):
    """The safetensors file holds the parameters under transformers' names, bit for bit."""
    import checkpoint

    meta, _ = checkpoint.load(str(trained / "ckpt.pt"))
    model = Llama(Config(**meta["config"]))
    model.load_state_dict(meta["model"])
    saved = read_safetensors(trained / "model" / "model.safetensors")
    assert set(saved) == set(model.hf_state_dict())
    for name, t in model.hf_state_dict().items():
        assert torch.equal(saved[name], t), name


needs_sieve = pytest.mark.skipif(not SIEVE, reason="SIEVE_BIN not set (ctest train_script sets it)")


@needs_sieve
@pytest.mark.parametrize("task,length,seed", [("passkey", 16, 1), ("passkey", 777, 2**62 + 5), ("mqar", 64, 0),
                                              ("mqar", 4096, 12345), ("copy", 48, 3), ("copy", 2000, 99)])
def test_sieve_generates_the_same_instances(task, length, seed):
    out = subprocess.run([SIEVE, "eval", "--task", task, "--length", str(length), "--seed", str(seed),
                          "--instances", "4", "--dump-instances"], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout)["instances"]
    tok, scored, prompt = tasks.generate(task, length, seed, np.arange(4))
    for g, t, s in zip(got, tok, scored):
        assert g["prompt"] == t[:prompt].tolist()
        assert g["continuation"] == t[prompt:].tolist()
        assert g["scored"] == s[prompt:].astype(int).tolist()


@needs_sieve
def test_sieve_loads_the_model_and_gives_its_logits(trained, tmp_path):
    """Sieve's host loads the saved model; its logits are the torch model's (f32 on both sides;
    the bound is derived in Forward.MatchesTrainedModelLogits)."""
    import checkpoint
    import shutil

    meta, _ = checkpoint.load(str(trained / "ckpt.pt"))
    model = Llama(Config(**meta["config"]))
    model.load_state_dict(meta["model"])
    model.eval()
    ref = tmp_path / "model"
    shutil.copytree(trained / "model", ref)
    tok, _, _ = tasks.generate("passkey", 16, 77, np.arange(1))
    with torch.no_grad():
        logits = model(torch.from_numpy(tok))[0]
    json.dump({"tokens": tok[0].tolist(), "logits": logits.tolist()}, open(ref / "reference.json", "w"))
    test_bin = os.environ["SIEVE_TEST_MODEL_BIN"]
    run = subprocess.run([test_bin, "--gtest_filter=Forward.MatchesTrainedModelLogits"], capture_output=True,
                         text=True, env=dict(os.environ, SIEVE_TRAINED_REFERENCE_DIR=str(ref)))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "[  PASSED  ] 1 test" in run.stdout and "SKIPPED" not in run.stdout, run.stdout

    # And `sieve eval --task` runs it: dense attention as the chain predicts exactly what dense does.
    out = subprocess.run([SIEVE, "eval", "--model", str(trained / "model"), "--task", "passkey", "--length", "128",
                          "--instances", "3", "--seed", "5", "--chain", "dense", "--json"],
                         capture_output=True, text=True, check=True)
    j = json.loads(out.stdout)["task"]
    assert j["dense"] == j["chain"] and j["dense"]["graded"] == 15
    refused = subprocess.run([SIEVE, "eval", "--model", str(trained / "model"), "--task", "passkey", "--seed",
                              str(json.load(open(trained / "model" / "training.json"))["train_seed"])],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "training seed" in refused.stderr


COMMITTED = os.path.join(HERE, "..", "..", "hosts", "sieve", "models", "longctx")


@needs_sieve
@pytest.mark.skipif(not os.path.exists(os.path.join(COMMITTED, "config.json")), reason="no committed model")
def test_committed_model_gives_the_torch_logits(tmp_path):
    """The committed model, read back into the torch Llama from its own files, and Sieve's host
    give the same logits on a passkey instance (the bound of Forward.MatchesTrainedModelLogits)."""
    import shutil

    cfg = json.load(open(os.path.join(COMMITTED, "config.json")))
    model = Llama(Config(vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"],
                         n_heads=cfg["num_attention_heads"], n_kv_heads=cfg["num_key_value_heads"],
                         hidden_dim=cfg["intermediate_size"], max_len=cfg["max_position_embeddings"],
                         rope_theta=cfg["rope_theta"], norm_eps=cfg["rms_norm_eps"]))
    saved = read_safetensors(os.path.join(COMMITTED, "model.safetensors"))
    model.load_state_dict({k[len("model."):] if k.startswith("model.") else k: v for k, v in saved.items()})
    model.eval()
    ref = tmp_path / "model"
    ref.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(os.path.join(COMMITTED, f), ref / f)
    tok, _, _ = tasks.generate("passkey", 256, 1000, np.arange(1))  # its shortest trained length
    with torch.no_grad():
        logits = model(torch.from_numpy(tok))[0]
    assert int(logits[-6:-1].argmax(-1).eq(torch.from_numpy(tok[0, -5:])).sum()) == 5  # it knows the answer
    json.dump({"tokens": tok[0].tolist(), "logits": logits.tolist()}, open(ref / "reference.json", "w"))
    run = subprocess.run([os.environ["SIEVE_TEST_MODEL_BIN"], "--gtest_filter=Forward.MatchesTrainedModelLogits"],
                         capture_output=True, text=True, env=dict(os.environ, SIEVE_TRAINED_REFERENCE_DIR=str(ref)))
    assert run.returncode == 0 and "[  PASSED  ] 1 test" in run.stdout, run.stdout + run.stderr
