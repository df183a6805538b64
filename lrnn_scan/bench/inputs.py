"""Random inputs shared by the benchmarks, tools and tests."""
from __future__ import annotations

import torch


def stable_blocks(*shape: int, scale=0.99, generator: torch.Generator | None = None,
                  device=None) -> torch.Tensor:
    """Random nonnegative blocks whose rows have L1 norm ``|scale|``: a stable transition.

    ``shape`` ends in the rows' length (``(..., m, m)`` for block-diagonal ``A``, ``(..., m)`` for
    companion coefficients). ``scale`` is a number or a tensor that broadcasts against ``shape``
    (e.g. ``(..., m, 1)`` for a random per-row factor in ``(-1, 1)``). Returns float32.

    Entries are drawn from ``(0, 1]`` (``1 - torch.rand``), never 0: ``torch.rand`` returns an exact
    0 with probability 2^-24, and with ``m = 1`` a row of one zero normalises to ``0 / 0 = NaN``
    (``tools/memcheck_kernels.py`` met one at T = 16384, H = 256 on 2026-11-25 and reported the NaN
    it spread as a kernel failure).

    Example::

        A = stable_blocks(2, 1024, 8, 4, 4)     # (B, T, H, m, m), every row sums to 0.99
    """
    a = 1 - torch.rand(*shape, generator=generator, device=device)
    return a / a.sum(-1, keepdim=True) * scale
