"""The binding on the CPU with numpy: listing, chains, sessions, every error as a SieveError with
the runtime's message, and a dense session equal to the float64 reference."""
import numpy as np
import pytest

import sieve
from reference import attention, f32_bound

HQ, HKV, D = 8, 2, 64


def session(runtime, chain=None, layers=2, max_batch=2, max_seq_len=128, **kw):
    return sieve.Session(runtime, n_layers=layers, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D, max_batch=max_batch,
                         max_seq_len=max_seq_len, chain=chain, **kw)


def rand(rng, *shape):
    return rng.uniform(-1, 1, size=shape).astype(np.float32)


def test_library_speaks_host_api_1_2():
    assert sieve.HOST_API_MAJOR == 1 and sieve.HOST_API_MINOR >= 2
    assert sieve.library_path().endswith(".so.0")


def test_plugins_carry_their_schemas(runtime):
    plugins = {p.name: p for p in runtime.plugins()}
    assert {"dense", "streaming", "quest", "raas", "paged"} <= set(plugins)
    quest = plugins["quest"]
    assert quest.policy and not quest.builtin and quest.path.endswith(".so") and quest.summary
    budget = {p.name: p for p in quest.params}["token_budget"]
    assert (budget.type, budget.default, budget.min) == ("int", "1024", 1)
    paged = plugins["paged"]
    assert paged.kv_store and paged.builtin and paged.path == "built-in" and not paged.policy
    assert runtime.failures() == []
    probed = sieve.Runtime(plugin_dirs=[p.path.rsplit("/", 1)[0] for p in runtime.plugins() if p.name == "dense"],
                           use_env=False, use_default_dirs=False, probe=True)
    assert [p.name for p in probed.plugins()] == [p.name for p in runtime.plugins()]


def test_chain_text_is_normalised_and_syntax_errors_raise(runtime):
    assert runtime.chain("decode:2-=quest(token_budget=64)").text == "decode:2-=quest(token_budget=64)"
    with pytest.raises(sieve.SieveError) as e:
        runtime.chain("decode:=quest(")
    assert e.value.status_name == "invalid argument"
    assert str(e.value) == "chain spec, col 8: expected layers ('*', N, N-M or N-), found '='"
    with pytest.raises(sieve.SieveError, match="nosuchfile.chain"):
        runtime.chain(file="/nonexistent/nosuchfile.chain")


def test_session_create_errors_carry_the_runtime_message(runtime):
    with pytest.raises(sieve.SieveError, match="nosuch"):
        session(runtime, chain="decode:*=nosuch()")
    with pytest.raises(sieve.SieveError, match="token_budget"):
        session(runtime, chain="decode:*=quest(token_budget=-3)")
    with pytest.raises(sieve.SieveError, match="n_q_heads a multiple of n_kv_heads"):
        sieve.Session(runtime, n_layers=1, n_q_heads=6, n_kv_heads=4, head_dim=D, max_seq_len=16)
    with pytest.raises(ValueError, match="kv_dtype 'int8'"):
        session(runtime, kv_dtype="int8")
    with pytest.raises(ValueError, match="device 'tpu'"):
        session(runtime, device="tpu")
    # Host API 1.2's field: seen by the runtime only if this mirror's layout is right.
    with pytest.raises(sieve.SieveError) as e:
        session(runtime, cuda_stream=1234)
    assert str(e.value) == "a CUDA stream was given for a session on cpu"
    with session(runtime, kv_store="paged") as s:
        assert s.kv_store == "paged" and s.cuda_stream is None and s.chain == ""
    with session(runtime, chain="decode:*=quest(token_budget=64)") as s:
        assert s.chain == "decode:*=quest(token_budget=64)"


