"""benchmarks/kernel_times.py: the per-kernel table that ``delta_throughput.py --variants --kernels``
writes (the profiler itself needs a GPU; its rows are built here from given times)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.kernel_times import kernel_rows, kernel_times  # noqa: E402


def test_rows_follow_the_largest_time_and_sum_every_kernel():
    times = {"default": {"wy_bwd_kernel": (1890.0, 1.0), "dv_local_kernel": (510.0, 1.0), "fill": (1.0, 2.0)},
             "dvl_l32": {"wy_bwd_kernel": (1880.0, 1.0), "dv_local_kernel": (300.0, 1.0), "copy": (2.0, 1.0)}}
    rows = kernel_rows(times, top=2)
    assert rows == [["`wy_bwd_kernel`", "1890.0", "1880.0"],
                    ["`dv_local_kernel`", "510.0", "300.0"],
                    ["sum", "2401.0", "2182.0"]]     # the sum covers kernels beyond the top rows
    # a kernel only one variant launches reads 0 under the others, and ranks by its own time
    assert kernel_rows(times, top=5)[2:4] == [["`copy`", "0.0", "2.0"], ["`fill`", "1.0", "0.0"]]
    times["dvl_l32"]["wy_bwd_vn_kernel"] = (1000.0, 1.0)       # a swapped-in kernel: second row
    assert kernel_rows(times, top=2)[1] == ["`wy_bwd_vn_kernel`", "0.0", "1000.0"]


def test_reps_below_one_are_refused():
    with pytest.raises(ValueError, match="reps"):
        kernel_times(lambda: None, reps=0)
