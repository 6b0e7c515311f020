"""Session: a model geometry's KV cache and its chains; attend() runs one layer on DLPack tensors.

CUDA streams: a CUDA session runs on `cuda_stream` when given (an int cudaStream_t or an object
with `.cuda_stream`, e.g. torch.cuda.current_stream(); torch's default stream is passed as
cudaStreamLegacy), else on a stream of its own. attend() exports its tensors for the session's
stream (`__dlpack__(stream=...)`: the producer makes the session's stream wait for the work it
queued; once per call for torch and cupy, whose wait covers their whole current stream, see
_dlpack.export_all), so tensors produced on any torch stream are read finished; where torch's
current stream is the session's there is nothing to wait for, and ready=True skips the question.
The session's kernels go on its stream: the caller reads an output on that stream, or after
synchronize().
"""
import ctypes as C

from . import _capi, _dlpack
from ._capi import lib
from ._errors import check
from ._handle import Handle
from .runtime import Chain

PHASES = {"prefill": _capi.PHASE_PREFILL, "decode": _capi.PHASE_DECODE,
          _capi.PHASE_PREFILL: _capi.PHASE_PREFILL, _capi.PHASE_DECODE: _capi.PHASE_DECODE}
_DTYPES = {"float32": (_capi.DL_FLOAT, 32), "float": (_capi.DL_FLOAT, 32), "f32": (_capi.DL_FLOAT, 32),
           "float16": (_capi.DL_FLOAT, 16), "half": (_capi.DL_FLOAT, 16), "f16": (_capi.DL_FLOAT, 16),
           "bfloat16": (_capi.DL_BFLOAT, 16), "bf16": (_capi.DL_BFLOAT, 16)}
_CUDA_STREAM_LEGACY = 1  # cudaStreamLegacy; DLPack's number for the legacy default stream too


def _dtype(x):
    name = str(getattr(x, "name", x)).replace("torch.", "")
    if name not in _DTYPES:
        raise ValueError("sieve: kv_dtype %r is not float32, float16 or bfloat16" % (x,))
    code, bits = _DTYPES[name]
    return _capi.DLDataType(code, bits, 1)


def _device(x):
    """'cpu', 'cuda', 'cuda:1', a torch.device or a (DLPack type, id) pair -> DLDevice."""
    if isinstance(x, tuple):
        return _capi.DLDevice(*x)
    text = str(x)
    kind, _, index = text.partition(":")
    if kind == "cpu" and not index:
        return _capi.DLDevice(_capi.DL_CPU, 0)
    if kind == "cuda" and (not index or index.isdigit()):
        return _capi.DLDevice(_capi.DL_CUDA, int(index or 0))
    raise ValueError("sieve: device %r is neither 'cpu' nor 'cuda[:N]'" % (x,))


def _stream_handle(stream):
    if stream is None:
        return None
    handle = int(getattr(stream, "cuda_stream", stream))
    return handle or _CUDA_STREAM_LEGACY


def _int_array(values, n):
    return (C.c_int32 * n)(*values)


