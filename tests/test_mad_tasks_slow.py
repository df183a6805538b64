"""CPU smoke tests of the synthetic-task harness (issue 6): block-diagonal transitions solve
state tracking that the diagonal LRU cannot. Each trains one small model (well under a minute on
one core of an unloaded machine). Run with ``pytest -m slow``.

Setting: group word problems at k = 16 (S2 = prefix parity, 4k train, AdamW lr 1e-3, 8 epochs;
S3, 10k train, lr 2e-3, 6 epochs), 1,000 test sequences, d_model 32, 48 state units, one layer,
cosine decay to 1e-5, batch 128, early stop at test accuracy 0.999, data seed 0, model seed 0.
Layers from lrnn_scan.models (the reference layers of mad_tasks/layers.py if it lacks them).
"""
import pytest
import torch

from lrnn_scan.mad_tasks import TrainConfig, train

pytestmark = pytest.mark.slow

COMMON = dict(d_model=32, hidden_size=48, batch_size=128, seed=0, data_seed=0, early_stop=0.999,
              progress="none")
PARITY = dict(task="s2", task_kwargs=dict(k=16, n_train=4_000, n_test=1_000), lr=1e-3, epochs=8)
S3 = dict(task="s3", task_kwargs=dict(k=16, n_train=10_000, n_test=1_000), lr=2e-3, epochs=6)


@pytest.fixture(autouse=True)
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _run(**kw):
    r = train(TrainConfig.from_dict({**COMMON, **kw}))
    print(f"{kw['task']} {kw['model']} m={kw.get('block_size')}: best test accuracy "
          f"{r['best_micro']:.4f} after {r['epochs_run']} epochs ({r['train_time_s']:.1f}s)")
    return r


def test_parity_bdlru_m2_solves():
    r = _run(**PARITY, model="bdlru", block_size=2)
    assert r["best_micro"] >= 0.99, r["history"]


def test_parity_diagonal_fails():
    r = _run(**PARITY, model="diagonal")
    assert r["best_micro"] <= 0.75, r["history"]


def test_s3_bdlru_m3_solves():
    r = _run(**S3, model="bdlru", block_size=3)
    assert r["best_micro"] >= 0.97, r["history"]


def test_s3_diagonal_fails():
    r = _run(**S3, model="diagonal")
    assert r["best_micro"] <= 0.65, r["history"]
