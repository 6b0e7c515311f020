"""The synthetic long-context tasks: their vocabulary and their instances, drawn from one
documented counter-based PRNG so that `sieve eval --task` (core/model/src/task_instances.cpp)
builds exactly the instances this file builds for the same (task, length, seed, index).

PRNG (splitmix64, all arithmetic mod 2^64):
    GAMMA = 0x9E3779B97F4A7C15
    mix(z): z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) * 0x94D049BB133111EB; z ^ z>>31
    h     = mix(mix(mix(seed + GAMMA) ^ task_id) ^ length)      one stream family per task/length
    state = mix(h + GAMMA * (index + 1))                        instance `index`
    draw(j) = mix(state + GAMMA * (j + 1))                      its j-th draw (splitmix64's output j)
    below(j, n) = draw(j) mod n                                 (bias < n / 2^64: none in practice)
    order(j, n) = the indices 0..n-1 sorted by (draw(j + i), i)  a random permutation

Vocabulary (VOCAB = 256 tokens; 6..15 and 26..31 unused):
    0 PAD, 1 BOS, 2 KEY (passkey marker), 3 QUERY, 4 SEP, 5 COPY
    16..25 digits, 32..159 keys (128), 160..223 values (64), 224..255 filler (32)

Every instance is `length` tokens: BOS, a context of filler with the task's items placed in it,
then the task's query section. The prompt is its first `length - len(continuation)` tokens; the
continuation is fed one token at a time (teacher forcing) and the prediction before each SCORED
continuation token is compared with it. Position t of the instance uses draw(t) for its filler
(t < length); the task's own draws start at j = length.

    passkey: KEY d1..d5 at p = 1 + below(L+5, L-12); ends QUERY | d1..d5 (all 5 scored);
             d_k = 16 + below(L+k, 10).
    mqar:    m = pairs(L) key-value pairs; the context (positions 1..C, C = L-2m-2) is cut into m
             segments of C // m tokens; pair i sits at 1 + i*(C//m) + below(L+NK+m+i, C//m - 1),
             key 32 + order(L, NK)[i], value 160 + below(L+NK+i, 64); position L-2m-1 is SEP, then
             all m pairs are queried as `key value` in the order order(L+NK+2m, m). The prompt ends
             with the first queried key; the values are scored, the later keys only fed.
    copy:    a span of S = 16 distinct keys 32 + order(L, NK)[0..S-1] at 1 + below(L+NK, C-S+1),
             C = L-S-2; ends COPY s1 | s2..sS (all scored).
"""
import numpy as np

VOCAB = 256
PAD, BOS, KEY, QUERY, SEP, COPY = 0, 1, 2, 3, 4, 5
DIGIT0, N_DIGITS = 16, 10
KEY0, N_KEYS = 32, 128
VALUE0, N_VALUES = 160, 64
FILLER0, N_FILLER = 224, 32
PASSKEY_DIGITS = 5
COPY_SPAN = 16
TASKS = {"passkey": 1, "mqar": 2, "copy": 3}  # name -> task_id in the PRNG

GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mqar_pairs(length):
    """Key-value pairs of an MQAR instance of `length` tokens: length/32 within [8, 64]."""
    return int(min(64, max(8, length // 32)))


def min_length(task):
    """The shortest instance the task's layout fits in."""
    return {"passkey": 16, "mqar": 64, "copy": 3 * COPY_SPAN}[task]


def mix(z):
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def instance_states(task, length, seed, indices):
    """The PRNG state of each instance index (uint64 [B])."""
    with np.errstate(over="ignore"):
        h = mix(np.uint64(seed % 2**64) + GAMMA)
        h = mix(h ^ np.uint64(TASKS[task]))
        h = mix(h ^ np.uint64(length))
        idx = np.asarray(indices, dtype=np.uint64)
        return mix(h + GAMMA * (idx + np.uint64(1)))


class Draws:
    """draw(j) for a batch of instance states: uint64 [B, len(j)]."""

    def __init__(self, states):
        self.states = states[:, None]

    def __call__(self, first, count):
        j = np.arange(first, first + count, dtype=np.uint64)[None, :]
        with np.errstate(over="ignore"):
            return mix(self.states + GAMMA * (j + np.uint64(1)))

    def below(self, first, count, n):
        return (self(first, count) % np.uint64(n)).astype(np.int64)

    def order(self, first, n):
        # Sorted by (draw, index): a stable sort of the draws.
        return np.argsort(self(first, n), axis=1, kind="stable")


def generate(task, length, seed, indices):
    """Instances `indices` of `task` at `length` tokens under `seed`.

    Returns (tokens int64 [B, length], scored bool [B, length], prompt_len): scored[b, t] says the
    prediction made at t-1 for token t is graded; every instance's prompt is tokens[:, :prompt_len].
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r} (known: {', '.join(TASKS)})")
    L = int(length)
    if L < min_length(task):
        raise ValueError(f"{task} needs at least {min_length(task)} tokens, got {L}")
    d = Draws(instance_states(task, L, seed, indices))
    B = d.states.shape[0]
    rows = np.arange(B)[:, None]
    tok = FILLER0 + d.below(0, L, N_FILLER)
    tok[:, 0] = BOS
    scored = np.zeros((B, L), dtype=bool)
    if task == "passkey":
        n = PASSKEY_DIGITS
        digits = DIGIT0 + d.below(L, n, N_DIGITS)
        p = 1 + d.below(L + n, 1, L - 12)[:, 0]
        tok[rows, p[:, None] + np.arange(n + 1)] = np.concatenate([np.full((B, 1), KEY), digits], axis=1)
        tok[:, L - n - 1] = QUERY
        tok[:, L - n:] = digits
        scored[:, L - n:] = True
        prompt = L - n
    elif task == "mqar":
        m = mqar_pairs(L)
        C = L - 2 * m - 2
        seg = C // m
        keys = KEY0 + d.order(L, N_KEYS)[:, :m]
        values = VALUE0 + d.below(L + N_KEYS, m, N_VALUES)
        pos = 1 + np.arange(m)[None, :] * seg + d.below(L + N_KEYS + m, m, seg - 1)
        tok[rows, pos] = keys
        tok[rows, pos + 1] = values
        tok[:, L - 2 * m - 1] = SEP
        q = d.order(L + N_KEYS + 2 * m, m)
        tok[:, L - 2 * m::2] = np.take_along_axis(keys, q, axis=1)
        tok[:, L - 2 * m + 1::2] = np.take_along_axis(values, q, axis=1)
        scored[:, L - 2 * m + 1::2] = True
        prompt = L - 2 * m + 1
    else:  # copy
        S = COPY_SPAN
        C = L - S - 2
        span = KEY0 + d.order(L, N_KEYS)[:, :S]
        p = 1 + d.below(L + N_KEYS, 1, C - S + 1)[:, 0]
        tok[rows, p[:, None] + np.arange(S)] = span
        tok[:, L - S - 1] = COPY
        tok[:, L - S:] = span
        scored[:, L - S + 1:] = True
        prompt = L - S + 1
    return tok, scored, prompt
