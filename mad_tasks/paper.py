"""The H-LRU/BD-LRU paper's numbers (its Tables 3, 4 and 6; copied from
``shared/reference/tasks.md`` §5), keyed like our results: ``(task, model, block_size)``.

Table 3 (MAD) entries are the paper's mean over four configurations (V=16/L=64/20k, V=32,
L=128, 10k) of the best **macro** test accuracy; Table 4 entries are token accuracy at k = 16;
Table 6 entries look like raw accuracy. ``model`` names are ours (``bdlru``, ``hlru``, ``lstm``,
``deltanet`` = DeltaNet[-1,1], ``deltaproduct`` with ``block_size`` 4 = DeltaProduct4[-1,1],
``mamba2``); the paper's ``m = 1`` rows are the diagonal LRU (also looked up as ``diagonal``).
"""
from __future__ import annotations

__all__ = ["PAPER", "paper_value", "TABLE_OF_TASK"]

_T4_COLS = ("s3_10k", "s3_250", "s4_50k", "s4_3k", "s5_100k")
_T4 = {
    ("lstm", None): (1.000, 0.320, 1.000, 0.370, 1.000),
    ("mamba2", None): (0.660, 0.280, 0.430, 0.120, 0.260),
    ("deltanet", None): (1.000, 0.260, 0.470, 0.140, 0.140),
    ("deltaproduct", 4): (1.000, 0.270, 1.000, 0.130, 0.140),
    ("bdlru", 1): (0.560, 0.380, 0.340, 0.220, 0.210),
    ("bdlru", 2): (1.000, 0.490, 0.700, 0.360, 0.340),
    ("bdlru", 3): (1.000, 1.000, 1.000, 0.430, 0.480),
    ("bdlru", 4): (1.000, 1.000, 1.000, 1.000, 0.880),
    ("bdlru", 5): (1.0,) * 5, ("bdlru", 6): (1.0,) * 5, ("bdlru", 8): (1.0,) * 5,
    ("bdlru", 16): (1.0,) * 5,
    ("hlru", 1): (0.570, 0.360, 0.350, 0.210, 0.230),
    ("hlru", 2): (0.600, 0.310, 0.370, 0.190, 0.260),
    ("hlru", 3): (0.610, 0.320, 0.400, 0.210, 0.320),
    ("hlru", 4): (0.620, 0.310, 0.410, 0.190, 0.340),
    ("hlru", 5): (0.620, 0.320, 0.450, 0.190, 0.380),
    ("hlru", 6): (0.630, 0.280, 0.450, 0.170, 0.390),
    ("hlru", 8): (0.640, 0.280, 0.490, 0.170, 0.390),
    ("hlru", 16): (0.660, 0.260, 0.510, 0.160, 0.390),
}
_T6_COLS = ("cycle_navigation", "modular_arithmetic", "modular_arithmetic_brackets", "parity")
_T6 = {
    ("lstm", None): (1.000, 0.976, 0.663, 1.000),
    ("bdlru", 1): (0.434, 0.370, 0.370, 0.512),
    ("bdlru", 2): (0.425, 0.493, 0.417, 1.000),
    ("bdlru", 3): (0.597, 0.546, 0.434, 1.000),
    ("bdlru", 4): (0.608, 0.459, 0.435, 1.000),
    ("bdlru", 5): (1.000, 0.525, 0.422, 1.000),
    ("bdlru", 6): (1.000, 0.433, 0.440, 1.000),
    ("bdlru", 8): (1.000, 0.553, 0.395, 1.000),
    ("bdlru", 16): (1.000, 1.000, 0.448, 1.000),
}
_T3_COLS = ("recall", "copy", "compression")
_T3 = {
    ("lstm", None): (1.000, 1.000, 0.750),
    ("mamba2", None): (1.000, 0.807, 0.720),
    ("deltanet", None): (1.000, 0.892, 0.782),
    ("deltaproduct", 4): (1.000, 1.000, 0.717),
    ("bdlru", 1): (0.775, 0.835, 0.725), ("bdlru", 2): (1.000, 0.962, 0.760),
    ("bdlru", 3): (1.000, 0.980, 0.762), ("bdlru", 4): (1.000, 0.983, 0.785),
    ("bdlru", 5): (1.000, 0.985, 0.782), ("bdlru", 6): (1.000, 0.980, 0.775),
    ("bdlru", 8): (1.000, 0.992, 0.748), ("bdlru", 16): (1.000, 0.998, 0.725),
    ("hlru", 1): (0.785, 0.848, 0.760), ("hlru", 2): (0.998, 0.855, 0.770),
    ("hlru", 3): (1.000, 0.855, 0.772), ("hlru", 4): (1.000, 0.845, 0.775),
    ("hlru", 5): (1.000, 0.838, 0.775), ("hlru", 6): (1.000, 0.818, 0.775),
    ("hlru", 8): (1.000, 0.810, 0.768), ("hlru", 16): (1.000, 0.680, 0.705),
}

#: ``{(task, model, block_size): accuracy}`` for every entry of Tables 3, 4 and 6.
PAPER: dict = {}
#: task name -> "Table 3" | "Table 4" | "Table 6"
TABLE_OF_TASK: dict = {}
for _cols, _rows, _name in ((_T4_COLS, _T4, "Table 4"), (_T6_COLS, _T6, "Table 6"),
                            (_T3_COLS, _T3, "Table 3")):
    for _c in _cols:
        TABLE_OF_TASK[_c] = _name
    for (_model, _m), _vals in _rows.items():
        for _c, _v in zip(_cols, _vals):
            PAPER[(_c, _model, _m)] = _v


def paper_value(task: str, model: str, block_size=None):
    """The paper's number for our ``(task, model, block_size)`` or ``None``. ``diagonal`` is the
    paper's ``m = 1`` (BD-LRU m1); DeltaProduct defaults to ``n_h = 4``."""
    if model == "diagonal":
        model, block_size = "bdlru", 1
    if model == "deltaproduct" and block_size is None:
        block_size = 4
    if model in ("lstm", "mamba2", "deltanet"):
        block_size = None
    return PAPER.get((task, model, block_size))
