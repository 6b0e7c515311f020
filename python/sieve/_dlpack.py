"""Objects to DLTensor pointers through the DLPack protocol (`__dlpack__`), without a copy.

The producer (numpy, torch, cupy, jax ...) hands a "dltensor" capsule holding a DLManagedTensor
whose first member is the DLTensor the C host API takes; the capsule is kept alive for the call
and, never consumed, frees the managed tensor when it is collected (the array itself is not
touched). A device array is exported for the consumer's `stream` (the DLPack rule: the producer
makes its data ready on that stream; -1: the caller promises it already is).

One synchronisation per call, not per tensor (export_all): torch and cupy meet the rule for a
whole stream at once (the consumer stream waits on an event recorded on the producer's current
stream, after all the work queued there), so after the first of a call's tensors from such a
producer was exported for the stream, its others are exported with -1. Other producers (jax
tracks readiness per array) are asked for every tensor.

torch tensors, the common case, take less host time (a decode step calls attend once per layer;
on an H200 torch's `__dlpack__` cost ~6 us a tensor and its stream wait ~17 us a call): where
torch's current CUDA stream is the consumer's stream there is nothing to wait for and no tensor
is exported for the stream; and a tensor exported with no stream goes through
`torch.utils.dlpack.to_dlpack`, the same DLPack export (a capsule owning a reference to the
tensor) without `__dlpack__`'s Python-level checks, of which the one that matters here is kept
(a tensor that requires grad is refused: the C side writes `out` behind autograd's back); the
others (conjugate bit, sparse layout) concern tensors the runtime refuses anyway (complex
dtypes; no strides).
"""
import ctypes as C
import sys

_get_pointer = C.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = C.c_void_p
_get_pointer.argtypes = [C.py_object, C.c_char_p]
_DLTENSOR = b"dltensor"
_STREAM_WIDE_PRODUCERS = ("torch", "cupy")  # top-level modules whose sync covers the current stream
_stream_wide = {}  # type -> bool, filled on first sight


def _export(obj, stream):
    """(capsule, DLTensor address, whether `stream` was honoured)."""
    try:
        method = obj.__dlpack__
    except AttributeError:
        raise TypeError("sieve: %s is not a DLPack tensor (numpy >= 1.22 array, torch tensor, ...)"
                        % type(obj).__name__) from None
    if stream is None:
        capsule, honoured = method(), False
    else:
        try:
            capsule, honoured = method(stream=stream), True
        except Exception:
            # A host array takes no stream (numpy raises RuntimeError or BufferError, torch an
            # AssertionError): export it plainly and let the runtime name the device mismatch.
            if device_of(obj)[0] == 2:  # kDLCUDA: a real failure
                raise
            capsule, honoured = method(), False
    return capsule, _get_pointer(capsule, _DLTENSOR), honoured


def export(obj, stream=None):
    """(capsule, DLTensor address) of `obj`. `stream` is passed to `__dlpack__` for device arrays."""
    capsule, address, _ = _export(obj, stream)
    return capsule, address


class _Torch:
    """torch.Tensor itself (not a subclass: it may override __dlpack__), its to_dlpack and its
    current CUDA stream, looked up once torch is imported (the package never imports it)."""
    tensor = to_dlpack = current_stream = None

    @classmethod
    def ready(cls):
        if cls.tensor is None and "torch" in sys.modules:
            torch = sys.modules["torch"]
            cls.to_dlpack, cls.current_stream = torch.utils.dlpack.to_dlpack, torch.cuda.current_stream
            cls.tensor = torch.Tensor
        return cls.tensor is not None

    @classmethod
    def on_stream(cls, stream):
        """Whether torch's current CUDA stream is `stream` (its default stream, 0, is the legacy
        one, DLPack's 1)."""
        try:
            return (cls.current_stream().cuda_stream or 1) == stream
        except (AssertionError, RuntimeError):  # torch without CUDA: the runtime names the device mismatch
            return False


def _export_torch(obj):
    if obj.requires_grad:  # as Tensor.__dlpack__ says it
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")
    capsule = _Torch.to_dlpack(obj)
    return capsule, _get_pointer(capsule, _DLTENSOR)


def export_all(objs, stream, keep):
    """DLTensor addresses of `objs` (None stays None), made ready on `stream` (None: host arrays;
    -1: no synchronisation) with one synchronisation per stream-wide producer (see above). The
    capsules are appended to `keep`, which must outlive the C call."""
    synced = ()
    torch_tensor = _Torch.tensor if _Torch.ready() else None
    addresses = []
    for obj in objs:
        if obj is None:
            addresses.append(None)
            continue
        kind = type(obj)
        s = stream
        if s is not None and s != -1:
            if kind in synced:
                s = -1
            elif kind is torch_tensor and _Torch.on_stream(s):
                s, synced = -1, synced + (kind,)  # made on the consumer's stream: nothing to wait for
        if kind is torch_tensor and (s is None or s == -1):
            capsule, address = _export_torch(obj)
        else:
            capsule, address, honoured = _export(obj, s)
            if honoured and s != -1:
                wide = _stream_wide.get(kind)
                if wide is None:
                    wide = _stream_wide[kind] = kind.__module__.partition(".")[0] in _STREAM_WIDE_PRODUCERS
                if wide:
                    synced += (kind,)
        keep.append(capsule)
        addresses.append(address)
    return addresses


def device_of(obj):
    """(DLPack device type, id) of `obj`: kDLCPU = 1, kDLCUDA = 2."""
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        raise TypeError("sieve: %s is not a DLPack tensor" % type(obj).__name__)
    t, i = dev()
    return int(t), int(i)
