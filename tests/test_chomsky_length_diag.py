"""tools/chomsky_length_diag.py on a checkpoint of a tiny BD-LRU trained for a few steps."""
import importlib.util
import pathlib

import pytest

from lrnn_scan.mad_tasks.train import TrainConfig, train

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("chomsky_length_diag",
                                                  ROOT / "tools" / "chomsky_length_diag.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _train(tmp_path, task, **task_kwargs):
    cfg = TrainConfig.from_dict(dict(task=task, task_kwargs=task_kwargs, model="bdlru", block_size=2,
                                     hidden_size=8, d_model=16, batch_size=16, epochs=1,
                                     steps_per_epoch=2, progress="none", early_stop=None,
                                     out_dir=str(tmp_path)))
    train(cfg)
    return tmp_path / "checkpoint.pt"


def test_accuracy_by_length_and_spectrum(tmp_path, capsys):
    ck = _train(tmp_path, "parity", train_min_len=3, train_max_len=6, test_min_len=6,
                test_max_len=8, n_test=16)
    tool = _tool()
    tool.main([str(ck), "--lengths", "4", "12", "--n", "8"])
    lines = capsys.readouterr().out.splitlines()
    acc = [ln for ln in lines if ln.startswith("length")]
    assert [ln.split(":")[0].split()[-1] for ln in acc] == ["4", "12"]
    assert all(0.0 <= float(ln.split()[-1]) <= 1.0 for ln in acc)
    tok = [ln for ln in lines if ln.startswith("token")]
    assert [ln.split(":")[0] for ln in tok] == ["token 0", "token 1"]   # parity's two bit tokens
    # the softmax gates keep every eigenvalue in the unit disc (Proposition 1)
    assert all(float(ln.split("max |λ| ")[1].split(",")[0]) <= 1.0 + 1e-6 for ln in tok)


def test_refuses_a_task_that_is_not_chomsky(tmp_path):
    ck = _train(tmp_path, "s2", k=8, n_train=32, n_test=16)
    with pytest.raises(SystemExit, match="not a Chomsky task"):
        _tool().main([str(ck)])