def test_attend_errors_carry_the_runtime_message(runtime):
    rng = np.random.default_rng(1)
    s = session(runtime)
    seq = s.add_sequence()
    q, k, v, out = rand(rng, 5, HQ, D), rand(rng, 5, HKV, D), rand(rng, 5, HKV, D), np.empty((5, HQ, D), np.float32)
    with pytest.raises(sieve.SieveError, match=r"q must have shape \[5, 8, 64\]"):
        s.attend(0, "prefill", q[:, :4], k, v, out, seq)
    with pytest.raises(sieve.SieveError, match="k must be compact row-major"):
        s.attend(0, "prefill", q, np.ascontiguousarray(k.transpose(1, 0, 2)).transpose(1, 0, 2), v, out, seq)
    with pytest.raises(sieve.SieveError, match="v must be f32, f16 or bf16"):
        s.attend(0, "prefill", q, k, v.astype(np.float64), out, seq)
    with pytest.raises(sieve.SieveError, match="sequence id 99 was not added"):
        s.attend(0, "prefill", q, k, v, out, 99)
    with pytest.raises(sieve.SieveError, match=r"decode takes exactly 1"):
        s.attend(0, "decode", q[:2], k[:2], v[:2], out[:2], seq, qo_indptr=[0, 2])
    with pytest.raises(sieve.SieveError, match=r"layer 7 is outside \[0, 2\)"):
        s.attend(7, "prefill", q, k, v, out, seq)
    with pytest.raises(ValueError, match="phase 'both'"):
        s.attend(0, "both", q, k, v, out, seq)
    with pytest.raises(ValueError, match="3 sequences in one call, the session's max_batch is 2"):
        s.attend(0, "decode", q[:3], k[:3], v[:3], out[:3], [seq, seq, seq])
    with pytest.raises(TypeError, match="list is not a DLPack tensor"):
        s.attend(0, "prefill", q.tolist(), k, v, out, seq)
    with pytest.raises(sieve.SieveError, match="sequence id 42"):
        s.remove_sequence(42)
    assert s.seq_len(0, seq) == 0  # nothing of the failed calls reached the cache


def test_dense_session_equals_the_reference_and_writes_in_place(runtime):
    """Two layers, two ragged sequences (prefill 9 and 4 tokens in one call), then 5 decode steps."""
    rng = np.random.default_rng(7)
    s = session(runtime)
    seqs = [s.add_sequence(), s.add_sequence()]
    lens = [9, 4]
    keys = {(l, b): [] for l in range(2) for b in range(2)}
    vals = {(l, b): [] for l in range(2) for b in range(2)}
    before = s.kv_bytes
    for step in range(6):
        phase = "prefill" if step == 0 else "decode"
        n = lens if step == 0 else [1, 1]
        qo = np.concatenate([[0], np.cumsum(n)])
        for layer in range(2):
            # q as a view into a larger buffer: DLPack hands the view's own address, no copy.
            big = rand(rng, qo[-1] + 3, HQ, D)
            q, k, v = big[3:], rand(rng, qo[-1], HKV, D), rand(rng, qo[-1], HKV, D)
            out = np.full((qo[-1], HQ, D), np.nan, np.float32)
            assert s.attend(layer, phase, q, k, v, out, seqs, qo_indptr=qo) is out
            for b in range(2):
                rows = slice(qo[b], qo[b + 1])
                keys[layer, b].extend(k[rows]), vals[layer, b].extend(v[rows])
                kk, vv = np.array(keys[layer, b]), np.array(vals[layer, b])
                pos = list(range(len(kk) - n[b], len(kk)))
                ref = attention(q[rows], kk, vv, pos)
                err = np.abs(out[rows] - ref).max()
                assert err <= f32_bound(q[rows], kk, vv, len(kk)), (step, layer, b, err)
        s.end_step(phase, seqs)
    assert [s.seq_len(1, q) for q in seqs] == [14, 9]
    assert s.kv_bytes > before


def test_explicit_positions_equal_the_default_ones(runtime):
    rng = np.random.default_rng(3)
    a, b = session(runtime, layers=1), session(runtime, layers=1)
    sa, sb = a.add_sequence(), b.add_sequence()
    q, k, v = rand(rng, 6, HQ, D), rand(rng, 6, HKV, D), rand(rng, 6, HKV, D)
    oa, ob = np.empty_like(q), np.empty_like(q)
    a.attend(0, "prefill", q, k, v, oa, sa)
    b.attend(0, "prefill", q, k, v, ob, sb, positions=range(6))
    assert np.array_equal(oa, ob)
    with pytest.raises(ValueError, match="5 positions for 6 new rows"):
        b.attend(0, "prefill", q, k, v, ob, sb, positions=range(5))


