"""Wall-time budgets of the harness and the process-pool launcher (`lrnn-scan launch`); CPU,
tiny models, a few seconds."""
import importlib
import json
import time

import pytest

from lrnn_scan.mad_tasks import TrainConfig, train
from lrnn_scan.mad_tasks.cli import main as cli_main
from lrnn_scan.mad_tasks.launch import (best_records, expand_jobs, load_records, run_jobs,
                                        summary_markdown)
from lrnn_scan.mad_tasks.paper import PAPER, paper_value

train_mod = importlib.import_module("lrnn_scan.mad_tasks.train")    # the module, not train()

TINY = dict(task="s3", task_kwargs={"n_train": 256, "n_test": 128}, model="bdlru", block_size=2,
            hidden_size=8, d_model=8, batch_size=64, num_threads=1, progress="none",
            early_stop=None)


def test_fit_epochs_to_budget_rule():
    cfg = TrainConfig(epochs=50, time_budget_s=10.0)
    state, total = {}, [400]
    # 8 steps/epoch at 0.1 s (mean after the first 5 steps) + 0.2 s eval
    train_mod._fit_epochs_to_budget(cfg, state, 0.1, 0.2, 2.0, 8, total)
    assert state["epochs_planned"] == 1 + int(8.0 // 1.0) == 9
    assert total == [72]
    cfg.time_budget_s = 1e6
    train_mod._fit_epochs_to_budget(cfg, state, 0.1, 0.2, 2.0, 8, total)
    assert state["epochs_planned"] == 50                    # never more than cfg.epochs


def test_time_budget_shortens_run_and_cosine_ends_at_min_lr(monkeypatch):
    real = train_mod._fit_epochs_to_budget

    def fit3(cfg, state, *a, **kw):     # as if 3 epochs fitted the budget
        real(cfg, state, *a, **kw)
        state["epochs_planned"] = 3
        a[-1][0] = a[-2] * 3
    monkeypatch.setattr(train_mod, "_fit_epochs_to_budget", fit3)
    r = train(TrainConfig(**TINY, epochs=20, lr=1e-2, time_budget_s=100.0))
    assert (r["epochs_run"], r["epochs_planned"], r["complete"]) == (3, 3, True)
    assert r["final_lr"] == pytest.approx(1e-5)
    assert set(r["budget_estimate"]) == {"step_s", "eval_s", "epoch1_s", "fitted_after_epoch"}
    assert r["budget_estimate"]["fitted_after_epoch"] == 2      # 4 steps per epoch: timed in epoch 2


def test_short_epochs_are_timed_in_epoch_2(monkeypatch):
    """Epochs of <= 5 steps: epoch 1 is mostly compilation, so the budget fit waits for epoch 2
    and uses its whole mean step time; longer epochs fit after epoch 1."""
    seen = []
    real = train_mod._fit_epochs_to_budget

    def spy(cfg, state, t_step, t_eval, elapsed, spe, total, epochs_done=1):
        seen.append((epochs_done, spe, len(state["history"])))
        real(cfg, state, t_step, t_eval, elapsed, spe, total, epochs_done=epochs_done)
    monkeypatch.setattr(train_mod, "_fit_epochs_to_budget", spy)
    train(TrainConfig(**TINY, epochs=3, time_budget_s=1e-3))     # 4 steps/epoch
    assert seen == [(2, 4, 1)]                                   # after epoch 2's evaluation
    seen.clear()
    r = train(TrainConfig(**{**TINY, "task_kwargs": {"n_train": 512, "n_test": 128}}, epochs=3,
                          time_budget_s=1e-3))                  # 8 steps/epoch
    assert seen == [(1, 8, 0)] and (r["epochs_run"], r["epochs_planned"]) == (1, 1)
    # a tiny budget never plans fewer epochs than have run
    cfg, state, total = TrainConfig(epochs=50, time_budget_s=1.0), {}, [0]
    real(cfg, state, 0.1, 0.2, 5.0, 4, total, epochs_done=2)
    assert (state["epochs_planned"], total) == (2, [8])


def test_tiny_budget_gives_one_epoch_and_no_budget_keeps_epochs():
    r = train(TrainConfig(**{**TINY, "task_kwargs": {"n_train": 512, "n_test": 128}}, epochs=4,
                          time_budget_s=1e-3))
    assert (r["epochs_run"], r["epochs_planned"]) == (1, 1)
    r = train(TrainConfig(**TINY, epochs=2))
    assert (r["epochs_run"], r["epochs_planned"], r["budget_estimate"]) == (2, 2, None)


def test_stop_at_stops_after_one_step_and_evaluates():
    r = train(TrainConfig(**TINY, epochs=3, stop_at=time.time() - 1))
    assert r["time_limited"] and r["complete"]
    assert (r["steps"], r["epochs_run"]) == (1, 1)
    assert 0.0 <= r["best_micro"] <= 1.0
    # stop_at is a runtime field: it does not change the run's identity (resume key)
    assert TrainConfig(stop_at=1.0).identity() == TrainConfig().identity()


def _cfg(tmp_path, **extra):
    return {"out_dir": str(tmp_path / "launch"), "groups": [
        {"name": "late", "priority": 2, "tasks": [{"name": "s2", "task_kwargs":
                                                    {"n_train": 128, "n_test": 64}}],
         "models": [{"model": "diagonal"}], "lrs": [1e-3], "seeds": [0],
         "common": {**{k: v for k, v in TINY.items() if k not in ("task", "task_kwargs",
                                                                 "model", "block_size")},
                    "epochs": 1}},
        {"name": "first", "priority": 1, "tasks": [{"name": "s3", "task_kwargs":
                                                     {"n_train": 128, "n_test": 64}}],
         "models": [{"model": "bdlru", "block_size": [1, 3]}], "lrs": [1e-3, 2e-3],
         "seeds": [0], "common": {**{k: v for k, v in TINY.items() if k not in (
             "task", "task_kwargs", "model", "block_size", "hidden_size")}, "epochs": 1,
             "hidden_size": 6, "time_budget_s": 60}},
    ], **extra}


def test_expand_jobs_orders_by_priority(tmp_path):
    jobs = expand_jobs(_cfg(tmp_path))
    assert [j["group"] for j in jobs] == ["first"] * 4 + ["late"]
    assert [(j["config"]["block_size"], j["config"]["lr"]) for j in jobs[:4]] == [
        (1, 1e-3), (1, 2e-3), (3, 1e-3), (3, 2e-3)]
    assert all(j["config"]["out_dir"] is None and j["config"]["progress"] == "none"
               for j in jobs)
    assert expand_jobs(_cfg(tmp_path, checkpoints=True))[0]["config"]["out_dir"]


def test_run_jobs_in_process_and_deadline_skips(tmp_path):
    jobs = expand_jobs(_cfg(tmp_path))
    out = tmp_path / "a"
    recs = run_jobs(jobs, str(out), workers=1, log=lambda *_: None)
    assert [r["status"] for r in recs] == ["ok"] * 5
    assert load_records(str(out / "results.jsonl"))[0]["id"] == 0
    assert all("history" in r and r["epochs_run"] == 1 for r in recs)
    best = best_records(recs)
    assert set(best) == {("first", "s3", "bdlru", 1), ("first", "s3", "bdlru", 3),
                         ("late", "s2", "diagonal", None)}
    md = (out / "summary.md").read_text()
    assert "BD-LRU m3" in md and "diagonal LRU" in md
    # a deadline 5 s away with min_start_s 10: nothing starts
    out = tmp_path / "b"
    recs = run_jobs(jobs, str(out), workers=1, stop_at=time.time() + 5, min_start_s=10,
                    log=lambda *_: None)
    assert [r["status"] for r in recs] == ["skipped"] * 5
    # a deadline that is near: the budget is cut to it and the run stops by itself
    recs = run_jobs(jobs[:1], str(tmp_path / "c"), workers=1, stop_at=time.time() + 30,
                    min_start_s=1, eval_margin_s=5, log=lambda *_: None)
    assert recs[0]["status"] == "ok" and recs[0]["time_budget_s"] <= 25
    assert recs[0]["budget_cut_by_deadline"]


def test_pause_mode_continues_runs_across_launches(tmp_path):
    """"pause": a deadline pauses each run at an epoch boundary (status "paused", schedule kept);
    launching the same jobs again finishes them with the uninterrupted result."""
    def jobs_in(d):
        jobs = expand_jobs(_cfg(d, checkpoints=True))[:2]
        for j in jobs:
            j["config"].update(epochs=3, time_budget_s=None)
        return jobs
    quiet = lambda *_: None  # noqa: E731
    ref = run_jobs(jobs_in(tmp_path / "u"), str(tmp_path / "u_out"), workers=1, log=quiet)
    jobs = jobs_in(tmp_path / "p")
    # a deadline that is already past once the margin is taken off: one epoch each, then paused
    part = run_jobs(jobs, str(tmp_path / "p_out"), workers=1, stop_at=time.time() + 1.5,
                    min_start_s=0.1, eval_margin_s=1.5, pause=True, log=quiet)
    assert [r["status"] for r in part] == ["paused"] * 2
    assert all(r["epochs_run"] == 1 and r["epochs_planned"] == 3 for r in part)
    assert "launch the same config again" in part[0]["reason"]
    assert "Not finished" in (tmp_path / "p_out" / "summary.md").read_text()
    done = run_jobs(jobs, str(tmp_path / "p_out2"), workers=1, pause=True, log=quiet)
    assert [r["status"] for r in done] == ["ok"] * 2
    for a, b in zip(ref, done):
        assert (a["best_micro"], a["steps"], a["epochs_run"]) == (b["best_micro"], b["steps"], 3)
    # the wall time of a continued run counts its first call too
    for a, b in zip(part, done):
        assert b["wall_time_s"] > a["wall_time_s"]
    # one results file holding a run paused and then finished: only the finished record counts
    both = tmp_path / "both.jsonl"
    both.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "history"}) + "\n"
                            for r in part + done))
    latest = load_records(str(both))
    assert [r["status"] for r in latest] == ["ok"] * 2
    assert "Not finished" not in summary_markdown(latest)
    with pytest.raises(ValueError, match="checkpoints"):
        run_jobs(expand_jobs(_cfg(tmp_path / "n"))[:1], str(tmp_path / "n_out"), workers=1,
                 pause=True, log=quiet)


