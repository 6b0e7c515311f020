"""The export side of the binding (sieve._dlpack) with recording producers: which stream each
tensor of a call is exported for (one synchronisation per stream-wide producer, every tensor for
the others), and that the address handed to C is the array's own DLTensor."""
import ctypes as C

import numpy as np
import pytest

from sieve import _capi, _dlpack

STREAM = 7


class _Producer:
    """Wraps a numpy array; records the `stream` each __dlpack__ call asked for."""

    def __init__(self, array, log, host=False):
        self.array, self.log, self.host = array, log, host

    def __dlpack__(self, stream=None):
        if stream is not None and self.host:
            raise BufferError("a host array takes no stream")  # as numpy does
        self.log.append((type(self).__name__, stream))
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class Wide(_Producer):
    """Stands for a torch tensor: its stream sync covers the whole current stream."""


Wide.__module__ = "torch.testing_fake"


class PerArray(_Producer):
    """Stands for a producer that tracks readiness per array (jax)."""


PerArray.__module__ = "jax_fake"


def arrays(n):
    return [np.arange(6, dtype=np.float32).reshape(2, 3) + i for i in range(n)]


def test_a_stream_wide_producer_is_synchronised_once_per_call():
    log, keep = [], []
    a = arrays(4)
    addresses = _dlpack.export_all([Wide(a[0], log), Wide(a[1], log), None, Wide(a[2], log), Wide(a[3], log)],
                                   STREAM, keep)
    assert log == [("Wide", STREAM), ("Wide", -1), ("Wide", -1), ("Wide", -1)]
    assert addresses[2] is None and len(keep) == 4
    for x, address in zip(a, addresses[:2] + addresses[3:]):
        assert _capi.DLTensor.from_address(address).data == x.ctypes.data
    log.clear()  # the next call synchronises again
    _dlpack.export_all([Wide(a[0], log), Wide(a[1], log)], STREAM, [])
    assert log == [("Wide", STREAM), ("Wide", -1)]


def test_other_producers_are_asked_for_every_tensor():
    log = []
    a = arrays(3)
    _dlpack.export_all([PerArray(a[0], log), Wide(a[1], log), PerArray(a[2], log), Wide(a[0], log)], STREAM, [])
    assert log == [("PerArray", STREAM), ("Wide", STREAM), ("PerArray", STREAM), ("Wide", -1)]


def test_a_host_array_does_not_count_as_the_synchronisation():
    """A host array refuses the stream (exported plainly, the runtime then names the device
    mismatch): the next tensor of the same producer is still exported for the stream."""
    log = []
    a = arrays(2)
    _dlpack.export_all([Wide(a[0], log, host=True), Wide(a[1], log)], STREAM, [])
    assert log == [("Wide", None), ("Wide", STREAM)]


def test_no_stream_and_ready_pass_through():
    log = []
    a = arrays(2)
    _dlpack.export_all([Wide(a[0], log), PerArray(a[1], log)], None, [])
    _dlpack.export_all([Wide(a[0], log), PerArray(a[1], log)], -1, [])
    assert log == [("Wide", None), ("PerArray", None), ("Wide", -1), ("PerArray", -1)]


def test_the_capsules_keep_the_tensors_alive():
    keep = []
    address = _dlpack.export_all([np.full((4, 4), 3.0, np.float32)], None, keep)[0]
    t = _capi.DLTensor.from_address(address)
    assert (t.ndim, t.shape[0], t.shape[1]) == (2, 4, 4)
    assert C.cast(t.data, C.POINTER(C.c_float))[15] == 3.0  # the array lives as long as `keep`


def test_torch_tensors_are_exported_by_to_dlpack_and_a_tensor_that_requires_grad_is_refused():
    """The torch path (no stream to wait for): the DLTensor is the tensor's own memory, the
    capsule keeps it alive, and a tensor that requires grad is refused as Tensor.__dlpack__ does
    (the C side writes `out` behind autograd's back)."""
    torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")
    keep = []
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)[1:]
    address = _dlpack.export_all([t], None, keep)[0]
    d = _capi.DLTensor.from_address(address)
    assert d.data + d.byte_offset == t.data_ptr() and (d.shape[0], d.shape[1]) == (2, 4)
    del t
    assert C.cast(d.data + d.byte_offset, C.POINTER(C.c_float))[0] == 4.0  # alive through `keep`
    with pytest.raises(RuntimeError, match="require gradient"):
        _dlpack.export_all([torch.ones(2, requires_grad=True)], None, [])
    with pytest.raises(RuntimeError, match="require gradient"):
        _dlpack.export_all([torch.ones(2, requires_grad=True)], -1, [])
