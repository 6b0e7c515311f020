"""Record the calls a sieve.Session receives and replay them from C++ (replay/session_replay.cpp,
built as sieve_session_replay): the same calls on the same bytes, made without Python, ctypes
or DLPack, through the C host API of the same runtime.

    with Recording() as rec:          # records every Session's attend / end_step
        ... drive sessions (directly, or through sieve.transformers) ...
    outs = rec.replay(rec.sessions[0], tmpdir)   # the C++ outputs, one array per attend, as numpy
"""
import json
import os
import subprocess

import numpy as np

import sieve
from sieve import session as _session

_NAMES = {(2, 32): "float32", (2, 16): "float16", (4, 16): "bfloat16"}


def _bytes(t):
    """Raw bytes of a numpy array or a torch tensor (any device, bf16 included)."""
    if hasattr(t, "detach"):
        t = t.detach().cpu().contiguous()
        return t.view(-1).view(__import__("torch").uint8).numpy().tobytes() if t.numel() else b""
    return np.ascontiguousarray(t).tobytes()


def as_float32(raw, dtype, shape):
    """Bytes of `dtype` as a float32 array of `shape` (bf16: the top half of an f32)."""
    if dtype == "float32":
        return np.frombuffer(raw, np.float32).reshape(shape)
    if dtype == "float16":
        return np.frombuffer(raw, np.float16).astype(np.float32).reshape(shape)
    return (np.frombuffer(raw, np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)


class Recording:
    def __init__(self):
        self.sessions = []  # one dict per Session created while recording

    def __enter__(self):
        rec = self
        self._init, self._attend, self._end = _session.Session.__init__, _session.Session.attend, _session.Session.end_step

        def init(s, runtime, **kw):
            rec._init(s, runtime, **kw)
            g = s.geometry
            s._trace = {"geometry": dict(n_layers=g.n_layers, n_q_heads=g.n_q_heads, n_kv_heads=g.n_kv_heads,
                                         head_dim=g.head_dim, page_size=g.page_size, max_batch=g.max_batch,
                                         max_seq_len=g.max_seq_len, rope_theta=g.rope_theta, rope_dim=g.rope_dim,
                                         dtype=_NAMES[(g.kv_dtype.code, g.kv_dtype.bits)],
                                         device_type=g.device.device_type, device_id=g.device.device_id),
                        "chain": s.chain, "check": int(kw.get("check_outputs", True)), "sequences": 0,
                        "calls": [], "data": bytearray(), "outs": [], "ids": {}}
            rec.sessions.append(s._trace)

        def add_sequence(s, _orig=_session.Session.add_sequence):
            i = _orig(s)
            s._trace["ids"][i] = s._trace["sequences"]
            s._trace["sequences"] += 1
            return i

        def attend(s, layer, phase, q, k, v, out, seq_ids, qo_indptr=None, positions=None, **kw):
            result = rec._attend(s, layer, phase, q, k, v, out, seq_ids, qo_indptr=qo_indptr, positions=positions, **kw)
            t = s._trace
            ids = [seq_ids] if isinstance(seq_ids, int) else list(seq_ids)
            t["calls"].append(dict(op="attend", layer=layer, phase=_session.PHASES[phase],
                                   seq=[t["ids"][i] for i in ids], qo=list(s._qo[:len(ids) + 1]),
                                   positions=None if positions is None else [int(p) for p in positions],
                                   offset=len(t["data"])))
            for x in (q, k, v):
                t["data"] += _bytes(x)
            t["outs"].append(_bytes(out))
            return result

        def end_step(s, phase, seq_ids):
            rec._end(s, phase, seq_ids)
            ids = [seq_ids] if isinstance(seq_ids, int) else list(seq_ids)
            s._trace["calls"].append(dict(op="end_step", phase=_session.PHASES[phase],
                                          seq=[s._trace["ids"][i] for i in ids]))

        self._add = _session.Session.add_sequence
        _session.Session.__init__, _session.Session.attend, _session.Session.end_step = init, attend, end_step
        _session.Session.add_sequence = add_sequence
        return self

    def __exit__(self, *exc):
        _session.Session.__init__, _session.Session.attend, _session.Session.end_step = self._init, self._attend, self._end
        _session.Session.add_sequence = self._add

    @staticmethod
    def replay(trace, directory):
        """Run `trace` through sieve_session_replay; returns (python outputs, C++ outputs) as float32
        arrays, one pair per attend call."""
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "trace.json"), "w") as f:
            json.dump({k: v for k, v in trace.items() if k not in ("data", "outs", "ids")}, f)
        with open(os.path.join(directory, "data.bin"), "wb") as f:
            f.write(trace["data"])
        tool = os.path.join(os.environ.get("SIEVE_TEST_BIN_DIR", ""), "sieve_session_replay")
        plugins = os.environ.get("SIEVE_TEST_PLUGIN_DIR", "")
        done = subprocess.run([tool, directory, plugins], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        with open(os.path.join(directory, "out.bin"), "rb") as f:
            cpp = f.read()
        g, at, pairs = trace["geometry"], 0, []
        for call, mine in zip((c for c in trace["calls"] if c["op"] == "attend"), trace["outs"]):
            shape = (call["qo"][-1], g["n_q_heads"], g["head_dim"])
            pairs.append((as_float32(mine, g["dtype"], shape), as_float32(cpp[at:at + len(mine)], g["dtype"], shape)))
            at += len(mine)
        assert at == len(cpp), "the C++ replay wrote %d bytes, the trace has %d" % (len(cpp), at)
        return pairs


def tool_available():
    return os.path.exists(os.path.join(os.environ.get("SIEVE_TEST_BIN_DIR", ""), "sieve_session_replay"))


__all__ = ["Recording", "as_float32", "tool_available", "sieve"]
