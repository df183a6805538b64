"""Chomsky-hierarchy tasks (``shared/reference/tasks.md`` §3): parity, cycle navigation, modular
arithmetic without and with brackets.

Every sequence has one answer. A sample of length ``L`` is ``L`` task tokens followed by the query
token ``=``; the model reads its answer at that last position (the position before the answer
token). Targets are ``-100`` everywhere except the last position, which holds the label in
``0..num_classes-1``. Batches have one length (as in the reference implementation); training
draws fresh batches every step with a length uniform in ``[min_len, max_len]``.

Token ids
=========
* parity: bits ``0, 1``; ``= 2``. Classes 2.
* cycle navigation (cycle of 5, start 0): ``0`` stay, ``1`` step +1, ``2`` step −1; ``= 3``.
  Classes 5 (the final position).
* modular arithmetic (mod 5): digits ``0..4``; ``+ 5``, ``- 6``, ``* 7``; without brackets
  ``= 8``; with brackets ``( 8``, ``) 9``, ``= 10``. Classes 5.
  Without brackets the length is odd (an even length is reduced by one, as in the reference):
  digits alternate with operators, standard precedence (``*`` before ``+``/``-``, left to right).
  With brackets the expression has exactly the requested length, from the recursive grammar
  ``d | -d | (d) | (-d) | (L op R)``.
"""
from __future__ import annotations

import numpy as np

__all__ = ["CHOMSKY_TASKS", "ChomskyTask", "parity_batch", "cycle_navigation_batch",
           "modular_arithmetic_batch", "modular_arithmetic_brackets_batch",
           "eval_mod_arith", "detokenize_arith", "chomsky_test_set", "chomsky_train_batch"]

MOD = 5
PLUS, MINUS, TIMES, LPAR, RPAR = MOD, MOD + 1, MOD + 2, MOD + 3, MOD + 4
_CHARS = {PLUS: "+", MINUS: "-", TIMES: "*", LPAR: "(", RPAR: ")"}


class ChomskyTask:
    def __init__(self, name, vocab_size, num_classes, query_token, sampler):
        self.name = name
        self.vocab_size = vocab_size          # input tokens, including the query token
        self.num_classes = num_classes
        self.query_token = query_token
        self._sampler = sampler               # (rng, batch, length) -> (tokens, labels)

    def sample(self, rng: np.random.Generator, batch: int, length: int):
        """``(inputs, targets)`` int64 ``(batch, length + 1)``: tokens + query; label last."""
        tokens, labels = self._sampler(rng, batch, length)
        b, n = tokens.shape
        inputs = np.concatenate([tokens, np.full((b, 1), self.query_token, np.int64)], 1)
        targets = np.full((b, n + 1), -100, np.int64)
        targets[:, -1] = labels
        return inputs, targets


def parity_batch(rng, batch, length):
    bits = rng.integers(0, 2, size=(batch, length), dtype=np.int64)
    return bits, bits.sum(1) % 2


def cycle_navigation_batch(rng, batch, length, cycle=MOD):
    acts = rng.integers(0, 3, size=(batch, length), dtype=np.int64)
    steps = np.array([0, 1, -1], dtype=np.int64)[acts]
    return acts, steps.sum(1) % cycle


def eval_mod_arith(tokens, mod=MOD) -> int:
    """Value mod ``mod`` of a bracket-free token expression ``d op d op … d`` (standard
    precedence, left-associative)."""
    total, term, sign = 0, int(tokens[0]), 1
    for i in range(1, len(tokens), 2):
        op, d = int(tokens[i]), int(tokens[i + 1])
        if op == TIMES:
            term = (term * d) % mod
        else:
            total = (total + sign * term) % mod
            sign = 1 if op == PLUS else -1
            term = d
    return (total + sign * term) % mod