def test_a_calls_sequences_are_read_again_unless_the_same_immutable_object(runtime):
    """attend() keeps the previous call's host arrays when seq_ids / qo_indptr / positions are the
    very same ints or tuples (one step's plan, passed to every layer); a list is read every call
    (it may have changed in place), and so is a prefill's default rows (they follow q)."""
    rng = np.random.default_rng(4)
    s = session(runtime, layers=2)
    a, b = s.add_sequence(), s.add_sequence()
    q, k, v = rand(rng, 6, HQ, D), rand(rng, 6, HKV, D), rand(rng, 6, HKV, D)
    out = np.empty_like(q)
    ids = [a]
    s.attend(0, "prefill", q, k, v, out, ids)
    ids[0] = b
    s.attend(0, "prefill", q, k, v, out, ids)
    assert (s.seq_len(0, a), s.seq_len(0, b)) == (6, 6)
    plan = (a,)
    s.attend(1, "prefill", q, k, v, out, plan)
    s.attend(1, "prefill", q[:2], k[:2], v[:2], out[:2], plan)  # same tuple, default rows follow q
    assert s.seq_len(1, a) == 8
    both, qo = (a, b), (0, 1, 2)
    s.attend(0, "decode", q[:2], k[:2], v[:2], out[:2], both, qo_indptr=qo, positions=(6, 6))
    s.attend(1, "decode", q[:1], k[:1], v[:1], out[:1], both[:1], positions=(8,))
    assert [s.seq_len(l, x) for l in (0, 1) for x in (a, b)] == [7, 7, 9, 0]
    with pytest.raises(ValueError, match="3 positions for 2 new rows"):
        s.attend(0, "decode", q[:2], k[:2], v[:2], out[:2], both, qo_indptr=qo, positions=(7, 7, 7))
    with pytest.raises(sieve.SieveError, match="sequence id 99 was not added"):
        s.attend(0, "decode", q[:1], k[:1], v[:1], out[:1], (99,))
    pos = (7, 7)
    for _ in range(2):  # after the failures, and the same objects again
        s.attend(0, "decode", q[:2], k[:2], v[:2], out[:2], both, qo_indptr=qo, positions=pos)
    assert [s.seq_len(0, x) for x in (a, b)] == [9, 9]


def test_raas_eviction_frees_pages(runtime):
    """RaaS keeps at most token_budget tokens a sequence: after end_step the resident length and
    the bytes stop growing while decoding goes on (a dense session keeps growing)."""
    rng = np.random.default_rng(5)
    chain = "prefill:*=dense; decode:*=raas(token_budget=64)"
    s, dense = session(runtime, chain=chain, layers=1, max_seq_len=400), session(runtime, layers=1, max_seq_len=400)
    seq, dseq = s.add_sequence(), dense.add_sequence()
    q, k, v = rand(rng, 32, HQ, D), rand(rng, 32, HKV, D), rand(rng, 32, HKV, D)
    out = np.empty_like(q)
    for sess, sq in ((s, seq), (dense, dseq)):
        sess.attend(0, "prefill", q, k, v, out, sq)
        sess.end_step("prefill", sq)
    lens, bytes_ = [], []
    for step in range(200):
        q1, k1, v1 = rand(rng, 1, HQ, D), rand(rng, 1, HKV, D), rand(rng, 1, HKV, D)
        o1 = np.empty_like(q1)
        for sess, sq in ((s, seq), (dense, dseq)):
            sess.attend(0, "decode", q1, k1, v1, o1, sq)
            sess.end_step("decode", sq)
            assert np.isfinite(o1).all()
        lens.append(s.seq_len(0, seq))
        bytes_.append(s.kv_bytes)
    assert dense.seq_len(0, dseq) == 232
    assert max(lens) <= 64 + 16  # the budget plus the page being filled
    assert max(bytes_[100:]) <= max(bytes_[:100])  # flat: pages come back to the pool


@pytest.mark.parametrize("chain", [None, "*=quest(token_budget=32)", "decode:*=streaming(sink=4,window=24)",
                                   "*=raas(token_budget=48,pin_prefill=false)"])
def test_session_equals_the_cpp_session_on_the_same_inputs(runtime, chain, tmp_path):
    """The calls this binding made (two ragged sequences: prefill 70 and 33 tokens, 40 decode
    steps, 2 layers) replayed from C++ through the host API on the same bytes give the same
    outputs bit for bit: the same selections and the same kernels on the CPU."""
    from replay import Recording, tool_available
    if not tool_available():
        pytest.skip("sieve_session_replay is not built (SIEVE_TEST_BIN_DIR)")
    rng = np.random.default_rng(9)
    with Recording() as rec:
        s = session(runtime, chain=chain, max_seq_len=128)
        seqs = [s.add_sequence(), s.add_sequence()]
        for step in range(41):
            n = [70, 33] if step == 0 else [1, 1]
            phase = "prefill" if step == 0 else "decode"
            qo = np.concatenate([[0], np.cumsum(n)])
            for layer in range(2):
                q, k, v = rand(rng, qo[-1], HQ, D), rand(rng, qo[-1], HKV, D), rand(rng, qo[-1], HKV, D)
                s.attend(layer, phase, q, k, v, np.empty_like(q), seqs, qo_indptr=qo)
            s.end_step(phase, seqs)
    pairs = Recording.replay(rec.sessions[0], str(tmp_path))
    assert len(pairs) == 82
    for i, (mine, cpp) in enumerate(pairs):
        assert np.array_equal(mine, cpp), i
