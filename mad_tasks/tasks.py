"""Task registry: turns a task name + options + data seed into train/test data.

``make_task(name, data_seed=0, **options) -> TaskData``. Names (aliases in brackets):

* MAD: ``recall`` (``icr``, ``in_context_recall``), ``noisy_recall``, ``fuzzy_recall``,
  ``copy`` (``selective_copying``), ``compression``, ``memorization``. Options ``vocab_size``
  (16), ``seq_len`` (64), ``n_train`` (20,000), ``n_test`` (1,280) and the generator's own;
  recall variants also take ``train_scored``: ``"train"`` (default, MAD's next-token targets
  everywhere) or ``"test"`` (train on the scored values only).
* Group word problems: any group name of :func:`~.groups.group_from_name` (``s3``, ``s5``,
  ``a5``, ``z2``, ``s3xz2``…), ``parity_prefix`` (= ``s2``), and the paper's five presets
  ``s3_10k``, ``s3_250``, ``s4_50k``, ``s4_3k``, ``s5_100k``. Options ``k`` (16), ``n_train``
  (10,000), ``n_test`` (1,280); ``test_k`` (default ``k``) for length extrapolation (the
  DeltaProduct protocol: ``k=128, test_k=512``), in which case test sequences are drawn
  separately (distinct among themselves).
* Chomsky: ``parity``, ``cycle_navigation`` (``cycle_nav``), ``modular_arithmetic``
  (``mod_arith``), ``modular_arithmetic_brackets`` (``mod_arith_brackets``). Options
  ``train_min_len`` (3), ``train_max_len`` (40), ``test_min_len`` (40), ``test_max_len`` (256),
  ``n_test`` (8,192). Training batches are drawn fresh every step.

Train and test data come from independent child streams of ``SeedSequence(data_seed)``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from . import chomsky, groups, mad

__all__ = ["TaskData", "make_task", "TASK_NAMES", "canonical_task_name", "PAPER_GROUP_CONFIGS"]

PAPER_GROUP_CONFIGS = {"s3_10k": ("S3", 10_000), "s3_250": ("S3", 250), "s4_50k": ("S4", 50_000),
                       "s4_3k": ("S4", 3_000), "s5_100k": ("S5", 100_000)}
_ALIASES = {"icr": "recall", "in_context_recall": "recall", "associative_recall": "recall",
            "selective_copying": "copy", "selective_copy": "copy", "compress": "compression",
            "cycle_nav": "cycle_navigation", "mod_arith": "modular_arithmetic",
            "mod_arith_brackets": "modular_arithmetic_brackets", "parity_prefix": "s2",
            "memorize": "memorization", "noisy_icr": "noisy_recall", "fuzzy_icr": "fuzzy_recall"}
MAD_TASKS = ("recall", "noisy_recall", "fuzzy_recall", "copy", "compression", "memorization")
TASK_NAMES = MAD_TASKS + tuple(chomsky.CHOMSKY_TASKS) + tuple(PAPER_GROUP_CONFIGS) + (
    "s2", "s3", "s4", "s5", "a4", "a5", "z2", "z5")


def canonical_task_name(name: str) -> str:
    n = name.lower().replace("-", "_")
    return _ALIASES.get(n, n)


@dataclass
class TaskData:
    """Everything the harness needs about a task.

    ``train``: ``(X, Y)`` int64 arrays for fixed data sets, else ``None`` and
    ``sample_train(rng, batch_size) -> (X, Y)`` draws fresh batches. ``test``: list of
    ``(X, Y)`` batches (fixed). ``arch``: ``"decoder"`` or ``"autoencoder"``. Outputs are
    ``n_out`` classes; ``chance`` is the accuracy of uniform guessing (for scaled accuracy).
    """

    name: str
    family: str                          # "mad" | "group" | "chomsky"
    vocab_size: int
    n_out: int
    arch: str
    test: list
    train: tuple | None = None
    sample_train: Callable | None = None
    chance: float = 0.0
    scaled: bool = False
    info: dict = field(default_factory=dict)

    @property
    def streaming(self) -> bool:
        return self.train is None


def _chunks(X, Y, bs=512):
    return [(X[i:i + bs], Y[i:i + bs]) for i in range(0, len(X), bs)]


def make_task(name: str, data_seed: int = 0, **opt) -> TaskData:
    key = canonical_task_name(name)
    ss = np.random.SeedSequence(int(data_seed))
    train_rng, test_rng = (np.random.default_rng(s) for s in ss.spawn(2))
    used = set()

    def get(k, default):
        used.add(k)
        return opt.get(k, default)

    if key in MAD_TASKS:
        V, L = get("vocab_size", 16), get("seq_len", 64)
        n_train, n_test = get("n_train", 20_000), get("n_test", 1_280)
        arch, info = "decoder", {}
        if key in ("recall", "noisy_recall"):
            kw = dict(vocab_size=V, seq_len=L)
            if key == "noisy_recall":
                kw.update(noise_vocab_size=get("noise_vocab_size", 16),
                          frac_noise=get("frac_noise", 0.2))
                if "vocab_size" not in opt:
                    kw["vocab_size"] = V = 32      # MAD's noisy default
            Xtr, Ytr = mad.in_context_recall(train_rng, n_train,
                                             scored=get("train_scored", "train"), **kw)
            Xte, Yte = mad.in_context_recall(test_rng, n_test, scored="test", **kw)
        elif key == "fuzzy_recall":
            kw = dict(vocab_size=V, seq_len=L, k_motif_size=get("k_motif_size", 3),
                      v_motif_size=get("v_motif_size", 3))
            Xtr, Ytr = mad.fuzzy_in_context_recall(train_rng, n_train,
                                                   scored=get("train_scored", "train"), **kw)
            Xte, Yte = mad.fuzzy_in_context_recall(test_rng, n_test, scored="test", **kw)
        elif key == "copy":
            kw = dict(vocab_size=V, seq_len=L, n_copy=get("n_copy", 16))
            Xtr, Ytr = mad.selective_copying(train_rng, n_train, **kw)
            Xte, Yte = mad.selective_copying(test_rng, n_test, **kw)
        elif key == "compression":
            Xtr, Ytr = mad.compression(train_rng, n_train, V, L)
            Xte, Yte = mad.compression(test_rng, n_test, V, L)
            arch = "autoencoder"
        else:
            if "vocab_size" not in opt:
                V = 256
            if "seq_len" not in opt:
                L = 32
            kw = dict(vocab_size=V, seq_len=L, kv_map_seed=get("kv_map_seed", 12345))
            Xtr, Ytr = mad.memorization(train_rng, n_train, **kw)
            Xte, Yte = mad.memorization(test_rng, n_test, **kw)
        _check_unused(name, opt, used)
        return TaskData(key, "mad", V, V, arch, _chunks(Xte, Yte), train=(Xtr, Ytr),
                        chance=1.0 / V, info=dict(vocab_size=V, seq_len=L, n_train=n_train,
                                                  n_test=n_test, **info))

    if key in chomsky.CHOMSKY_TASKS:
        t = chomsky.CHOMSKY_TASKS[key]
        lo, hi = get("train_min_len", 3), get("train_max_len", 40)
        tlo, thi = get("test_min_len", 40), get("test_max_len", 256)
        n_test = get("n_test", 8192)
        _check_unused(name, opt, used)
        test = chomsky.chomsky_test_set(t, test_rng, n_test, tlo, thi)

        def sample(rng, bs, _t=t, _lo=lo, _hi=hi):
            return chomsky.chomsky_train_batch(_t, rng, bs, _lo, _hi)

        return TaskData(key, "chomsky", t.vocab_size, t.num_classes, "decoder", test,
                        sample_train=sample, chance=1.0 / t.num_classes, scaled=True,
                        info=dict(train_lengths=[lo, hi], test_lengths=[tlo, thi],
                                  n_test=n_test))

    if key in PAPER_GROUP_CONFIGS:
        gname, n_default = PAPER_GROUP_CONFIGS[key]
    else:
        gname, n_default = key, 10_000
    try:
        g = groups.group_from_name(gname)
    except ValueError:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(TASK_NAMES)} "
                         f"(or any group such as S3xZ2)") from None
    k, n_train, n_test = get("k", 16), get("n_train", n_default), get("n_test", 1_280)
    test_k = get("test_k", k)
    _check_unused(name, opt, used)
    if test_k == k:
        d = groups.word_problem_dataset(g, k, n_train, n_test, train_rng)
        train, (Xte, Yte) = d["train"], d["test"]
    else:
        x = groups.sample_distinct_sequences(train_rng, g.order, k, n_train)
        train = (x, groups.prefix_products(g, x))
        Xte = groups.sample_distinct_sequences(test_rng, g.order, test_k, n_test)
        Yte = groups.prefix_products(g, Xte)
    return TaskData(key, "group", g.order, g.order, "decoder", _chunks(Xte, Yte, 256),
                    train=train, chance=1.0 / g.order,
                    info=dict(group=g.name, k=k, test_k=test_k, n_train=n_train, n_test=n_test))


def _check_unused(name, opt, used):
    extra = set(opt) - used
    if extra:
        raise ValueError(f"task {name!r} does not take option(s) {sorted(extra)}")
