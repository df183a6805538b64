"""MAD token-manipulation tasks (``shared/reference/tasks.md`` §1), vectorised over sequences.

Every generator takes one ``numpy.random.Generator`` and returns int64 arrays
``(inputs, targets)`` of shape ``(n, length)``; ignored targets are ``-100``. Nothing touches
numpy's or torch's global RNG.

* :func:`in_context_recall` — multi-query recall (the MAD default), with the noisy variant
  (``frac_noise > 0``): keys are the first half of the non-noise vocabulary, values the second
  half, noise tokens the top ``noise_vocab_size`` ids (as in MAD). ``scored="test"`` scores only
  values of keys seen before (repeats and the final probe); ``scored="train"`` gives MAD's
  training targets, the plain next token everywhere.
* :func:`fuzzy_in_context_recall` — keys/values are motifs (tuples of distinct tokens), left-padded.
* :func:`selective_copying`, :func:`compression`, :func:`memorization`.
"""
from __future__ import annotations

import numpy as np

IGNORE = -100

__all__ = ["in_context_recall", "fuzzy_in_context_recall", "selective_copying", "compression",
           "memorization", "memorization_kv_map", "IGNORE"]


def in_context_recall(rng: np.random.Generator, n: int, vocab_size: int = 16,
                      seq_len: int = 64, noise_vocab_size: int = 0, frac_noise: float = 0.0,
                      scored: str = "test"):
    """Multi-query in-context recall. Raw sequence: ``seq_len/2`` (key, value) pairs, the last
    one a probe that repeats a key already shown; a key's value is fixed per sequence on first
    use. With noise, each of the first ``seq_len/2 - 1`` pairs is, with probability
    ``frac_noise``, a pair of noise tokens instead (never the one pair at a random index, so at
    least one key is shown before the probe). Inputs are ``seq[:-1]`` (length ``seq_len - 1``).
    """
    if seq_len % 2:
        raise ValueError(f"seq_len must be even, got {seq_len}")
    if scored not in ("test", "train"):
        raise ValueError(f"scored must be 'test' or 'train', got {scored!r}")
    if not 0 <= frac_noise < 1:
        raise ValueError("frac_noise must be in [0, 1)")
    if frac_noise > 0 and noise_vocab_size <= 0:
        raise ValueError("noise_vocab_size must be > 0 when frac_noise > 0")
    n_kv = vocab_size - (noise_vocab_size if frac_noise > 0 else 0)
    n_keys = n_kv // 2
    n_vals = n_kv - n_keys
    if n_keys < 1 or n_vals < 1:
        raise ValueError(f"vocab_size={vocab_size} leaves no keys/values")
    P = seq_len // 2                     # pairs, the last one the probe
    keys = rng.integers(0, n_keys, size=(n, P - 1), dtype=np.int64)
    val_of_key = rng.integers(n_keys, n_kv, size=(n, n_keys), dtype=np.int64)
    rows = np.arange(n)[:, None]
    vals = val_of_key[rows, keys]
    if frac_noise > 0:
        keep = rng.integers(0, P - 1, size=n)
        noise = rng.random((n, P - 1)) < frac_noise
        noise[np.arange(n), keep] = False
        noise_tok = rng.integers(n_kv, n_kv + noise_vocab_size, size=(n, P - 1, 2),
                                 dtype=np.int64)
    else:
        noise = np.zeros((n, P - 1), bool)
        noise_tok = None
    # was the key shown (in a non-noise pair) earlier in the sequence?
    onehot = np.zeros((n, P - 1, n_keys), bool)
    onehot[rows, np.arange(P - 1)[None, :], keys] = True
    onehot &= ~noise[:, :, None]
    shown_before = np.cumsum(onehot, axis=1) - onehot      # counts strictly before each pair
    repeat = (shown_before[rows, np.arange(P - 1)[None, :], keys] > 0) & ~noise
    # probe: uniform over the distinct keys shown
    shown = onehot.any(axis=1)                              # (n, n_keys)
    u = rng.random(n)
    cnt = shown.sum(1)
    pick = np.minimum((u * cnt).astype(np.int64), cnt - 1)
    csum = np.cumsum(shown, axis=1)
    probe = (csum > pick[:, None]).argmax(axis=1)
    probe_val = val_of_key[np.arange(n), probe]

    seq = np.empty((n, seq_len), np.int64)
    tgt = np.full((n, seq_len), IGNORE, np.int64)
    k_tok = np.where(noise, noise_tok[..., 0], keys) if noise_tok is not None else keys
    v_tok = np.where(noise, noise_tok[..., 1], vals) if noise_tok is not None else vals
    seq[:, 0:2 * (P - 1):2] = k_tok
    seq[:, 1:2 * (P - 1):2] = v_tok
    seq[:, -2] = probe
    seq[:, -1] = probe_val
    tgt[:, 1:2 * (P - 1):2] = np.where(repeat, vals, IGNORE)
    tgt[:, -1] = probe_val
    inputs = seq[:, :-1]
    targets = seq[:, 1:].copy() if scored == "train" else tgt[:, 1:]
    return np.ascontiguousarray(inputs), np.ascontiguousarray(targets)