def modular_arithmetic_batch(rng, batch, length):
    if length % 2 == 0:
        length -= 1
    length = max(length, 1)
    toks = np.empty((batch, length), np.int64)
    toks[:, 0::2] = rng.integers(0, MOD, size=(batch, length // 2 + 1))
    toks[:, 1::2] = rng.integers(PLUS, TIMES + 1, size=(batch, length // 2))
    labels = _eval_batch_no_brackets(toks)
    return toks, labels


def _eval_batch_no_brackets(toks):
    """Vectorised version of :func:`eval_mod_arith` over rows."""
    b = toks.shape[0]
    total = np.zeros(b, np.int64)
    term = toks[:, 0].copy()
    sign = np.ones(b, np.int64)
    for i in range(1, toks.shape[1], 2):
        op, d = toks[:, i], toks[:, i + 1]
        mul = op == TIMES
        total = np.where(mul, total, (total + sign * term) % MOD)
        sign = np.where(mul, sign, np.where(op == PLUS, 1, -1))
        term = np.where(mul, (term * d) % MOD, d)
    return (total + sign * term) % MOD


def _gen_brackets(rng, length, out):
    """Append an expression of exactly ``length`` tokens to ``out``; return its value mod 5."""
    if length < 1:
        raise ValueError(f"expression length must be >= 1, got {length}")
    if length <= 4:
        d = int(rng.integers(0, MOD))
        if length == 1:
            out.append(d)
            return d
        if length == 2:
            out += [MINUS, d]
            return (-d) % MOD
        if length == 3:
            out += [LPAR, d, RPAR]
            return d
        out += [LPAR, MINUS, d, RPAR]
        return (-d) % MOD
    left = int(rng.integers(1, length - 3))
    right = length - left - 3
    out.append(LPAR)
    lv = _gen_brackets(rng, left, out)
    op = int(rng.integers(0, 3))
    out.append((PLUS, MINUS, TIMES)[op])
    rv = _gen_brackets(rng, right, out)
    out.append(RPAR)
    return ((lv + rv), (lv - rv), (lv * rv))[op] % MOD


def modular_arithmetic_brackets_batch(rng, batch, length):
    toks = np.empty((batch, length), np.int64)
    labels = np.empty(batch, np.int64)
    for i in range(batch):
        out: list[int] = []
        labels[i] = _gen_brackets(rng, length, out)
        toks[i] = out
    return toks, labels


def detokenize_arith(tokens) -> str:
    return "".join(_CHARS.get(int(t), str(int(t))) for t in tokens)


CHOMSKY_TASKS = {
    "parity": ChomskyTask("parity", 3, 2, 2, parity_batch),
    "cycle_navigation": ChomskyTask("cycle_navigation", 4, 5, 3, cycle_navigation_batch),
    "modular_arithmetic": ChomskyTask("modular_arithmetic", 9, 5, 8, modular_arithmetic_batch),
    "modular_arithmetic_brackets": ChomskyTask("modular_arithmetic_brackets", 11, 5, 10,
                                               modular_arithmetic_brackets_batch),
}


def chomsky_train_batch(task: ChomskyTask, rng, batch, min_len=3, max_len=40):
    """One training batch: its length is uniform in ``[min_len, max_len]``."""
    length = int(rng.integers(min_len, max_len + 1))
    return task.sample(rng, batch, length)


def chomsky_test_set(task: ChomskyTask, rng, n_test=8192, min_len=40, max_len=256,
                     batch_size=256):
    """A fixed test set, ``n_test`` sequences spread evenly over the lengths
    ``min_len..max_len`` (the first ``n_test mod n_lengths`` lengths get one more); returned as
    a list of equal-length ``(inputs, targets)`` batches of at most ``batch_size`` rows."""
    lengths = np.arange(min_len, max_len + 1)
    per, extra = divmod(n_test, len(lengths))
    batches = []
    for j, L in enumerate(lengths):
        n = per + (1 if j < extra else 0)
        for s in range(0, n, batch_size):
            bs = min(batch_size, n - s)
            if bs > 0:
                batches.append(task.sample(rng, bs, int(L)))
    return batches
