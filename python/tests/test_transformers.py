"""sieve.transformers on random-weight Llama and Qwen2 models built from configs (no weights exist
here): the dense chain equals transformers' sdpa (logits over a prefill and 64 decode steps, greedy
tokens), sparse chains equal sessions driven directly on the same K/V, RaaS keeps memory flat,
a padded batch equals each prompt alone, unsupported features are refused. Skips with a message
without transformers; the 1B models and the memory test need a GPU."""
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the GPU machine has it)")

import numpy as np  # noqa: E402

import sieve  # noqa: E402
import sieve.transformers as st  # noqa: E402
from reference import bound_from, magnitudes  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
gpu = pytest.mark.skipif(DEVICE != "cuda", reason="no CUDA device: the 1B models and memory checks run on a GPU machine")
VOCAB_TINY = 1000


def config(family, size="tiny"):
    if size == "tiny":
        kw = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, vocab_size=VOCAB_TINY, max_position_embeddings=4096)
    elif family == "llama":  # Llama 3.2 1B geometry
        kw = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, tie_word_embeddings=True)
    else:  # Qwen2.5 1.5B geometry
        kw = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                  num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True)
    cls = transformers.LlamaConfig if family == "llama" else transformers.Qwen2Config
    c = cls(**kw)
    c.eos_token_id = None  # random weights: generate exactly max_new_tokens
    c.pad_token_id = 0
    return c


def build(family, size="tiny", dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    cls = transformers.LlamaForCausalLM if family == "llama" else transformers.Qwen2ForCausalLM
    with torch.device(DEVICE):
        model = cls(config(family, size))
    model = model.to(dtype).eval()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("sdpa")
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def prompt(n, batch=1, seed=1, vocab=VOCAB_TINY):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab, (batch, n), generator=g).to(DEVICE)


@torch.no_grad()
def logits_over_steps(model, ids, tokens=None, steps=64, cache=None):
    """Prefill `ids`, then `steps` decode steps feeding `tokens` (None: the greedy ones).
    Returns (the logits of every position, the tokens fed)."""
    out = model(ids, past_key_values=cache, use_cache=True)
    cache = out.past_key_values
    logits = [out.logits.float()]
    fed = []
    for i in range(steps):
        nxt = logits[-1][:, -1].argmax(-1) if tokens is None else tokens[i]
        fed.append(nxt)
        out = model(nxt[:, None], past_key_values=cache, use_cache=True)
        logits.append(out.logits.float())
    return logits, fed


def worst_relative(got, ref):
    """The largest |got - ref| of any step, relative to that step's largest |ref| logit."""
    return max(float((g - r).abs().max() / r.abs().max()) for g, r in zip(got, ref))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("size", ["tiny", pytest.param("1b", marks=gpu)])
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_dense_chain_logits_equal_sdpa(family, size, dtype):
    """The dense chain against transformers' sdpa on the same weights and tokens (prefill of 100,
    64 teacher-forced decode steps). f32: within the issue's 1e-4 of the largest logit. bf16: the
    issue's 2e-2 holds for the tiny models; over 16 / 28 layers of random weights two bf16
    attentions drift apart further (measured on an H200: 3.4e-2 Llama 1B, 4.2e-2 Qwen2 1.5B), so
    there both bf16 runs are measured against the same model in f32, and Sieve's bf16 must be no
    further from it than twice sdpa's own bf16 distance."""
    model = build(family, size)
    ids = prompt(100, vocab=model.config.vocab_size)
    ref32, fed = logits_over_steps(model, ids)
    ref = ref32
    if dtype != torch.float32:
        model = model.to(dtype)
        ref, _ = logits_over_steps(model, ids, tokens=fed)
    st.use(model)
    got, _ = logits_over_steps(model, ids, tokens=fed, cache=model.sieve.cache(100 + 64))
    worst = worst_relative(got, ref)
    print("%s %s %s: worst relative logit difference to sdpa %.3e" % (family, size, dtype, worst))
    if dtype == torch.float32:
        assert worst <= 1e-4
        return
    sieve_to_f32, sdpa_to_f32 = worst_relative(got, ref32), worst_relative(ref, ref32)
    print("%s %s bf16 vs f32: sieve %.3e, sdpa %.3e" % (family, size, sieve_to_f32, sdpa_to_f32))
    if size == "tiny":
        assert worst <= 2e-2
    assert sieve_to_f32 <= 2 * sdpa_to_f32


@pytest.mark.parametrize("family,size", [("llama", "tiny"), ("qwen2", "tiny"), pytest.param("llama", "1b", marks=gpu)])
def test_greedy_128_tokens_identical_in_f32(family, size):
    model = build(family, size)
    ids = prompt(64, vocab=model.config.vocab_size)
    with torch.no_grad():
        ref = model.generate(ids, max_new_tokens=128, do_sample=False)
        st.use(model)
        got = model.generate(ids, max_new_tokens=128, do_sample=False)
    assert got.shape == (1, 64 + 128)
    assert torch.equal(got, ref)