def test_run_jobs_process_pool_and_cli(tmp_path, capsys):
    cfg = _cfg(tmp_path)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    assert cli_main(["launch", "--config", str(path), "--dry-run"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 5
    out = tmp_path / "pool"
    assert cli_main(["launch", "--config", str(path), "--out", str(out), "--workers", "2",
                     "--only", "first", "--limit", "2", "--deadline-s", "300",
                     "--override", "epochs", "1"]) == 0
    recs = load_records(str(out / "results.jsonl"))
    assert sorted(r["id"] for r in recs) == [0, 1]
    assert all(r["status"] == "ok" for r in recs)
    assert len({r["pid"] for r in recs}) >= 1
    capsys.readouterr()
    assert cli_main(["launch", "--summarize", str(out / "results.jsonl")]) == 0
    assert "BD-LRU m1" in capsys.readouterr().out


def test_paper_numbers_lookup():
    assert paper_value("s3_10k", "bdlru", 3) == 1.0
    assert paper_value("s5_100k", "bdlru", 4) == 0.88
    assert paper_value("s4_50k", "deltaproduct", None) == 1.0       # n_h = 4 by default
    assert paper_value("s5_100k", "deltanet", None) == 0.14
    assert paper_value("parity", "diagonal") == 0.512
    assert paper_value("cycle_navigation", "bdlru", 5) == 1.0
    assert paper_value("copy", "hlru", 3) == 0.855
    assert paper_value("s3_10k", "bdlru", 7) is None
    assert len(PAPER) == 5 * 20 + 4 * 9 + 3 * 20
    md = summary_markdown([{"status": "ok", "group": "g", "task": "s3_10k", "model": "lstm",
                            "block_size": None, "lr": 1e-3, "seed": 0, "best_micro": 0.9,
                            "best_macro": 0.9, "best_epoch": 1, "epochs_run": 1,
                            "epochs_planned": 1, "steps": 1, "wall_time_s": 1.0}])
    assert "1.000 (Table 4) | -0.100" in md and "| 0.001:0=0.900 |" in md
    md = summary_markdown([{"status": "ok", "group": "g", "task": "s4_50k", "model": "bdlru",
                            "block_size": 4, "lr": 5e-4, "seed": 0, "best_micro": 1.0,
                            "hidden_size": 1920, "config": {"weight_decay": 0.1}}])
    assert "| 0.0005:0 h1920 wd0.1=1.000 |" in md


def test_retry_without_amp(tmp_path, monkeypatch):
    real = train_mod.train
    calls = []

    def fake(cfg, task=None):
        calls.append(cfg.amp)
        if cfg.amp != "off":
            raise RuntimeError("bf16 kernel failed")
        return real(cfg, task)
    monkeypatch.setattr(train_mod, "train", fake)
    jobs = expand_jobs(_cfg(tmp_path))[:1]
    rec = run_jobs(jobs, str(tmp_path / "r"), workers=1, retry_without_amp=True,
                   log=lambda *_: None)[0]
    assert rec["status"] == "ok" and "bf16 kernel failed" in rec["amp_error"]
    assert calls == ["auto", "off"]
    rec = run_jobs(jobs, str(tmp_path / "s"), workers=1, log=lambda *_: None)[0]
    assert rec["status"] == "error" and "bf16 kernel failed" in rec["error"]



_CONFIGS = __import__("pathlib").Path(__file__).parents[1] / "mad_tasks" / "configs"


@pytest.mark.parametrize("name", sorted(p.name for p in _CONFIGS.glob("*.json")))
def test_shipped_configs_expand(name):
    """Every config in mad_tasks/configs (launch configs with "groups", sweep configs without)
    expands into runs whose fields TrainConfig accepts: a typo would otherwise surface only when
    the run starts, on the GPU machine."""
    from lrnn_scan.mad_tasks.sweep import expand
    cfg = json.loads((_CONFIGS / name).read_text())
    if "groups" in cfg:
        configs = [j["config"] for j in expand_jobs(cfg)]
    else:
        configs = [tc.to_dict() for tc, _ in expand(cfg)]
    assert configs
    for c in configs:
        TrainConfig(**c)


def test_summarize_merges_groups_and_files(tmp_path, capsys):
    """``--summarize a.jsonl b.jsonl --merge-groups``: one row per task x model over every group and
    file, the best run's number (here seed 1 of file b), every run listed."""
    def rec(group, lr, seed, micro):
        return {"status": "ok", "group": group, "task": "s5_100k", "model": "bdlru", "block_size": 5,
                "lr": lr, "seed": seed, "best_micro": micro, "best_macro": micro, "best_epoch": 3,
                "epochs_run": 3, "epochs_planned": 3, "steps": 30, "wall_time_s": 1.0}
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps(rec("g1", 1e-3, 0, 0.575)) + "\n")
    b.write_text(json.dumps(rec("g2", 5e-4, 0, 0.9)) + "\n" + json.dumps(rec("g2", 5e-4, 1, 1.0)) + "\n")
    assert cli_main(["launch", "--summarize", str(a), str(b)]) == 0
    per_group = capsys.readouterr().out
    assert "| g1 |" in per_group and "| g2 |" in per_group
    assert cli_main(["launch", "--summarize", str(a), str(b), "--merge-groups"]) == 0
    rows = [l for l in capsys.readouterr().out.splitlines() if "BD-LRU m5" in l]
    assert len(rows) == 1
    assert rows[0].startswith("| all | s5_100k | BD-LRU m5 | 0.001:0=0.575, 0.0005:0=0.900, 0.0005:1=1.000 | 1.000 |")
