"""``tests/_spawn.run_ranks``, the distributed tests' launcher: a rank killed by a signal after it
wrote its results passes with a warning; a rank that dies before writing, or exits with an error
code, fails the run."""
from __future__ import annotations

import json
import os

import pytest

from _spawn import run_ranks


def _write(rank, out_dir):
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
        json.dump({"rank": rank}, fh)


def _abort_after_writing(rank, world, store, out_dir):
    _write(rank, out_dir)
    if rank == 1:
        os.abort()


def _exit_1_after_writing(rank, world, store, out_dir):
    _write(rank, out_dir)
    if rank == 1:
        os._exit(1)


def _abort_before_writing(rank, world, store, out_dir):
    if rank == 1:
        os.abort()
    _write(rank, out_dir)


def test_abort_after_results_is_tolerated(tmp_path):
    with pytest.warns(UserWarning, match="rank 1 was killed by signal"):
        out = run_ranks(_abort_after_writing, 2, str(tmp_path), (str(tmp_path),), timeout=60)
    assert out == {0: {"rank": 0}, 1: {"rank": 1}}


@pytest.mark.parametrize("fn,msg", [(_exit_1_after_writing, "rank 1 exited with code 1"),
                                    (_abort_before_writing, "before writing its results")])
def test_failed_rank_fails(tmp_path, fn, msg):
    with pytest.raises(AssertionError, match=msg):
        run_ranks(fn, 2, str(tmp_path), (str(tmp_path),), timeout=60)