def fuzzy_in_context_recall(rng: np.random.Generator, n: int, vocab_size: int = 16,
                            seq_len: int = 128, k_motif_size: int = 3, v_motif_size: int = 3,
                            scored: str = "test"):
    """Fuzzy (motif) multi-query recall. Keys are tuples of 1..``k_motif_size`` distinct key
    tokens (test sequences use exactly ``k_motif_size``), values tuples of
    1..``v_motif_size`` distinct value tokens; pad token ``V-1`` on the left; keys
    ``0..(V-1)//2-1``, values ``(V-1)//2..V-2``. A probe pair is placed at a random point and
    repeated at the end; values of keys seen before (and of the final probe) are scored.
    Inputs/targets have length ``seq_len`` (raw sequence ``seq_len + 1``, shifted)."""
    pad = vocab_size - 1
    n_kv = vocab_size - 1
    key_vocab = np.arange(n_kv // 2)
    val_vocab = np.arange(n_kv // 2, n_kv)
    ksizes = [k_motif_size] if scored == "test" else list(range(1, k_motif_size + 1))
    vsizes = list(range(1, v_motif_size + 1))
    if len(key_vocab) < k_motif_size or len(val_vocab) < v_motif_size:
        raise ValueError("vocabulary too small for the motif sizes")

    def motif(vocab, size):
        return tuple(int(t) for t in rng.permutation(vocab)[:size])

    X = np.empty((n, seq_len), np.int64)
    Y = np.empty((n, seq_len), np.int64)
    for r in range(n):
        kp_size = int(rng.choice(ksizes))
        k_probe = motif(key_vocab, kp_size)
        v_probe = motif(val_vocab, int(rng.choice(vsizes)))
        probe_len = kp_size + len(v_probe)
        probe_at = int(rng.integers(0, max(1, seq_len - 2 * probe_len - k_motif_size
                                           - v_motif_size)))
        kv, shown = {}, set()
        seq, tgt = [], []
        added = False
        limit = seq_len - probe_len - (k_motif_size + v_motif_size)
        while len(seq) < limit - (0 if added else probe_len):
            if len(seq) >= probe_at and not added:
                seq += list(k_probe) + list(v_probe)
                tgt += [IGNORE] * probe_len
                kv[k_probe] = v_probe
                shown.add(k_probe)
                added = True
                continue
            k = motif(key_vocab, int(rng.choice(ksizes)))
            if k == k_probe:
                v = v_probe
                added = True
            elif k in kv:
                v = kv[k]
            else:
                v = motif(val_vocab, int(rng.choice(vsizes)))
                kv[k] = v
            seq += list(k) + list(v)
            tgt += [IGNORE] * len(k) + (list(v) if k in shown else [IGNORE] * len(v))
            shown.add(k)
        if not added:   # the probe pair was not placed yet: show it before the final query
            seq += list(k_probe) + list(v_probe)
            tgt += [IGNORE] * probe_len
        seq += list(k_probe) + list(v_probe)
        tgt += [IGNORE] * kp_size + list(v_probe)
        if len(seq) > seq_len + 1:
            raise ValueError(f"seq_len={seq_len} too short for the motif sizes")
        n_pad = seq_len + 1 - len(seq)
        seq = [pad] * n_pad + seq
        tgt = [IGNORE] * n_pad + tgt
        X[r] = seq[:-1]
        Y[r] = seq[1:] if scored == "train" else tgt[1:]
    return X, Y


def selective_copying(rng: np.random.Generator, n: int, vocab_size: int = 16,
                      seq_len: int = 64, n_copy: int = 16):
    """``n_copy`` data tokens from ``0..V-3`` (with replacement) with ``L - 2 n_copy - 1``
    blanks (``V-2``) inserted among them (never after the last one: each blank goes before a
    uniformly chosen data token), then the copy token ``V-1`` and ``n_copy`` blanks. Targets are
    ``-100`` up to and including the copy token, then the data tokens in order."""
    if seq_len <= 2 * n_copy + 1:
        raise ValueError(f"selective copying needs seq_len > 2*n_copy + 1 "
                         f"({seq_len} <= {2 * n_copy + 1})")
    if n_copy < 1:
        raise ValueError("n_copy must be >= 1")
    copy_tok, blank = vocab_size - 1, vocab_size - 2
    n_blank = seq_len - 2 * n_copy - 1
    data = rng.integers(0, vocab_size - 2, size=(n, n_copy), dtype=np.int64)
    where = rng.integers(0, n_copy, size=(n, n_blank))     # blank goes before data token `where`
    counts = np.zeros((n, n_copy), np.int64)
    np.add.at(counts, (np.repeat(np.arange(n), n_blank), where.reshape(-1)), 1)
    pos = np.arange(n_copy)[None, :] + np.cumsum(counts, axis=1)
    head = n_copy + n_blank
    X = np.full((n, seq_len), blank, np.int64)
    X[np.arange(n)[:, None], pos] = data
    X[:, head] = copy_tok
    Y = np.full((n, seq_len), IGNORE, np.int64)
    Y[:, head + 1:] = data
    return X, Y


def compression(rng: np.random.Generator, n: int, vocab_size: int = 16, seq_len: int = 64):
    """``L-1`` uniform tokens from ``0..V-2`` then the compression token ``V-1``; targets =
    inputs (every position scored)."""
    X = np.empty((n, seq_len), np.int64)
    X[:, :-1] = rng.integers(0, vocab_size - 1, size=(n, seq_len - 1))
    X[:, -1] = vocab_size - 1
    return X, X.copy()


def memorization_kv_map(vocab_size: int, seed: int = 12345) -> dict[int, int]:
    """The fixed key→value bijection: keys ``0..(V-1)//2-1``, values from
    ``(V-1)//2..V-2``, matched by a permutation drawn from ``seed`` (independent of the data
    RNG, so every data set shares it)."""
    n = vocab_size - 1
    keys = np.arange(n // 2)
    values = np.arange(n // 2, n)
    g = np.random.default_rng(seed)
    values = g.permutation(values)[: len(keys)]
    return {int(k): int(v) for k, v in zip(keys, values)}


def memorization(rng: np.random.Generator, n: int, vocab_size: int = 256, seq_len: int = 32,
                 kv_map_seed: int = 12345):
    """Pairs ``[key, insert]`` (insert token ``V-1``); the target at the insert position is the
    key's value under :func:`memorization_kv_map`, ``-100`` at key positions."""
    if seq_len % 2:
        raise ValueError("seq_len must be even")
    kv = memorization_kv_map(vocab_size, kv_map_seed)
    lut = np.full(vocab_size, IGNORE, np.int64)
    lut[list(kv.keys())] = list(kv.values())
    keys = rng.integers(0, len(kv), size=(n, seq_len // 2), dtype=np.int64)
    X = np.empty((n, seq_len), np.int64)
    X[:, 0::2] = keys
    X[:, 1::2] = vocab_size - 1
    Y = np.full((n, seq_len), IGNORE, np.int64)
    Y[:, 1::2] = lut[keys]
    return X, Y
