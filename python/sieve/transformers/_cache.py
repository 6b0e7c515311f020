"""SieveCache: a transformers Cache whose KV lives in a Sieve session.

transformers sees a cache of the usual shape (lengths for the masks and generate's positions);
update() keeps no tensors, it returns the layer's new k/v for the attention function, which
appends them to the session and runs the chain (sieve_session_attend). The session is created on
the first layer call, when batch, dtype and device are known; on CUDA it runs on torch's current
stream (host API 1.2), so torch's kernels and Sieve's are ordered without synchronising.

Batches: row b of the model's batch is Sieve sequence b. In a prefill, padded rows (left padding
from a tokenizer, or any row the 2D attention mask zeroes) are left out: each sequence gets only
its real tokens, at the positions transformers gave them (position_ids), and the padded rows'
outputs are zero. A decode step (one token per row after the prefill) takes every row.
"""
import torch
from transformers.cache_utils import Cache, CacheLayerMixin

import sieve


class _Layer(CacheLayerMixin):
    """One layer's lengths, as transformers' masks and generate read them (no tensors)."""

    is_sliding = False
    is_compileable = False
    is_croppable = False
    supports_early_init = False  # nothing to allocate ahead: the session is created on first use

    def __init__(self, max_length):
        super().__init__()
        self.length, self.max_length = 0, max_length

    def lazy_initialization(self, key_states, value_states=None):
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        return key_states, value_states

    def get_seq_length(self):
        return self.length

    def get_mask_sizes(self, query_length):
        return self.length + int(query_length), 0

    def get_max_length(self):
        return self.max_length

    def reset(self):
        raise NotImplementedError("sieve.transformers: a SieveCache cannot be reset; make a new one")

    def reorder_cache(self, beam_idx):
        raise NotImplementedError("sieve.transformers: beam search is not supported (see SieveCache)")


def _refused(what, why):
    def method(self, *args, **kwargs):
        raise NotImplementedError("sieve.transformers: %s is not supported: %s" % (what, why))
    return method