class Session(Handle):
    """KV stores and policy instances for one geometry (see sieve_session_create).

    chain: None (dense everywhere), a spec string or a Chain of `runtime`.
    kv_store: None (the chain's kv_store line, else the core's "paged"), or "name(params)".
    """

    def __init__(self, runtime, *, n_layers, n_q_heads, n_kv_heads, head_dim, max_seq_len, max_batch=1,
                 page_size=16, kv_dtype="float32", device="cpu", rope_theta=10000.0, rope_dim=None, chain=None,
                 kv_store=None, pages_per_layer=0, check_outputs=True, cuda_stream=None):
        dev = _device(device)
        self.geometry = _capi.new(_capi.Geometry, n_layers=n_layers, n_q_heads=n_q_heads, n_kv_heads=n_kv_heads,
                                  head_dim=head_dim, page_size=page_size, max_batch=max_batch,
                                  max_seq_len=max_seq_len, kv_dtype=_dtype(kv_dtype), device=dev,
                                  rope_theta=rope_theta, rope_dim=head_dim if rope_dim is None else rope_dim)
        self._kv_store_text = kv_store.encode() if kv_store else None  # borrowed during create
        options = _capi.new(_capi.SessionOptions, pages_per_layer=pages_per_layer, check=int(bool(check_outputs)),
                            kv_store=self._kv_store_text, cuda_stream=_stream_handle(cuda_stream))
        own_chain = isinstance(chain, str)
        chain_obj = Chain(runtime, spec=chain) if own_chain else chain
        self._h = C.c_void_p()
        self.chain = chain_obj.text if chain_obj is not None else ""  # normalised, "" for dense
        try:
            status = lib.sieve_session_create(runtime._h, C.byref(self.geometry),
                                              chain_obj._h if chain_obj is not None else None, C.byref(options),
                                              C.byref(self._h))
            runtime._check(status)
        finally:
            if own_chain:
                chain_obj.close()
        self.device = (dev.device_type, dev.device_id)
        self.on_cuda = dev.device_type == _capi.DL_CUDA
        stream = lib.sieve_session_cuda_stream(self._h)
        self.cuda_stream = int(stream) if stream else None
        # What __dlpack__ is asked for: device arrays ready on the session's stream.
        self._export_stream = self.cuda_stream if self.on_cuda else None
        # Reused per call: the inputs struct, a pointer to it and the host arrays (no allocation
        # per layer call), the C function.
        self._inputs = _capi.new(_capi.LayerInputs)
        self._inputs_ptr = C.pointer(self._inputs)
        self._attend = lib.sieve_session_attend
        self._cap = max_batch
        self._seq_ids = (C.c_int32 * max_batch)()
        self._qo = (C.c_int32 * (max_batch + 1))()
        self._positions = (C.c_int32 * 0)()
        self._inputs.seq_ids, self._inputs.qo_indptr = self._seq_ids, self._qo
        self._plan = (None, None, None, None)  # (seq_ids, qo_indptr, positions, phase) the arrays hold

    def _check(self, status):
        check(status, lib.sieve_session_last_error, self._h)

    # ---- sequences -------------------------------------------------------------------------
    def add_sequence(self):
        seq = C.c_int32()
        self._check(lib.sieve_session_add_sequence(self._h, C.byref(seq)))
        return seq.value

    def remove_sequence(self, seq_id):
        self._check(lib.sieve_session_remove_sequence(self._h, seq_id))

    def seq_len(self, layer, seq_id):
        """Tokens of `seq_id` resident in `layer` (after any eviction)."""
        n = C.c_int32()
        self._check(lib.sieve_session_seq_len(self._h, layer, seq_id, C.byref(n)))
        return n.value

    # ---- one layer -------------------------------------------------------------------------
    def attend(self, layer, phase, q, k, v, out, seq_ids, qo_indptr=None, positions=None, q_pre_rope=None,
               k_pre_rope=None, ready=False):
        """Append k/v to `layer`'s cache for `seq_ids`, run the layer's chain and write `out`.

        q/out: [n_new, n_q_heads, head_dim], k/v: [n_new, n_kv_heads, head_dim], compact, on the
        session's device (post-RoPE; q_pre_rope/k_pre_rope for policies that need them).
        qo_indptr: rows of sequence b are qo_indptr[b]:qo_indptr[b+1]; None: one row per sequence
        in decode, all rows to the single sequence in prefill. positions: absolute position of
        each row; None: right after what the session already took for the sequence in this layer.
        seq_ids / qo_indptr / positions that are the very objects of the previous call and ints or
        tuples (one step's plan, reused by every layer) are not converted again.
        ready: (CUDA) the caller checked that the tensors were produced on the session's stream,
        so the producer is not asked to synchronise (DLPack stream -1). Without it, one
        synchronisation per call orders the producer's stream before the session's (_dlpack.export_all).
        Returns `out`.
        """
        keep = []  # the capsules live until the call returned
        inputs = self._inputs
        (inputs.q, inputs.k, inputs.v, inputs.q_pre_rope, inputs.k_pre_rope, out_address) = _dlpack.export_all(
            (q, k, v, q_pre_rope, k_pre_rope, out), -1 if ready and self.on_cuda else self._export_stream, keep)
        try:
            inputs.phase = PHASES[phase]
        except KeyError:
            raise ValueError("sieve: phase %r is neither 'prefill' nor 'decode'" % (phase,)) from None
        inputs.layer = layer
        plan = (seq_ids, qo_indptr, positions, inputs.phase)
        if not (plan[0] is self._plan[0] and plan[1] is self._plan[1] and plan[2] is self._plan[2]
                and plan[3] == self._plan[3]):
            self._set_plan(plan, q)
        status = self._attend(self._h, self._inputs_ptr, out_address)
        if status:
            self._check(status)
        return out

    def _set_plan(self, plan, q):
        """Fill the host arrays of a call's sequences, rows and positions (kept for the next call
        when every part is an int, a tuple or None: immutable, so the same object means the same
        values; a list may have changed in place)."""
        seq_ids, qo_indptr, positions, phase = plan
        inputs = self._inputs
        if isinstance(seq_ids, int):
            seq_ids = (seq_ids,)
        batch = len(seq_ids)
        if batch > self._cap:
            raise ValueError("sieve: %d sequences in one call, the session's max_batch is %d" % (batch, self._cap))
        if qo_indptr is None:
            if phase == _capi.PHASE_DECODE:
                qo_indptr = range(batch + 1)
            elif batch == 1:
                qo_indptr = (0, q.shape[0])
            else:
                raise ValueError("sieve: a prefill of %d sequences needs qo_indptr" % batch)
        if len(qo_indptr) != batch + 1:
            raise ValueError("sieve: qo_indptr has %d entries for %d sequences (needs batch + 1)"
                             % (len(qo_indptr), batch))
        self._plan = (None, None, None, None)  # a failure below leaves no plan to reuse
        inputs.batch = batch
        self._seq_ids[:batch] = seq_ids
        self._qo[:batch + 1] = [int(x) for x in qo_indptr]
        if positions is None:
            inputs.positions = None
        else:
            n = len(positions)
            if n != self._qo[batch]:
                raise ValueError("sieve: %d positions for %d new rows" % (n, self._qo[batch]))
            if len(self._positions) < n:
                self._positions = (C.c_int32 * max(n, 2 * len(self._positions)))()
            self._positions[:n] = [int(x) for x in positions]
            inputs.positions = self._positions
        reusable = all(x is None or type(x) in (int, tuple) for x in plan[:3]) and not (
            plan[1] is None and phase == _capi.PHASE_PREFILL)  # a prefill's default rows follow q
        if reusable:
            self._plan = plan

    def end_step(self, phase, seq_ids):
        """Every layer of the step ran for `seq_ids`: policies do cross-layer work (eviction)."""
        if isinstance(seq_ids, int):
            seq_ids = (seq_ids,)
        ids = _int_array(seq_ids, len(seq_ids))
        try:
            p = PHASES[phase]
        except KeyError:
            raise ValueError("sieve: phase %r is neither 'prefill' nor 'decode'" % (phase,)) from None
        self._check(lib.sieve_session_end_step(self._h, p, ids, len(seq_ids)))

    def synchronize(self):
        """Wait for the device work enqueued so far (no-op on the CPU)."""
        self._check(lib.sieve_session_synchronize(self._h))

    @property
    def kv_bytes(self):
        """K/V (and sidecar) bytes resident over all layers."""
        n = C.c_uint64()
        self._check(lib.sieve_session_kv_bytes(self._h, C.byref(n)))
        return n.value

    @property
    def kv_store(self):
        return lib.sieve_session_kv_store_name(self._h).decode()

    _destroy_name = "sieve_session_destroy"
