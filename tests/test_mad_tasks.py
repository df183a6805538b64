"""Generators of lrnn_scan.mad_tasks checked against brute force and the spec
(shared/reference/tasks.md). Fast: numpy only, no training."""
import itertools

import numpy as np
import pytest

from lrnn_scan.mad_tasks import chomsky, groups, mad
from lrnn_scan.mad_tasks.tasks import make_task

IGN = -100


def rng(seed=0):
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------- groups
def _compose(a, b):                 # (a·b)(i) = a(b(i))
    return tuple(a[b[i]] for i in range(len(a)))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_symmetric_group_elements_and_table(n):
    g = groups.symmetric_group(n)
    perms = list(itertools.permutations(range(n)))
    assert g.order == len(perms) and list(g.elements) == perms
    assert g.identity == 0 and g.elements[0] == tuple(range(n))
    index = {p: i for i, p in enumerate(perms)}
    for i, a in enumerate(perms):
        for j, b in enumerate(perms):
            assert g.table[i, j] == index[_compose(a, b)]


def test_alternating_cyclic_product():
    a4, a5 = groups.alternating_group(4), groups.alternating_group(5)
    assert (a4.order, a5.order) == (12, 60) and a5.identity == 0
    s4 = groups.symmetric_group(4)
    assert list(a4.elements) == [p for p in s4.elements if groups._is_even(p)]
    z5 = groups.cyclic_group(5)
    assert all(z5.table[i, j] == (i + j) % 5 for i in range(5) for j in range(5))
    s3, z2 = groups.symmetric_group(3), groups.cyclic_group(2)
    p = groups.direct_product(s3, z2)
    assert p.order == 12 and p.identity == 0
    for x, y in itertools.product(range(12), repeat=2):
        (g1, h1), (g2, h2) = divmod(x, 2), divmod(y, 2)
        assert p.table[x, y] == s3.table[g1, g2] * 2 + z2.table[h1, h2]
    assert groups.group_from_name("s3xz2").order == 12
    with pytest.raises(ValueError):
        groups.group_from_name("Q8")


@pytest.mark.parametrize("name", ["S3", "S4", "S5", "A5", "S3xZ2"])
def test_group_axioms(name):
    g = groups.group_from_name(name)
    t = g.table
    r = rng(1)
    a, b, c = (r.integers(0, g.order, 500) for _ in range(3))
    assert np.array_equal(t[t[a, b], c], t[a, t[b, c]])            # associativity
    assert all(sorted(row) == list(range(g.order)) for row in t)   # Latin square


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_prefix_products_match_explicit_composition(n):
    g = groups.symmetric_group(n)
    x = rng(n).integers(0, g.order, size=(50, 16))
    y = groups.prefix_products(g, x)
    for row_x, row_y in zip(x, y):
        acc = None
        for xt, yt in zip(row_x, row_y):
            p = g.elements[xt]
            acc = p if acc is None else _compose(acc, p)           # y_t = y_{t-1} · x_t
            assert g.elements[yt] == acc


def test_s2_word_problem_is_prefix_parity():
    d = make_task("parity_prefix", 0, n_train=200, n_test=50)
    x, y = d.train
    assert np.array_equal(y, np.cumsum(x, axis=1) % 2)


def test_word_problem_distinct_disjoint_deterministic():
    a = groups.word_problem_dataset("S3", 16, 1000, 300, rng(5))
    b = groups.word_problem_dataset("S3", 16, 1000, 300, rng(5))
    c = groups.word_problem_dataset("S3", 16, 1000, 300, rng(6))
    assert all(np.array_equal(u, v) for u, v in zip(a["train"] + a["test"], b["train"] + b["test"]))
    assert not np.array_equal(a["train"][0], c["train"][0])
    rows = {r.tobytes() for r in np.concatenate([a["train"][0], a["test"][0]])}
    assert len(rows) == 1300                                       # distinct and disjoint
    assert a["train"][0].shape == (1000, 16) and a["test"][1].shape == (300, 16)


def test_distinct_sequences_small_space_exhaustive():
    x = groups.sample_distinct_sequences(rng(0), 2, 3, 8)
    assert sorted(map(tuple, x.tolist())) == list(itertools.product(range(2), repeat=3))
    with pytest.raises(ValueError):
        groups.sample_distinct_sequences(rng(0), 2, 3, 9)


@pytest.mark.parametrize("name,group,n", [("s3_10k", "S3", 10_000), ("s3_250", "S3", 250),
                                           ("s4_3k", "S4", 3_000)])
def test_paper_group_presets(name, group, n):
    d = make_task(name, 0, n_test=100)
    assert d.info["group"] == group and len(d.train[0]) == n and d.train[0].shape[1] == 16
    assert d.vocab_size == d.n_out == groups.group_from_name(group).order


