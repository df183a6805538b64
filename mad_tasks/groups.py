"""Finite groups and their word problems (``shared/reference/tasks.md`` §2).

Elements of ``S_n`` are the permutations of ``(0..n-1)`` in lexicographic order (index 0 is the
identity); the product is composition ``(a·b)(i) = a(b(i))``. ``A_n`` keeps the even
permutations of ``S_n`` in the same order; ``Z_n`` is addition mod ``n``; direct products index
``(g, h)`` as ``g * |H| + h``.

A word-problem sequence is ``k`` i.i.d. uniform element indices ``x_0..x_{k-1}``; the target at
every position is the prefix product ``y_t = y_{t-1} · x_t`` (``y_0 = x_0``). Data sets hold
distinct sequences (sampled without replacement); train and test are disjoint.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

__all__ = ["Group", "symmetric_group", "alternating_group", "cyclic_group", "direct_product",
           "group_from_name", "prefix_products", "sample_distinct_sequences",
           "word_problem_dataset"]


@dataclass(frozen=True)
class Group:
    """A finite group given by its Cayley table ``table[a, b] = index(a · b)``."""

    name: str
    table: np.ndarray          # (n, n) int64
    elements: tuple            # human-readable elements, same order as the indices

    @property
    def order(self) -> int:
        return int(self.table.shape[0])

    @property
    def identity(self) -> int:
        rows = np.where((self.table == np.arange(self.order)[None, :]).all(axis=1))[0]
        return int(rows[0])

    def mul(self, a, b):
        return self.table[a, b]


def _perm_table(perms: np.ndarray) -> np.ndarray:
    """Cayley table of a set of permutations (rows of ``perms``) closed under composition."""
    n = perms.shape[1]
    comp = perms[:, perms]                         # comp[i, j, k] = perms[i, perms[j, k]]
    weights = n ** np.arange(n - 1, -1, -1, dtype=np.int64)
    codes = perms.astype(np.int64) @ weights       # lexicographic order <=> code order
    order = np.argsort(codes)
    sorted_codes = codes[order]
    comp_codes = comp.astype(np.int64) @ weights
    pos = np.searchsorted(sorted_codes, comp_codes)
    if not np.all(sorted_codes[np.clip(pos, 0, len(codes) - 1)] == comp_codes):
        raise ValueError("permutation set is not closed under composition")
    return order[pos].astype(np.int64)


def symmetric_group(n: int) -> Group:
    if n < 1:
        raise ValueError(f"S_n needs n >= 1, got {n}")
    perms = np.array(list(itertools.permutations(range(n))), dtype=np.int64)
    return Group(f"S{n}", _perm_table(perms), tuple(map(tuple, perms.tolist())))


def _is_even(p) -> bool:
    inv = sum(1 for i in range(len(p)) for j in range(i + 1, len(p)) if p[i] > p[j])
    return inv % 2 == 0


def alternating_group(n: int) -> Group:
    if n < 1:
        raise ValueError(f"A_n needs n >= 1, got {n}")
    perms = np.array([p for p in itertools.permutations(range(n)) if _is_even(p)],
                     dtype=np.int64)
    return Group(f"A{n}", _perm_table(perms), tuple(map(tuple, perms.tolist())))


def cyclic_group(n: int) -> Group:
    if n < 1:
        raise ValueError(f"Z_n needs n >= 1, got {n}")
    idx = np.arange(n, dtype=np.int64)
    return Group(f"Z{n}", (idx[:, None] + idx[None, :]) % n, tuple(range(n)))


def direct_product(*groups: Group) -> Group:
    """``G_1 × G_2 × …``; element ``(g_1, …, g_r)`` has the mixed-radix index (last fastest)."""
    if not groups:
        raise ValueError("direct_product needs at least one group")
    g = groups[0]
    for h in groups[1:]:
        nh = h.order
        table = (g.table[:, None, :, None] * nh + h.table[None, :, None, :])
        table = table.reshape(g.order * nh, g.order * nh)
        elements = tuple((a, b) for a in g.elements for b in h.elements)
        g = Group(f"{g.name}x{h.name}", table.astype(np.int64), elements)
    return g


def group_from_name(name: str) -> Group:
    """``"S3"``, ``"A5"``, ``"Z2"``, products ``"S3xZ2"`` (case-insensitive)."""
    parts = name.upper().replace("×", "X").split("X")
    out = []
    for p in parts:
        if len(p) < 2 or p[0] not in "SAZ" or not p[1:].isdigit():
            raise ValueError(f"unknown group {name!r}; expected e.g. S3, A5, Z2, S3xZ2")
        out.append({"S": symmetric_group, "A": alternating_group, "Z": cyclic_group}[p[0]](
            int(p[1:])))
    return direct_product(*out)


def prefix_products(group: Group, x: np.ndarray) -> np.ndarray:
    """``y[:, t] = y[:, t-1] · x[:, t]`` with ``y[:, 0] = x[:, 0]``; ``x`` is ``(N, k)``."""
    x = np.asarray(x, dtype=np.int64)
    y = np.empty_like(x)
    if x.shape[1] == 0:
        return y
    y[:, 0] = x[:, 0]
    for t in range(1, x.shape[1]):
        y[:, t] = group.table[y[:, t - 1], x[:, t]]
    return y


def sample_distinct_sequences(rng: np.random.Generator, n_symbols: int, k: int,
                              n: int) -> np.ndarray:
    """``n`` distinct sequences of length ``k`` over ``n_symbols`` symbols, i.i.d. uniform
    conditioned on being distinct (the order of first draw is kept)."""
    total = n_symbols ** k
    if n > total:
        raise ValueError(f"asked for {n} distinct sequences but only {n_symbols}^{k} = {total} "
                         f"exist")
    if total <= 4 * n or total <= 1 << 20:
        codes = rng.choice(total, size=n, replace=False)
        out = np.empty((n, k), dtype=np.int64)
        for t in range(k - 1, -1, -1):
            out[:, t] = codes % n_symbols
            codes = codes // n_symbols
        return out
    rows: list[np.ndarray] = []
    seen: set[bytes] = set()
    while len(rows) < n:
        draw = rng.integers(0, n_symbols, size=(n - len(rows), k), dtype=np.int64)
        for r in draw:
            key = r.tobytes()
            if key not in seen:
                seen.add(key)
                rows.append(r)
    return np.stack(rows)


def word_problem_dataset(group: Group | str, k: int, n_train: int, n_test: int,
                         rng: np.random.Generator):
    """Disjoint train/test sets of distinct sequences: ``{"train": (x, y), "test": (x, y)}``
    with ``x``, ``y`` int64 ``(N, k)``; every position is scored."""
    if isinstance(group, str):
        group = group_from_name(group)
    x = sample_distinct_sequences(rng, group.order, k, n_train + n_test)
    y = prefix_products(group, x)
    return {"train": (x[:n_train], y[:n_train]), "test": (x[n_train:], y[n_train:]),
            "group": group}


def n_sequences(group: Group, k: int) -> int:
    return math.prod([group.order] * k)