def test_sampled_generation_follows_the_same_distribution():
    """Same seed, same f32 distributions: the same samples as sdpa (a flip needs a uniform draw
    within ~1e-6 of a bucket edge), and repeatable."""
    model = build("qwen2")
    ids = prompt(40)
    kw = dict(max_new_tokens=32, do_sample=True, top_k=50, temperature=0.8)
    with torch.no_grad():
        torch.manual_seed(5)
        ref = model.generate(ids, **kw)
        st.use(model, chain="decode:*=dense")
        torch.manual_seed(5)
        a = model.generate(ids, **kw)
        torch.manual_seed(5)
        b = model.generate(ids, **kw)
    assert torch.equal(a, b) and torch.equal(a, ref)


def padded(lengths, vocab=VOCAB_TINY):
    """Left-padded batch of prompts of `lengths` (what a tokenizer with padding_side='left' gives)."""
    width = max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long, device=DEVICE)
    mask = torch.zeros_like(ids)
    prompts = []
    for b, n in enumerate(lengths):
        p = prompt(n, seed=10 + b, vocab=vocab)[0]
        prompts.append(p)
        ids[b, width - n:], mask[b, width - n:] = p, 1
    return ids, mask, prompts


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_a_padded_batch_generates_what_each_prompt_generates_alone(family):
    model = build(family)
    st.use(model, chain="*=quest(token_budget=32)")
    ids, mask, prompts = padded([37, 64, 5, 20])
    with torch.no_grad():
        batch = model.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False)
        for b, p in enumerate(prompts):
            alone = model.generate(p[None], max_new_tokens=24, do_sample=False)
            assert torch.equal(batch[b, ids.shape[1]:], alone[0, len(p):]), b


CHAINS = ["*=quest(token_budget=32)", "decode:*=streaming(sink=4,window=32)",
          "*=raas(token_budget=48,pin_prefill=false)", "decode:*=delta(token_budget=48,recent=16)",
          "prefill:*=streaming(sink=4,window=32)>delta_correction(gamma=8,tail=16)"]


@pytest.mark.parametrize("chain", CHAINS)
def test_chain_equals_a_session_driven_directly_on_the_same_kv(chain):
    """Generate a padded batch of 2 through the integration, recording what each layer call got
    from transformers; replay each sequence alone through its own Session (batch 1, positions
    and rows taken straight from transformers' mask and position_ids) and compare the outputs
    within the f32 bound over the sequence's keys. A dense replay beside it shows the chain's
    selections matter: its outputs move far beyond that bound."""
    model = build("llama")
    st.use(model, chain=chain)
    ids, mask, prompts = padded([150, 90])
    cache = model.sieve.cache(150 + 16 + 16)  # + a page: see use()'s generate hook
    cache.trace = []
    with torch.no_grad():
        model.generate(ids, attention_mask=mask, past_key_values=cache, max_new_tokens=16, do_sample=False)
    g = model.sieve.geometry
    stream = torch.cuda.current_stream() if DEVICE == "cuda" else None
    sparse_moved = 0.0
    for b in range(2):
        mine, dense = (sieve.Session(model.sieve.runtime, **g, max_batch=1, max_seq_len=182, device=DEVICE, chain=c,
                                     cuda_stream=stream) for c in (chain, None))
        seq, dseq = mine.add_sequence(), dense.add_sequence()
        n_keys, seen = 0, {}  # keys so far; per layer the largest |q|, |k| norms and |v| so far
        for call in cache.trace:
            q, k, v, m = call["query"][b], call["key"][b], call["value"][b], call["mask"]
            rows = torch.arange(q.shape[1], device=q.device)
            if call["phase"] == "prefill" and m is not None:
                rows = m[b].nonzero().reshape(-1)
            pos = None
            if call["phase"] == "prefill" and call["position_ids"] is not None:
                pos = call["position_ids"].expand(2, -1)[b, rows].tolist()
            qb, kb, vb = (x[:, rows].transpose(0, 1).contiguous() for x in (q, k, v))
            expect = call["out"][b, rows]
            got, ref = torch.empty_like(qb), torch.empty_like(qb)
            mine.attend(call["layer"], call["phase"], qb, kb, vb, got, seq, positions=pos)
            dense.attend(call["layer"], call["phase"], qb, kb, vb, ref, dseq, positions=pos)
            if call["layer"] == 0:
                n_keys += len(rows)
            m = magnitudes(qb.cpu().numpy(), kb.cpu().numpy(), vb.cpu().numpy())
            seen[call["layer"]] = m = tuple(max(a, b) for a, b in zip(seen.get(call["layer"], m), m))
            bound = bound_from(*m, qb.shape[-1], n_keys)
            assert float((got - expect).abs().max()) <= bound, (b, call["layer"], call["phase"])
            sparse_moved = max(sparse_moved, float((ref - expect).abs().max()) / bound)
            if call["layer"] == g["n_layers"] - 1:
                mine.end_step(call["phase"], seq)
                dense.end_step(call["phase"], dseq)
        mine.close(), dense.close()
    assert sparse_moved > 10, "the chain's outputs stayed within the rounding bound of dense: nothing was selected"


