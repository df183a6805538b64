"""A pytest plugin for test runs spread over several time-limited calls (tools/gpu_suite_resume.sh).

    PYTHONPATH=tools python3 -m pytest -p pytest_resume --resume-skip DONE.txt --resume-log NEW.txt ...

``--resume-skip``: node ids (one a line; a missing file is an empty list) deselected at
collection. ``--resume-log``: each test that passes is appended to this file as soon as its call
phase passes (flushed, so a run killed by a time limit keeps what it finished). Node ids are
pytest's own (relative to its rootdir), so the two files speak the same language.
"""
from __future__ import annotations

import os


def pytest_addoption(parser):
    g = parser.getgroup("resume")
    g.addoption("--resume-skip", default=None, help="file of node ids to deselect (passed earlier)")
    g.addoption("--resume-log", default=None, help="file to append the node id of each passing test to")


def pytest_collection_modifyitems(config, items):
    path = config.getoption("--resume-skip")
    if not path or not os.path.exists(path):
        return
    with open(path) as f:
        done = {line.strip() for line in f if line.strip()}
    keep = [it for it in items if it.nodeid not in done]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[it for it in items if it.nodeid in done])
        items[:] = keep


_LOG: str | None = None   # --resume-log of this session (pytest_configure)


def pytest_configure(config):
    global _LOG
    _LOG = config.getoption("--resume-log")


def pytest_runtest_logreport(report):
    if _LOG and report.when == "call" and report.passed:
        with open(_LOG, "a") as f:
            f.write(report.nodeid + "\n")
