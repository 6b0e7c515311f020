"""Objects to DLTensor pointers through the DLPack protocol (`__dlpack__`), without a copy.

The producer (numpy, torch, cupy, jax ...) hands a "dltensor" capsule holding a DLManagedTensor
whose first member is the DLTensor the C host API takes; the capsule is kept alive for the call
and, never consumed, frees the managed tensor when it is collected (the array itself is not
touched). A device array is exported for the consumer's `stream` (the DLPack rule: the producer
makes its data ready on that stream; -1: the caller promises it already is).
"""
import ctypes as C

_get_pointer = C.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = C.c_void_p
_get_pointer.argtypes = [C.py_object, C.c_char_p]
_DLTENSOR = b"dltensor"


def export(obj, stream=None):
    """(capsule, DLTensor address) of `obj`. `stream` is passed to `__dlpack__` for device arrays."""
    try:
        method = obj.__dlpack__
    except AttributeError:
        raise TypeError("sieve: %s is not a DLPack tensor (numpy >= 1.22 array, torch tensor, ...)"
                        % type(obj).__name__) from None
    if stream is None:
        capsule = method()
    else:
        try:
            capsule = method(stream=stream)
        except Exception:
            # A host array takes no stream (numpy raises RuntimeError or BufferError, torch an
            # AssertionError): export it plainly and let the runtime name the device mismatch.
            if device_of(obj)[0] == 2:  # kDLCUDA: a real failure
                raise
            capsule = method()
    return capsule, _get_pointer(capsule, _DLTENSOR)


def device_of(obj):
    """(DLPack device type, id) of `obj`: kDLCPU = 1, kDLCUDA = 2."""
    dev = getattr(obj, "__dlpack_device__", None)
    if dev is None:
        raise TypeError("sieve: %s is not a DLPack tensor" % type(obj).__name__)
    t, i = dev()
    return int(t), int(i)
