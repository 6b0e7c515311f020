"""Float64 attention reference and the f32 rounding bound the tests compare against.

Bound (per output element, dense attention in f32 over n keys of head_dim d, scale s): a logit
is a d-term dot product, off by at most gamma_d * s * |q| * |k|; through the softmax that moves a
weight by at most twice that, relatively; the weighted sum of n values adds gamma_n. So
|o - o64| <= max|v| * (2 * gamma_d * s * |q| * |k| + gamma_n + 3u), and a factor 2 covers the kernel's
online-softmax rescaling (one more multiply per key block) and the order it sums in.
"""
import math

import numpy as np

U32 = 2.0 ** -24  # f32 unit roundoff


def gamma(n, u=U32):
    return n * u / (1 - n * u)


def attention(q, k, v, positions, scale=None):
    """q [n, hq, d]; k, v [T, hkv, d] (all of the sequence's keys, position = index); row i
    attends keys 0..positions[i] (causal). float64."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    n, hq, d = q.shape
    group = hq // k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros((n, hq, d))
    for i in range(n):
        keys = positions[i] + 1
        for h in range(hq):
            logits = k[:keys, h // group] @ q[i, h] * scale
            w = np.exp(logits - logits.max())
            out[i, h] = w @ v[:keys, h // group] / w.sum()
    return out


def magnitudes(q, k, v):
    """(largest |q| row norm, largest |k| row norm, largest |v| entry): what the bound needs."""
    return (np.linalg.norm(np.asarray(q, np.float64), axis=-1).max(),
            np.linalg.norm(np.asarray(k, np.float64), axis=-1).max(), np.abs(np.asarray(v, np.float64)).max())


def bound_from(qn, kn, vmax, d, n_keys):
    return 2 * vmax * (2 * gamma(d) * qn * kn / math.sqrt(d) + gamma(n_keys) + 3 * U32)


def f32_bound(q, k, v, n_keys):
    """q: the call's queries; k, v: every key and value the call attends over."""
    return bound_from(*magnitudes(q, k, v), q.shape[-1], n_keys)
