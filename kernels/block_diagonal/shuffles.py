"""When the block kernels pass a block's state between lanes by warp shuffles (``tl.gather``)
instead of through shared memory: the forward ring's ``GATHER`` (``fwd._ring_step``) and the
one-step backward's twin ``bwd._bd_bwd_gather``. Both take any ``m``; below its power of two
``MP`` the layouts carry padded rows.
The rules take ``scan.TUNE`` as an argument; README.md ("Backward by shuffles") has the story."""
from __future__ import annotations


def _mode(tune: dict, key: str):
    mode = tune.get(key, "auto")
    if not (mode is True or mode is False or mode == "auto"):  # 1 == True: not a mode
        raise ValueError(f"TUNE[{key!r}] must be 'auto', False or True, got {mode!r}")
    return mode


def ring_gather(tune: dict, m: int, mp: int) -> bool:
    """The ring forward: ``tune['ring_gather']`` ``"auto"`` (default) for ``m = 8`` (H100
    measurements in README.md, twenty-seventh session) and for ``m`` below its power of two
    ``mp <= 8`` (m = 3, 5, 6, 7: padded rows; the kernel without it spilled at m = 5, 7, sm_90a
    ring4 255 registers and 1829 loop instructions against 100-118 and 690-800 with it,
    fifty-third session), True for any ``m``, False never."""
    mode = _mode(tune, "ring_gather")
    return (m == 8 or m < mp <= 8) if mode == "auto" else mode


def bwd_gather(tune: dict, m: int, mp: int, nprog: int, nsm: int) -> bool:
    """The one-step backward (``v1``, what few programs run): ``tune['bwd_gather']`` ``"auto"``
    (default) for ``m == mp >= 8`` and for ``m = 6`` below 4 programs an SM, True for any ``m``
    (below ``mp``: padded rows), False never. m = 6, H200 B8 T2048 N768 fwd+bwd: 0.571 -> 0.523 ms
    (fifty-third session), 0.547 -> 0.505 (fifty-fourth); m = 5 and 7 (odd rows, scalar loads)
    timed the same either way (N770: 0.632 / 0.632, 0.621 / 0.624 ms; the m = 5 backward kernel
    436 us both), so they keep the plain kernel.
    H200 fp32 N768 fwd+bwd, ms, CUDA-graph medians (RESULTS.md, fiftieth session), m = 8:
    B4 T4096 (1.45 programs an SM) 0.937 -> 0.763, B8 T2048 (2.9) 0.503 -> 0.445, B16 T2048
    (5.8) 0.813 -> 0.845; m = 16 and 32 at B8 T2048 about 1 % faster. The rings by shuffles
    were slower (m = 8 N4096 2.020 -> 2.139 ms) and were not kept."""
    mode = _mode(tune, "bwd_gather")
    return (m == mp >= 8 or m == 6) and nprog < 4 * nsm if mode == "auto" else mode