def test_length_extrapolation_protocol():
    d = make_task("s3", 0, k=12, test_k=40, n_train=100, n_test=20)
    assert d.train[0].shape == (100, 12)
    X, Y = d.test[0]
    assert X.shape[1] == 40
    assert np.array_equal(Y, groups.prefix_products(groups.symmetric_group(3), X))


# ----------------------------------------------------------------------------- Chomsky
def test_parity_and_cycle_navigation_labels():
    t = chomsky.CHOMSKY_TASKS["parity"]
    X, Y = t.sample(rng(0), 64, 17)
    assert X.shape == Y.shape == (64, 18) and (X[:, -1] == t.query_token).all()
    assert (Y[:, :-1] == IGN).all() and np.array_equal(Y[:, -1], X[:, :-1].sum(1) % 2)
    t = chomsky.CHOMSKY_TASKS["cycle_navigation"]
    X, Y = t.sample(rng(1), 64, 30)
    for row, lab in zip(X[:, :-1], Y[:, -1]):
        pos = 0
        for a in row:
            pos = (pos + {0: 0, 1: 1, 2: -1}[int(a)]) % 5
        assert pos == lab


@pytest.mark.parametrize("length", [1, 3, 4, 9, 40, 101])
def test_modular_arithmetic_matches_python_eval(length):
    t = chomsky.CHOMSKY_TASKS["modular_arithmetic"]
    X, Y = t.sample(rng(length), 200, length)
    n = length - 1 if length % 2 == 0 else length
    assert X.shape[1] == max(n, 1) + 1
    for row, lab in zip(X[:, :-1], Y[:, -1]):
        expr = chomsky.detokenize_arith(row)
        assert eval(expr) % 5 == lab, expr          # noqa: S307 - trusted, generated digits/ops
        assert chomsky.eval_mod_arith(row) == lab


@pytest.mark.parametrize("length", [1, 2, 3, 4, 5, 8, 23, 64])
def test_modular_arithmetic_brackets_matches_python_eval(length):
    t = chomsky.CHOMSKY_TASKS["modular_arithmetic_brackets"]
    X, Y = t.sample(rng(length), 100, length)
    assert X.shape == (100, length + 1)
    for row, lab in zip(X[:, :-1], Y[:, -1]):
        expr = chomsky.detokenize_arith(row)
        assert len(expr) == length
        depth = np.cumsum([{"(": 1, ")": -1}.get(c, 0) for c in expr])
        assert depth[-1] == 0 and depth.min() >= 0
        assert eval(expr) % 5 == lab, expr          # noqa: S307


def test_chomsky_train_and_test_lengths():
    d = make_task("parity", 0, n_test=434)
    lens = [X.shape[1] - 1 for X, _ in d.test]
    assert min(lens) == 40 and max(lens) == 256
    assert sum(len(X) for X, _ in d.test) == 434
    counts = {}
    for X, _ in d.test:
        counts[X.shape[1]] = counts.get(X.shape[1], 0) + len(X)
    assert set(counts.values()) == {2}                              # evenly spread
    r = rng(3)
    seen = {d.sample_train(r, 8)[0].shape[1] - 1 for _ in range(300)}
    assert min(seen) >= 3 and max(seen) <= 40 and len(seen) > 30
    assert d.scaled and d.chance == 0.5 and d.n_out == 2


# ----------------------------------------------------------------------------- MAD
@pytest.mark.parametrize("V,L", [(16, 64), (32, 64), (16, 128)])
def test_in_context_recall_spec(V, L):
    n = 400
    X, Y = mad.in_context_recall(rng(V + L), n, V, L)
    Xt, Yt = mad.in_context_recall(rng(V + L), n, V, L, scored="train")
    assert X.shape == Y.shape == (n, L - 1) and np.array_equal(X, Xt)
    assert np.array_equal(Yt[:, :-1], X[:, 1:])                    # training: next token
    keys, vals = X[:, 0::2], X[:, 1::2]
    assert keys.min() >= 0 and keys.max() < V // 2
    assert vals.min() >= V // 2 and vals.max() < V
    for x, y in zip(X, Y):
        seq = np.append(x, y[-1])
        mapping = {}
        for k, v in zip(seq[0::2], seq[1::2]):
            assert mapping.setdefault(k, v) == v                   # value fixed per sequence
        assert seq[-2] in set(seq[0:-2:2])                         # probe repeats a shown key
        # scored positions: the key positions (inputs) whose key was shown before
        scored = np.where(y != IGN)[0]
        want = [i for i in range(0, L - 1, 2) if seq[i] in set(seq[0:i:2])]
        assert list(scored) == want
        assert all(y[i] == seq[i + 1] for i in scored)
    if (V, L) == (16, 64):
        assert 23 <= (Y != IGN).sum(1).mean() <= 25                # "about 24" scored


