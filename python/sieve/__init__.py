"""Sieve from Python: the runtime, its plugins, chains and sessions over the C host API.

    import sieve
    rt = sieve.Runtime()
    s = sieve.Session(rt, n_layers=1, n_q_heads=8, n_kv_heads=2, head_dim=64, max_seq_len=256,
                      chain="decode:*=quest(token_budget=64)")
    seq = s.add_sequence()
    s.attend(0, "prefill", q, k, v, out, seq)   # numpy / torch tensors, by DLPack, no copy
    s.end_step("prefill", seq)

`sieve.transformers.use(model, chain=...)` runs a Hugging Face model's attention through a session.
The runtime library is the one this package was built or installed with ($SIEVE_LIBRARY overrides).
"""
from ._capi import HOST_API_MAJOR, HOST_API_MINOR, library_path
from ._errors import SieveError
from .runtime import Chain, Param, Plugin, Runtime
from .session import Session

__all__ = ["Chain", "Param", "Plugin", "Runtime", "Session", "SieveError", "library_path",
           "HOST_API_MAJOR", "HOST_API_MINOR"]