@pytest.mark.parametrize("chain", CHAINS)
def test_chain_equals_the_cpp_session_on_the_same_kv(chain, tmp_path):
    """Every call the integration made to its session during a padded-batch generate (prefill,
    16 decode steps, 4 layers), replayed from C++ through the host API on the same bytes (the
    C++ session: no Python, ctypes or DLPack): the same outputs bit for bit, so the same
    selections (the kernels of these chains are deterministic: no atomics)."""
    from replay import Recording, tool_available
    if not tool_available():
        pytest.skip("sieve_session_replay is not built (SIEVE_TEST_BIN_DIR)")
    model = st.use(build("llama"), chain=chain)
    ids, mask, _ = padded([150, 90])
    with Recording() as rec, torch.no_grad():
        model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False)
    assert len(rec.sessions) == 1
    pairs = Recording.replay(rec.sessions[0], str(tmp_path))
    # 16 forwards of 4 layers (the 16th token comes from the 15th decode's logits), or one more
    # when generate's deferred stop check ran a forward ahead.
    assert len(pairs) in (4 * 16, 4 * 17)
    worst = max(float(np.abs(a - b).max()) for a, b in pairs)
    assert worst == 0.0, "max |python - C++| = %g" % worst


@gpu
def test_raas_keeps_memory_flat_while_decoding():
    """torch.cuda.memory_allocated() and the session's resident KV bytes stay flat under RaaS as
    decoding goes on; with dense the session's KV grows, and transformers' own DynamicCache grows
    torch's memory by its K/V bytes every step (the measurement can see growth)."""
    model = build("llama", dtype=torch.bfloat16)
    ids = prompt(256)
    steps, budget = 160, 128
    per_step_kv = 2 * model.config.num_hidden_layers * model.config.num_key_value_heads * 64 * 2  # K+V, bf16

    @torch.no_grad()
    def decode(cache):
        out = model(ids, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        mem, kv = [], []
        for _ in range(steps):
            out = model(out.logits[:, -1:].argmax(-1), past_key_values=cache, use_cache=True)
            torch.cuda.synchronize()
            mem.append(torch.cuda.memory_allocated())
            kv.append(getattr(cache, "kv_bytes", 0))
        return mem, kv

    sdpa_mem, _ = decode(None)
    # The allocator rounds each cache tensor to 512-byte blocks: at least half the K/V bytes show.
    assert sdpa_mem[-1] - sdpa_mem[40] >= (steps - 41) * per_step_kv // 2
    st.use(model, chain="*=raas(token_budget=%d,pin_prefill=false)" % budget)
    mem, kv = decode(model.sieve.cache(256 + steps))
    assert max(mem[40:]) - min(mem[40:]) <= 64 * 1024, (min(mem[40:]), max(mem[40:]))
    assert max(kv[40:]) <= max(kv[:40])
    st.use(model, chain="decode:*=dense")
    _, dense_kv = decode(model.sieve.cache(256 + steps))
    assert dense_kv[-1] > kv[-1] and dense_kv[-1] > dense_kv[40]


# ---- refusals: one clear line, never silently wrong ----------------------------------------------

def test_unsupported_models_are_refused():
    sliding = transformers.Qwen2Config(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                       num_attention_heads=2, num_key_value_heads=1, vocab_size=100,
                                       use_sliding_window=True, sliding_window=64, max_window_layers=0)
    with pytest.raises(NotImplementedError, match="sliding-window layers"):
        st.use(transformers.Qwen2ForCausalLM(sliding))
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=64, n_head=2, vocab_size=100))
    with pytest.raises(NotImplementedError, match="model type 'gpt2' is not supported"):
        st.use(gpt2)


def test_unsupported_generation_is_refused():
    model = st.use(build("llama"), chain="*=quest(token_budget=32)")
    ids = prompt(20)
    with pytest.raises(NotImplementedError, match="beam search"):
        model.generate(ids, num_beams=2, max_new_tokens=4)
    with pytest.raises(NotImplementedError, match="cache_implementation='static'"):
        model.generate(ids, cache_implementation="static", max_new_tokens=4)
    with pytest.raises(ValueError, match="past_key_values is a DynamicCache"):
        model.generate(ids, past_key_values=transformers.DynamicCache(), max_new_tokens=4)


def test_attention_without_a_sieve_cache_is_refused():
    model = st.use(build("qwen2"))
    with torch.no_grad(), pytest.raises(RuntimeError, match="ran without a SieveCache"):
        model(prompt(8))
    with torch.no_grad(), pytest.raises(NotImplementedError, match="beam search"):
        model.sieve.cache(16).reorder_cache(torch.tensor([0]))
    with torch.no_grad(), pytest.raises(sieve.SieveError, match="nosuch"):
        st.use(model, chain="decode:*=nosuch")(prompt(8), past_key_values=model.sieve.cache(16))
