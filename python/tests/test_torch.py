"""torch tensors through the binding: CPU (equal to the numpy path, written in place) and CUDA
(on torch's current stream, on the session's own stream or another torch stream with any of
q/k/v finished last by torch, on the legacy default stream; each ordered with torch's kernels).
Skips with a message without torch or without a GPU."""
import numpy as np
import pytest

import sieve
from reference import attention, f32_bound

torch = pytest.importorskip("torch", reason="torch is not installed (Debian: python3-torch)")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the CUDA tests run on a GPU machine")

HQ, HKV, D, T = 8, 2, 64, 48


def make(runtime, **kw):
    return sieve.Session(runtime, n_layers=1, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D, max_seq_len=128, **kw)


def inputs(seed=11):
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(T, h, D, generator=g) * 2 - 1 for h in (HQ, HKV, HKV)]


def check_dense(q, k, v, out):
    q, k, v, out = (x.detach().cpu().float().numpy() for x in (q, k, v, out))
    ref = attention(q, k, v, list(range(T)))
    assert np.abs(out - ref).max() <= f32_bound(q, k, v, T)


def test_cpu_tensors_equal_the_numpy_path_and_are_written_in_place(runtime):
    q, k, v = inputs()
    a, b = make(runtime), make(runtime)
    out = torch.full_like(q, float("nan"))
    ptr = out.data_ptr()
    assert a.attend(0, "prefill", q, k, v, out, a.add_sequence()) is out and out.data_ptr() == ptr
    out_np = np.empty((T, HQ, D), np.float32)
    b.attend(0, "prefill", q.numpy(), k.numpy(), v.numpy(), out_np, b.add_sequence())
    assert np.array_equal(out.numpy(), out_np)
    check_dense(q, k, v, out)


def test_cpu_bfloat16_and_strided_tensors(runtime):
    q, k, v = (x.bfloat16() for x in inputs())
    s = make(runtime, kv_dtype=torch.bfloat16)
    out = torch.empty_like(q)
    seq = s.add_sequence()
    with pytest.raises(sieve.SieveError, match="q must be compact row-major"):
        s.attend(0, "prefill", q.transpose(0, 1).contiguous().transpose(0, 1), k, v, out, seq)
    s.attend(0, "prefill", q, k, v, out, seq)
    assert torch.isfinite(out.float()).all()


def _filled_late(stream, src):
    """A tensor that `stream` fills only after ~50 ms of GPU sleep: read before that, it is NaN."""
    dst = torch.full_like(src, float("nan"))
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)
        dst.copy_(src, non_blocking=True)
    return dst


@cuda
def test_cuda_session_runs_on_torchs_current_stream(runtime):
    q, k, v = (x.cuda() for x in inputs())
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        s = make(runtime, device="cuda", cuda_stream=torch.cuda.current_stream())
        assert s.cuda_stream == side.cuda_stream
        q_late = _filled_late(side, q)
        out = torch.empty_like(q)
        s.attend(0, "prefill", q_late, k, v, out, s.add_sequence())
        result = out.clone()  # on `side`, after the session's kernels: no synchronize needed
    side.synchronize()
    check_dense(q, k, v, result)


@cuda
@pytest.mark.parametrize("late", ["q", "k", "v"])
@pytest.mark.parametrize("session_stream", ["its own", "a torch stream not current"])
def test_cuda_attend_waits_for_the_producers_stream(runtime, session_stream, late):
    """Tensors produced on torch's current stream, which is not the session's: attend() (no
    ready=) exports them for the session's stream, and one synchronisation per call (the first
    torch tensor's) orders all of torch's queued work before the session's kernels, so whichever
    of q/k/v torch finishes last, Sieve reads it finished (dropping the sync reads NaN)."""
    q, k, v = (x.cuda() for x in inputs())
    torch.cuda.synchronize()
    other = torch.cuda.Stream() if session_stream != "its own" else None
    s = make(runtime, device="cuda", cuda_stream=other)
    assert s.cuda_stream not in (None, torch.cuda.current_stream().cuda_stream)
    given = {"q": q, "k": k, "v": v}
    given[late] = _filled_late(torch.cuda.current_stream(), given[late])
    out = torch.empty_like(q)
    s.attend(0, "prefill", given["q"], given["k"], given["v"], out, s.add_sequence())
    s.synchronize()
    check_dense(q, k, v, out)


@cuda
def test_cuda_session_on_the_legacy_default_stream(runtime):
    q, k, v = (x.cuda() for x in inputs())
    s = make(runtime, device="cuda", cuda_stream=torch.cuda.default_stream())
    assert s.cuda_stream == 1  # cudaStreamLegacy
    out = torch.empty_like(q)
    s.attend(0, "prefill", q, k, v, out, s.add_sequence())
    torch.cuda.synchronize()
    check_dense(q, k, v, out)


@cuda
def test_cuda_errors_carry_the_runtime_message(runtime):
    q, k, v = inputs()
    s = make(runtime, device="cuda", cuda_stream=torch.cuda.current_stream())
    seq = s.add_sequence()
    with pytest.raises(sieve.SieveError, match="q is on cpu, the session runs on cuda:0"):
        s.attend(0, "prefill", q, k.cuda(), v.cuda(), torch.empty_like(q).cuda(), seq)
    with pytest.raises(sieve.SieveError, match="v is on cpu, the session runs on cuda:0"):
        s.attend(0, "prefill", q.cuda(), k.cuda(), v.numpy(), torch.empty_like(q).cuda(), seq)


@pytest.mark.parametrize("first", ["sieve", "torch"])
def test_sieve_and_torch_import_in_either_order(first):
    """A fresh interpreter imports sieve and torch in either order, runs a layer and exits cleanly
    (on the GPU machine the runtime loaded at `import sieve`, before torch, made `import torch`
    abort: free(): invalid pointer; the package now loads it at first use)."""
    import subprocess
    import sys
    second = "torch" if first == "sieve" else "sieve"
    code = ("import %s, %s\n"
            "import numpy as np\n"
            "s = sieve.Session(sieve.Runtime(use_env=False), n_layers=1, n_q_heads=2, n_kv_heads=1, head_dim=8,\n"
            "                  max_seq_len=16, chain=None)\n"
            "q = torch.ones(3, 2, 8); kv = torch.ones(3, 1, 8); out = torch.empty_like(q)\n"
            "s.attend(0, 'prefill', q, kv, kv, out, s.add_sequence())\n"
            "assert torch.allclose(out, q)\n" % (first, second))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
