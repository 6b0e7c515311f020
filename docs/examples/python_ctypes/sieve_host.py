#!/usr/bin/env python3
"""Drive the Sieve runtime from Python through ctypes and the C host API (sieve/host.h) alone.

    python3 sieve_host.py <prefix>/lib/libsieve_runtime.so [--plugin-dir DIR] [--chain SPEC]

Lists the plugins, builds a session for a small 1-layer geometry with the chain, prefills one
sequence of 20 random tokens and decodes 4 more, and checks every output against a plain Python
softmax attention over the same keys (the dense chain must match it; any chain must be finite).
No numpy needed. Exit status 0 on success. Run by the SDK test (tests/sdk) against the install.
"""
import ctypes as C
import math
import random
import sys

HQ, HKV, D, PAGE = 4, 2, 8, 16
PREFILL, DECODE = 1, 2


class Header(C.Structure):
    _fields_ = [("struct_size", C.c_uint32), ("version", C.c_uint32)]


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32), ("dtype", DLDataType),
                ("shape", C.POINTER(C.c_int64)), ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class Geometry(C.Structure):
    _fields_ = [("hdr", Header), ("n_layers", C.c_int32), ("n_q_heads", C.c_int32), ("n_kv_heads", C.c_int32),
                ("head_dim", C.c_int32), ("page_size", C.c_int32), ("max_batch", C.c_int32),
                ("max_seq_len", C.c_int32), ("kv_dtype", DLDataType), ("device", DLDevice),
                ("rope_theta", C.c_float), ("rope_dim", C.c_int32)]


class PluginInfo(C.Structure):
    _fields_ = [("hdr", Header), ("name", C.c_char_p), ("path", C.c_char_p), ("abi_major", C.c_uint32),
                ("abi_minor", C.c_uint32), ("descriptor", C.c_void_p), ("params", C.c_void_p),
                ("n_params", C.c_uint32), ("params_stride", C.c_uint32)]


class LayerInputs(C.Structure):
    _fields_ = [("hdr", Header), ("layer", C.c_int32), ("phase", C.c_uint32), ("batch", C.c_int32),
                ("seq_ids", C.POINTER(C.c_int32)), ("qo_indptr", C.POINTER(C.c_int32)),
                ("positions", C.POINTER(C.c_int32)), ("q", C.POINTER(DLTensor)), ("k", C.POINTER(DLTensor)),
                ("v", C.POINTER(DLTensor)), ("q_pre_rope", C.POINTER(DLTensor)),
                ("k_pre_rope", C.POINTER(DLTensor))]


def header(struct):
    return Header(C.sizeof(struct), 0)


def tensor(values, rows, heads):
    buf = (C.c_float * len(values))(*values)
    shape = (C.c_int64 * 3)(rows, heads, D)
    t = DLTensor(C.cast(buf, C.c_void_p), DLDevice(1, 0), 3, DLDataType(2, 32, 1), shape, None, 0)
    t._keep = (buf, shape)  # the buffers live as long as the tensor
    return t, buf