def test_noisy_recall():
    V, L, nv = 32, 64, 16
    X, Y = mad.in_context_recall(rng(0), 300, V, L, noise_vocab_size=nv, frac_noise=0.3)
    n_kv = V - nv
    is_noise = X[:, 0::2] >= n_kv
    assert (X[:, 1::2][is_noise[:, : X[:, 1::2].shape[1]]] >= n_kv).all()   # whole pairs
    assert 0.2 < is_noise[:, :-1].mean() < 0.4
    for x, y in zip(X, Y):
        noise_pairs = {i for i in range(0, L - 2, 2) if x[i] >= n_kv}
        assert all(y[i] == IGN for i in noise_pairs)
        scored = [i for i in range(0, L - 1, 2) if y[i] != IGN]
        shown = lambda i: {x[j] for j in range(0, i, 2) if j not in noise_pairs}  # noqa: E731
        assert scored == [i for i in range(0, L - 1, 2)
                          if i not in noise_pairs and x[i] in shown(i)]
        assert y[-1] != IGN                                          # the probe


def test_fuzzy_recall():
    V, L = 16, 128
    X, Y = mad.fuzzy_in_context_recall(rng(0), 30, V, L, scored="test")
    assert X.shape == Y.shape == (30, L)
    pad = V - 1
    for x, y in zip(X, Y):
        body = x[x != pad]
        assert (x[: len(x) - len(body)] == pad).all()                # left padding only
        idx = np.where(y != IGN)[0]
        assert len(idx) > 0 and y[-1] != IGN
        assert all(y[i] == x[i + 1] for i in idx if i + 1 < L)       # targets are next tokens
        assert all((V - 1) // 2 <= y[i] < V - 1 for i in idx)         # values only


@pytest.mark.parametrize("V,L,n_copy", [(16, 64, 16), (32, 128, 16), (16, 34, 16), (8, 20, 4)])
def test_selective_copying_spec(V, L, n_copy):
    X, Y = mad.selective_copying(rng(L), 300, V, L, n_copy)
    copy_tok, blank = V - 1, V - 2
    assert X.shape == Y.shape == (300, L)
    head = L - n_copy - 1
    assert (X[:, head] == copy_tok).all() and (X[:, head + 1:] == blank).all()
    assert (Y[:, : head + 1] == IGN).all()
    for x, y in zip(X, Y):
        pre = x[:head]
        data = pre[pre != blank]
        assert len(data) == n_copy and (data < V - 2).all()
        assert (pre == blank).sum() == L - 2 * n_copy - 1
        assert pre[-1] != blank                                    # never a blank after the last
        assert np.array_equal(y[head + 1:], data)                  # in order, no shift
    with pytest.raises(ValueError):
        mad.selective_copying(rng(0), 2, 16, 33, 16)


def test_compression_and_memorization():
    X, Y = mad.compression(rng(0), 100, 16, 64)
    assert np.array_equal(X, Y) and (X[:, -1] == 15).all() and X[:, :-1].max() <= 14
    kv = mad.memorization_kv_map(256)
    assert len(set(kv.values())) == len(kv) and set(kv) == set(range(127))
    assert min(kv.values()) >= 127 and max(kv.values()) <= 254
    X, Y = mad.memorization(rng(0), 50, 256, 32)
    assert (X[:, 1::2] == 255).all() and (Y[:, 0::2] == IGN).all()
    assert all(Y[r, 2 * i + 1] == kv[X[r, 2 * i]] for r in range(50) for i in range(16))


# ----------------------------------------------------------------------------- determinism
@pytest.mark.parametrize("name,opt", [("recall", dict(n_train=200, n_test=50)),
                                      ("noisy_recall", dict(n_train=100, n_test=20)),
                                      ("fuzzy_recall", dict(n_train=20, n_test=10)),
                                      ("copy", dict(n_train=200, n_test=50)),
                                      ("compression", dict(n_train=200, n_test=50)),
                                      ("memorization", dict(n_train=100, n_test=50)),
                                      ("s4", dict(n_train=200, n_test=50)),
                                      ("modular_arithmetic_brackets", dict(n_test=300)),
                                      ("cycle_navigation", dict(n_test=300))])
def test_make_task_deterministic_and_no_global_rng(name, opt):
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    a, b, c = (make_task(name, s, **opt) for s in (4, 4, 5))
    assert np.array_equal(np.random.get_state()[1], before)         # global RNG untouched
    arrs = lambda d: ([*d.train] if d.train else []) + [t for xy in d.test for t in xy]  # noqa
    assert all(np.array_equal(u, v) for u, v in zip(arrs(a), arrs(b)))
    assert not all(np.array_equal(u, v) for u, v in zip(arrs(a), arrs(c)))
    if a.streaming:
        r1, r2 = np.random.default_rng(9), np.random.default_rng(9)
        assert all(np.array_equal(u, v)
                   for u, v in zip(a.sample_train(r1, 4), b.sample_train(r2, 4)))


def test_make_task_rejects_unknown():
    with pytest.raises(ValueError):
        make_task("nonsense")
    with pytest.raises(ValueError):
        make_task("s3", 0, bogus=1)