class SieveCache(Cache):
    """The KV cache of one generation (a batch of sequences) in a Sieve session.

    model: a model sieve.transformers.use() set up; max_length: tokens a row may reach (prompt,
    padding included, + generated): the session's page pool is sized from it.
    """

    def __init__(self, model, max_length):
        binding = getattr(model, "sieve", None)
        if binding is None:
            raise ValueError("sieve.transformers: call sieve.transformers.use(model, chain=...) first")
        self.binding = binding
        self.max_length = int(max_length)
        super().__init__(layers=[_Layer(self.max_length) for _ in range(binding.geometry["n_layers"])])
        self.session = None
        self.seq_ids = ()
        self.trace = None  # a list: every layer call's inputs and output are appended (tests, debugging)
        self._pending = (None, None)
        self._step = None  # this forward's call plan (_begin_forward)

    # ---- what transformers calls ------------------------------------------------------------
    def update(self, key_states, value_states, layer_idx, cache_kwargs=None):
        self._pending = (layer_idx, key_states)
        self.binding.active = self
        return key_states, value_states

    def get_seq_length(self, layer_idx=0):
        return self.layers[layer_idx].length

    def get_mask_sizes(self, query_length, layer_idx=0):
        return self.layers[layer_idx].get_mask_sizes(query_length)

    def get_max_length(self, layer_idx=None):
        return self.max_length

    reorder_cache = _refused("beam search", "Sieve's policies keep one KV history per sequence; use greedy or "
                                            "sampling")
    crop = _refused("cropping the cache (assisted / speculative decoding)",
                    "evicting policies cannot give tokens back")
    batch_repeat_interleave = _refused("expanding a filled cache", "make the batch before the prefill")
    batch_select_indices = _refused("selecting rows of a filled cache", "make the batch before the prefill")
    reset = _refused("reset", "make a new SieveCache")

    # ---- the attention function's side ------------------------------------------------------
    def is_pending(self, layer_idx, key):
        return self._pending[0] == layer_idx and self._pending[1] is key

    @property
    def kv_bytes(self):
        """K/V bytes resident in the session (0 before the first forward)."""
        return self.session.kv_bytes if self.session is not None else 0

    def _create_session(self, batch, like):
        b = self.binding
        stream = torch.cuda.current_stream(like.device) if like.device.type == "cuda" else None
        self.session = sieve.Session(b.runtime, **b.geometry, max_batch=batch, max_seq_len=self.max_length,
                                     page_size=b.page_size, kv_dtype=like.dtype, device=str(like.device),
                                     chain=b.chain, kv_store=b.kv_store, check_outputs=b.check_outputs,
                                     cuda_stream=stream)
        self.seq_ids = tuple(self.session.add_sequence() for _ in range(batch))
        self._next_position = [0] * batch  # of each sequence's next token (host side: no sync in decode)
        self._stream = self.session.cuda_stream
        for layer in self.layers:
            layer.batch_size = batch

    def _begin_forward(self, batch, length, mask, position_ids, like):
        """The call plan shared by every layer of this forward: phase, sequences, rows, positions
        (tuples: the binding converts them once per forward, not once per layer), the output."""
        if self.session is None:
            self._create_session(batch, like)
        elif batch != len(self.seq_ids):
            raise ValueError("sieve.transformers: this SieveCache holds %d sequences, the forward has %d rows"
                             % (len(self.seq_ids), batch))
        if self.layers[0].length + length > self.max_length:
            raise ValueError("sieve.transformers: %d + %d tokens exceed the cache's max_length %d"
                             % (self.layers[0].length, length, self.max_length))
        if self._stream is not None:
            current = torch.cuda.current_stream(like.device).cuda_stream or 1  # 1: cudaStreamLegacy
            if current != self._stream:
                raise RuntimeError("sieve.transformers: torch's current CUDA stream (%#x) is not the one the "
                                   "session was created on (%#x); generate on one stream" % (current, self._stream))
        decode = length == 1 and self.layers[0].length > 0
        step = {"phase": "decode" if decode else "prefill", "rows": None, "positions": None, "out": None}
        nxt = self._next_position
        if decode:
            # Every row takes its token, one past its last position: transformers' position_ids
            # (the padding mask's running count under generate) advance the same way. qo None:
            # the binding's default, one row per sequence.
            step["seqs"], step["qo"], step["positions"] = self.seq_ids, None, tuple(nxt)
            self._next_position = [p + 1 for p in nxt]
        else:
            real = mask.cpu() if mask is not None else torch.ones(batch, length, dtype=torch.bool)
            counts = real.sum(1).tolist()
            step["seqs"] = tuple(s for s, n in zip(self.seq_ids, counts) if n)
            qo = [0]
            for n in counts:
                if n:
                    qo.append(qo[-1] + n)
            step["qo"] = tuple(qo)
            flat = real.reshape(-1)
            if not bool(flat.all()):
                step["rows"] = flat.nonzero().reshape(-1).to(like.device)
            if position_ids is not None:
                pos = position_ids.expand(batch, length).cpu()
                step["positions"] = tuple(pos.reshape(-1)[flat].tolist())
                for b, n in enumerate(counts):
                    if n:
                        nxt[b] = int(pos[b][real[b]].max()) + 1
            else:
                for b, n in enumerate(counts):
                    nxt[b] += n
        if decode and self.trace is None and not torch.is_grad_enabled():
            # One output buffer for every layer of the step: layer l's output is consumed by its
            # o_proj (queued on the same stream) before layer l + 1's kernels write the buffer, and
            # nothing keeps it without autograd or a trace. Saves an allocation per layer.
            hq, d = like.shape[1], like.shape[3]
            step["out"] = torch.empty(batch, hq, d, dtype=like.dtype, device=like.device)
            step["out_view"] = step["out"].view(batch, 1, hq, d)
        self._step = step

    def attend(self, layer, query, key, value, mask, position_ids):
        """One layer: q [B, Hq, S, D], k/v [B, Hkv, S, D] (the new tokens) -> out [B, S, Hq, D]."""
        batch, hq, length, d = query.shape
        if layer == 0:
            self._begin_forward(batch, length, mask, position_ids, query)
        step = self._step
        if step is None:
            raise RuntimeError("sieve.transformers: layer %d ran before layer 0 in this forward" % layer)
        if length == 1:  # [B, H, 1, D] -> [B, H, D]: a view (transformers' layout is [B, 1, H, D])
            q = query.reshape(batch, hq, d).contiguous()
            k = key.reshape(batch, key.shape[1], d).contiguous()
            v = value.reshape(batch, value.shape[1], d).contiguous()
        else:  # [B, H, S, D] -> [B*S, H, D]: one copy
            q = query.transpose(1, 2).reshape(batch * length, hq, d).contiguous()
            k = key.transpose(1, 2).reshape(batch * length, key.shape[1], d).contiguous()
            v = value.transpose(1, 2).reshape(batch * length, value.shape[1], d).contiguous()
        rows = step["rows"]
        if rows is not None:
            q, k, v = q.index_select(0, rows), k.index_select(0, rows), v.index_select(0, rows)
        buffer = step["out"]
        out = torch.empty_like(q) if buffer is None else buffer
        self.session.attend(layer, step["phase"], q, k, v, out, step["seqs"], qo_indptr=step["qo"],
                            positions=step["positions"], ready=True)
        if rows is not None:
            out = torch.zeros(batch * length, hq, d, dtype=out.dtype, device=out.device).index_copy_(0, rows, out)
        out = out.view(batch, length, hq, d) if buffer is None else step["out_view"]
        if self.trace is not None:
            self.trace.append(dict(layer=layer, phase=step["phase"], query=query, key=key, value=value, mask=mask,
                                   position_ids=position_ids, out=out))
        self.layers[layer].length += length
        if layer == len(self.layers) - 1:
            self.session.end_step(step["phase"], step["seqs"])
            self._step = None
        self._pending = (None, None)
        return out