def main(argv):
    lib = C.CDLL(argv[1])
    plugin_dirs = [argv[i + 1] for i, a in enumerate(argv) if a == "--plugin-dir"]
    chain_text = next((argv[i + 1] for i, a in enumerate(argv) if a == "--chain"), None)
    lib.sieve_runtime_last_error.restype = C.c_char_p
    lib.sieve_session_last_error.restype = C.c_char_p
    lib.sieve_chain_text.restype = C.c_char_p
    lib.sieve_host_api_version.restype = C.c_uint32
    if lib.sieve_host_api_version() >> 16 != 1:
        sys.exit("host API major %d, this script speaks 1" % (lib.sieve_host_api_version() >> 16))

    rt = C.c_void_p()
    assert lib.sieve_runtime_create(None, C.byref(rt)) == 0
    def check(status, what):
        if status != 0:
            sys.exit("%s: status %d: %s" % (what, status, lib.sieve_runtime_last_error(rt).decode()))
    for d in plugin_dirs:
        check(lib.sieve_runtime_add_plugin_dir(rt, d.encode()), "add_plugin_dir")
    n = C.c_uint32()
    check(lib.sieve_runtime_plugin_count(rt, C.byref(n)), "plugin_count")
    for i in range(n.value):
        info = PluginInfo(header(PluginInfo))
        check(lib.sieve_runtime_plugin_info(rt, i, C.byref(info)), "plugin_info")
        print("plugin %-18s ABI %d.%d, %d parameter(s)" % (info.name.decode(), info.abi_major, info.abi_minor,
                                                           info.n_params))

    chain = C.c_void_p()
    if chain_text:
        check(lib.sieve_chain_parse(rt, chain_text.encode(), C.byref(chain)), "chain_parse")
        print("chain", lib.sieve_chain_text(chain).decode())
    g = Geometry(header(Geometry), 1, HQ, HKV, D, PAGE, 1, 64, DLDataType(2, 32, 1), DLDevice(1, 0), 10000.0, D)
    session = C.c_void_p()
    check(lib.sieve_session_create(rt, C.byref(g), chain if chain_text else None, None, C.byref(session)),
          "session_create")
    lib.sieve_chain_destroy(chain)
    seq = C.c_int32()
    assert lib.sieve_session_add_sequence(session, C.byref(seq)) == 0

    rng = random.Random(5)
    keys, values, worst, dense_like = [], [], 0.0, chain_text is None or "dense" in chain_text
    for step, n_new in enumerate([20, 1, 1, 1, 1]):
        q = [rng.uniform(-1, 1) for _ in range(n_new * HQ * D)]
        k = [rng.uniform(-1, 1) for _ in range(n_new * HKV * D)]
        v = [rng.uniform(-1, 1) for _ in range(n_new * HKV * D)]
        tq, _ = tensor(q, n_new, HQ)
        tk, _ = tensor(k, n_new, HKV)
        tv, _ = tensor(v, n_new, HKV)
        to, out = tensor([float("nan")] * (n_new * HQ * D), n_new, HQ)
        qo = (C.c_int32 * 2)(0, n_new)
        phase = PREFILL if step == 0 else DECODE
        inputs = LayerInputs(header(LayerInputs), 0, phase, 1, C.pointer(seq), qo, None, C.pointer(tq),
                             C.pointer(tk), C.pointer(tv), None, None)
        if lib.sieve_session_attend(session, C.byref(inputs), C.byref(to)) != 0:
            sys.exit("attend: " + lib.sieve_session_last_error(session).decode())
        assert lib.sieve_session_end_step(session, phase, C.byref(seq), 1) == 0
        base = len(keys)
        for t in range(n_new):
            keys.append(k[t * HKV * D:(t + 1) * HKV * D])
            values.append(v[t * HKV * D:(t + 1) * HKV * D])
        # Plain causal attention, head h reads KV head h // (HQ // HKV).
        for t in range(n_new):
            for h in range(HQ):
                kvh, qv = h // (HQ // HKV), q[(t * HQ + h) * D:(t * HQ + h + 1) * D]
                logits = [sum(a * b for a, b in zip(qv, keys[j][kvh * D:(kvh + 1) * D])) / math.sqrt(D)
                          for j in range(base + t + 1)]
                m = max(logits)
                w = [math.exp(x - m) for x in logits]
                ref = [sum(w[j] * values[j][kvh * D + d] for j in range(len(w))) / sum(w) for d in range(D)]
                got = out[(t * HQ + h) * D:(t * HQ + h + 1) * D]
                if not all(math.isfinite(x) for x in got):
                    sys.exit("non-finite output at step %d" % step)
                worst = max(worst, max(abs(a - b) for a, b in zip(got, ref)))
    print("max |out - python reference| = %.3e over %d tokens" % (worst, len(keys)))
    lib.sieve_session_destroy(session)
    lib.sieve_runtime_destroy(rt)
    if dense_like and worst > 1e-4:
        sys.exit("dense attention differs from the reference")
    print("PASS")


if __name__ == "__main__":
    main(sys.argv)
