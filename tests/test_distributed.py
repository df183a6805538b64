"""Sequence-parallel scan (lrnn_scan.distributed) on CPU: 2 and 4 gloo processes.

Each world size is spawned once (module-scoped fixture); every worker runs all cases and records
per-case errors, and the parametrised tests below report them one by one. A case checks that the
distributed outputs, final state and gradients (operator tensors, b, initial_state) equal the
single-process ``lrnn_scan.scan`` of the whole sequence (fp64, rel. err <= 1e-9; fp32 / bf16
cases with looser tolerances), for uneven shards (T not divisible by the world size, 1-step and
empty shards, weighted splits), every operator family, vector and matrix states, random shapes and
splits, the newest-only Companion input, ``dim=0``, sub-groups and a world of one; and that
``lsd.chunk_delta_product`` equals ``lrnn_scan.delta.chunk_delta_product`` (torch backend fp64,
and the Triton kernels under TRITON_INTERPRET=1 in fp32). Two checks make sure that mismatched
``requires_grad`` and a rank-local error raise on every rank instead of hanging.

Hang safety: gloo collectives time out after 60 s, and the parent kills the workers after
``SPAWN_TIMEOUT`` seconds.
"""
from __future__ import annotations

import datetime
import json
import os
import tempfile
import traceback

import pytest
import torch

import lrnn_scan as ls
from lrnn_scan import distributed as lsd
from lrnn_scan.testing import random_operator

from _spawn import run_ranks

D = torch.float64
SPAWN_TIMEOUT = 150.0
TOL = 1e-9

# name -> (family, lengths per rank (None: even split of T), T, cols (None: vector), extra)
CASES_2 = {
    "diagonal_vec": ("diagonal", [4, 3], 7, None, {}),
    "diagonal_mat_noh0": ("diagonal", [1, 6], 7, 2, {"h0": False}),
    "block_diagonal_vec": ("block_diagonal", [5, 1], 6, None, {}),
    "block_diagonal_mat": ("block_diagonal", None, 9, 3, {}),
    "companion_vec": ("companion", [2, 5], 7, None, {}),
    "companion_newest_only": ("companion", [5, 4], 9, "newest", {}),
    "householder_vec": ("householder", [6, 3], 9, None, {}),
    "householder_mat": ("householder", [1, 7], 8, 3, {}),
    "diagonal_dim0": ("diagonal", [3, 4], 7, None, {"dim": 0}),
    "block_diagonal_no_final": ("block_diagonal", [3, 4], 7, None, {"final": False}),
    "companion_forward_no_grad": ("companion", [4, 4], 8, None, {"grad": False}),
    "world_of_one": ("block_diagonal", None, 5, None, {"solo": True}),
    "delta_gated": ("delta", [7, 6], 13, None, {}),
    "delta_ungated_noh0": ("delta", [1, 9], 10, None, {"gated": False, "h0": False}),
    "delta_triton_interpreter": ("delta", [17, 19], 36, None, {"triton": True}),
    "householder_only_h0_grad": ("householder", [3, 5], 8, 2, {"param_grad": False}),
    "halo_width3": ("halo", [4, 5], 9, None, {"width": 3}),
    "halo_wider_than_shard": ("halo", [2, 5], 7, None, {"width": 4}),
}
CASES_4 = {
    "diagonal_vec": ("diagonal", None, 11, None, {}),
    "diagonal_empty_shard": ("diagonal", [3, 0, 4, 2], 9, 2, {}),
    "block_diagonal_vec": ("block_diagonal", [5, 1, 3, 4], 13, None, {}),
    "block_diagonal_mat": ("block_diagonal", [2, 3, 1, 4], 10, 2, {}),
    "companion_vec": ("companion", [3, 1, 4, 2], 10, None, {}),
    "companion_newest_only": ("companion", [1, 4, 2, 6], 13, "newest", {}),
    "householder_vec": ("householder", [7, 2, 1, 5], 15, None, {}),
    "householder_mat": ("householder", None, 14, 3, {}),
    "householder_empty_first": ("householder", [0, 3, 5, 1], 9, 2, {}),
    "diagonal_empty_first_only_h0_grad": ("diagonal", [0, 2, 3, 1], 6, None,
                                          {"param_grad": False}),
    "subgroups_of_two": ("block_diagonal", [4, 1], 5, None, {"pairs": True}),
    "companion_weighted_split": ("companion", "weighted", 12, None, {}),
    "delta_gated": ("delta", [5, 1, 6, 3], 15, None, {}),
    "halo_spans_ranks": ("halo", [2, 1, 0, 4], 7, None, {"width": 5}),
    "halo_width1": ("halo", [3, 0, 2, 2], 7, None, {"width": 1}),
    "delta_empty_shard_l2norm": ("delta", [4, 3, 0, 5], 12, None, {"l2norm": True}),
}




def _random_cases(world, n, seed):
    """Random shapes and random uneven splits (fixed seed, so every rank builds the same)."""
    import random
    rng = random.Random(seed)
    fams = ["diagonal", "block_diagonal", "companion", "householder"]
    out = {}
    for i in range(n):
        fam = fams[i % len(fams)]
        lens = [rng.choice([0, 1, 1, 2, 3, 5, 8]) for _ in range(world)]
        lens[rng.randrange(world)] += 1                       # T >= 1
        cols = rng.choice([None, None, 1, 2, "newest"] if fam == "companion" else [None, 1, 3])
        extra = {"B": rng.randint(1, 3), "H": rng.randint(1, 3), "d": rng.randint(1, 5),
                 "n_h": rng.randint(1, 3), "h0": rng.random() < 0.7}
        out[f"random{i}_{fam}"] = (fam, lens, sum(lens), cols, extra)
    return out


CASES_2.update(_random_cases(2, 4, 2))
CASES_2.update({
    "block_diagonal_float32": ("block_diagonal", [5, 6], 11, None, {"dtype": torch.float32}),
    "companion_newest_bfloat16": ("companion", [5, 6], 11, "newest", {"dtype": torch.bfloat16}),
})
CASES_4.update(_random_cases(4, 4, 4))


CASES_2["custom_rotation_operator"] = ("rotation", [4, 5], 9, None, {})
CASES_4["custom_rotation_operator_mat"] = ("rotation", [2, 3, 1, 3], 9, 2, {})


class Rotation2(ls.TransitionOperator):
    """The README's custom operator (rotations of 2-vectors): only the protocol, no engine code."""
    tensor_fields, state_size = ("theta",), 2

    def __init__(self, theta):
        self.theta, self._batch_ndim = theta, theta.dim()

    def _apply_matrix(self, x):
        c, s = self.theta.cos()[..., None], self.theta.sin()[..., None]
        return torch.stack([c * x[..., 0, :] - s * x[..., 1, :],
                            s * x[..., 0, :] + c * x[..., 1, :]], dim=-2)

    def compose(self, earlier):
        return Rotation2(self.theta + earlier.theta) if isinstance(earlier, Rotation2) \
            else super().compose(earlier)

    def transpose(self):
        return Rotation2(-self.theta)

    def identity_like(self):
        return Rotation2(torch.zeros_like(self.theta))

    def to_dense(self):
        return self.apply(torch.eye(2, dtype=self.theta.dtype).expand(*self.theta.shape, 2, 2))


# ----------------------------------------------------------------------------------- worker side
def _problem(family, T, cols, seed, dim, extra):
    """The whole sequence (same on every rank): op params, b, h0, cotangent weights."""
    g = torch.Generator().manual_seed(seed)
    B, H = extra.get("B", 2), extra.get("H", 2)
    d = extra.get("d", 4 if family == "householder" else 3)
    if family == "rotation":
        d = 2
        op = Rotation2(torch.randn(B, T, H, generator=g, dtype=D))
    else:
        op = random_operator(family, (B, T, H), d, g, n_h=extra.get("n_h", 2))
    if cols == "newest":
        tail = ()
        h0_tail = (d,)
    else:
        tail = (d,) if cols is None else (d, cols)
        h0_tail = tail
    b = torch.randn(B, T, H, *tail, generator=g, dtype=D)
    h0 = torch.randn(B, H, *h0_tail, generator=g, dtype=D)
    w_h = torch.randn(B, T, H, *tail, generator=g, dtype=D)
    return op, b, h0, w_h, g, (B, H, *h0_tail)


def _bounds(lens, T, world, rank):
    if lens is None:
        return lsd.shard_bounds(T, world, rank)
    if lens == "weighted":
        return lsd.shard_bounds(T, world, rank, weights=[3] + [1] * (world - 1))
    assert sum(lens) == T and len(lens) == world
    lo = sum(lens[:rank])
    return lo, lo + lens[rank]


def _run_delta_case(spec, rank, world, group, seed):
    """lsd.chunk_delta_product vs the single-process chunk path (torch backend, fp64)."""
    from lrnn_scan.delta import chunk_delta_product
    _, lens, T, _, extra = spec
    triton = extra.get("triton", False)
    if triton and os.environ.get("TRITON_INTERPRET") != "1":
        return None                 # Triton on CPU tensors needs the interpreter: skipped
    g = torch.Generator().manual_seed(seed)
    B, n_h, H, K, V = (1, 2, 2, 16, 16) if triton else (2, 2, 2, 4, 3)
    q = torch.randn(B, T, H, K, generator=g, dtype=D)
    k = torch.nn.functional.normalize(torch.randn(B, T, n_h, H, K, generator=g, dtype=D), dim=-1)
    if extra.get("l2norm"):
        k = k * 2.0
    v = torch.randn(B, T, n_h, H, V, generator=g, dtype=D)
    beta = 2 * torch.rand(B, T, n_h, H, generator=g, dtype=D)
    lg = -torch.rand(B, T, H, generator=g, dtype=D) if extra.get("gated", True) else None
    h0 = torch.randn(B, H, K, V, generator=g, dtype=D) if extra.get("h0", True) else None
    w_o = torch.randn(B, T, H, V, generator=g, dtype=D)
    w_f = [torch.randn(B, H, K, V, generator=g, dtype=D) for _ in range(world)]
    lo, hi = _bounds(lens, T, world, rank)
    kw = dict(scale=0.6, output_final_state=True, chunk_size=16 if triton else 4,
              backend="torch", use_qk_l2norm=extra.get("l2norm", False))
    xs = [q, k, v, beta, lg, h0]
    ref = [None if x is None else x.clone().requires_grad_() for x in xs]
    o, f = chunk_delta_product(*ref[:5], initial_state=ref[5], **kw)
    tol = TOL
    if triton:                      # the distributed run goes through the Triton kernels, fp32
        kw["backend"], tol = "triton", 2e-5
        xs = [None if x is None else x.float() for x in xs]
        w_o, w_f = w_o.float(), [w.float() for w in w_f]
    ((o * w_o).sum() + sum((f * w).sum() for w in w_f)).backward()
    loc = [None if x is None else (x if i == 5 else x[:, lo:hi]).clone().requires_grad_()
           for i, x in enumerate(xs)]
    o_s, f_s = lsd.chunk_delta_product(*loc[:5], initial_state=loc[5], group=group, **kw)
    ((o_s * w_o[:, lo:hi]).sum() + (f_s * w_f[rank]).sum()).backward()
    errs = []
    pairs = [("o", o_s, o[:, lo:hi]), ("final", f_s, f)]
    for i, name in enumerate(["dq", "dk", "dv", "dbeta", "dg"]):
        if xs[i] is not None:
            pairs.append((name, loc[i].grad, ref[i].grad[:, lo:hi]))
    if h0 is not None:
        pairs.append(("dh0", loc[5].grad, ref[5].grad if rank == 0 else None))
    for name, x, r in pairs:
        if x is None or r is None:
            if not (x is None and r is None):
                errs.append(f"{name}: None mismatch")
            continue
        e = ls.testing.rel_err(x, r)
        if not e <= tol:
            errs.append(f"{name}: rel err {e:.3e}")
    return errs


def _run_halo_case(spec, rank, world, group, seed):
    """lsd.halo vs slicing the whole sequence, values and gradients."""
    _, lens, T, _, extra = spec
    w = extra["width"]
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(2, T, 3, generator=g, dtype=D, requires_grad=True)
    G = [torch.randn(2, w, 3, generator=g, dtype=D) for _ in range(world)]
    bounds = [_bounds(lens, T, world, r) for r in range(world)]

    def ref_halo(lo):
        part = X[:, max(lo - w, 0):lo]
        return torch.cat([X.new_zeros(2, w - part.shape[1], 3), part], dim=1)

    loss = sum((ref_halo(bounds[r][0]) * G[r]).sum() for r in range(world))
    (dX,) = torch.autograd.grad(loss, X)
    lo, hi = bounds[rank]
    x = X.detach()[:, lo:hi].clone().requires_grad_()
    hal = lsd.halo(x, w, group=group)
    (hal * G[rank]).sum().backward()
    errs = []
    if hal.shape != (2, w, 3) or not torch.equal(hal, ref_halo(lo).detach()):
        errs.append(f"halo values differ: {hal} vs {ref_halo(lo)}")
    if x.grad is None or not torch.allclose(x.grad, dX[:, lo:hi], rtol=0, atol=1e-12):
        errs.append(f"halo gradient differs: {x.grad} vs {dX[:, lo:hi]}")
    return errs


def _run_case(name, spec, rank, world, group, seed):
    family, lens, T, cols, extra = spec
    if family == "halo":
        return _run_halo_case(spec, rank, world, group, seed)
    if family == "delta":
        return _run_delta_case(spec, rank, world, group, seed)
    dim = extra.get("dim", 1)
    use_h0 = extra.get("h0", True)
    want_final = extra.get("final", True)
    grad = extra.get("grad", True)
    pgrad = grad and extra.get("param_grad", True)
    op, b, h0, w_h, g, state_shape = _problem(family, T, cols, seed, dim, extra)
    # Per-rank weights on the final state: the global loss is the sum of the per-rank losses.
    w_f = [torch.randn(*state_shape, generator=g, dtype=D) for _ in range(world)]
    dt = extra.get("dtype", D)           # lower precision: both runs in dt, looser tolerance
    tol = {D: TOL, torch.float32: 1e-5, torch.bfloat16: 2e-2}[dt]
    if dt != D:
        op, b, h0 = op.map(lambda t: t.to(dt)), b.to(dt), h0.to(dt)
    if dim == 0:                                     # time-first layout (T, B, H, ...)
        op = op.map(lambda t: t.movedim(1, 0).contiguous())
        b, w_h = b.movedim(1, 0).contiguous(), w_h.movedim(1, 0).contiguous()
    lo, hi = _bounds(lens, T, world, rank)

    # Reference: single-process scan of the whole sequence.
    ref_params = [p.clone().requires_grad_(pgrad) for p in op.tensors()]
    ref_b = b.clone().requires_grad_(pgrad)
    ref_h0 = h0.clone().requires_grad_(grad) if use_h0 else None
    with torch.set_grad_enabled(grad):
        h_ref, f_ref = ls.scan(op.with_tensors(*ref_params), ref_b, initial_state=ref_h0,
                               output_final_state=True, dim=dim, method="blelloch")
        if grad:
            loss = (h_ref * w_h).sum() + (want_final and sum((f_ref * w).sum() for w in w_f))
            loss.backward()

    # Distributed: this rank's shard.
    params = [lsd.shard(p, lo, hi, dim).detach().clone().requires_grad_(pgrad)
              for p in op.tensors()]
    b_s = lsd.shard(b, lo, hi, dim).clone().requires_grad_(pgrad)
    h0_s = h0.clone().requires_grad_(grad) if use_h0 else None
    with torch.set_grad_enabled(grad):
        out = lsd.scan(op.with_tensors(*params), b_s, initial_state=h0_s,
                       output_final_state=want_final, group=group, dim=dim, method="blelloch")
        h, f = out if want_final else (out, None)
        if grad:
            loss = (h * lsd.shard(w_h, lo, hi, dim)).sum()
            if want_final:
                loss = loss + (f * w_f[rank]).sum()
            loss.backward()

    errs = []

    def check(what, x, ref):
        if x is None or ref is None:
            if not (x is None and ref is None):
                errs.append(f"{what}: got {None if x is None else 'tensor'}, expected "
                            f"{None if ref is None else 'tensor'}")
            return
        if x.shape != ref.shape:
            errs.append(f"{what}: shape {tuple(x.shape)} != {tuple(ref.shape)}")
            return
        if x.dtype != ref.dtype:
            errs.append(f"{what}: dtype {x.dtype} != {ref.dtype}")
        e = ls.testing.rel_err(x, ref)
        if not e <= tol:
            errs.append(f"{what}: rel err {e:.3e}")

    check("h", h, lsd.shard(h_ref, lo, hi, dim))
    if want_final:
        check("final", f, f_ref)
    if pgrad:
        check("db", b_s.grad, lsd.shard(ref_b.grad, lo, hi, dim))
        for i, (p, rp) in enumerate(zip(params, ref_params)):
            check(f"dparam{i}", p.grad, lsd.shard(rp.grad, lo, hi, dim))
    if grad:
        if use_h0:    # initial_state is read on rank 0 only: no gradient on the others
            check("dh0", h0_s.grad, ref_h0.grad if rank == 0 else None)
    return errs


def _worker(rank, world, store, cases, out_dir):
    import torch.distributed as dist
    torch.set_num_threads(1)
    # a file store, not tcp://: with TCP, rank 0 hosts the store, and a rank still tearing down
    # after rank 0 exited can abort ("terminate called without an active exception"; CI, in
    # tests/test_ecosystem.py and tests/test_mad_tasks_distributed.py)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    results = {}
    try:
        solo = [dist.new_group([i]) for i in range(world)]
        pairs = [dist.new_group([i, i + 1]) for i in range(0, world - 1, 2)] if world >= 2 else []
        for k, (name, spec) in enumerate(sorted(cases.items())):
            extra = spec[4]
            group, r, w = None, rank, world
            if extra.get("solo"):
                group, r, w = solo[rank], 0, 1
            elif extra.get("pairs"):
                group, r, w = pairs[rank // 2], rank % 2, 2
            try:
                results[name] = _run_case(name, spec, r, w, group, seed=1000 + k)
            except Exception:                       # noqa: BLE001 - reported per case
                results[name] = [traceback.format_exc()]
        # A rank that needs gradients while another does not: a clear error on every rank.
        try:
            op = random_operator("diagonal", (1, 3, 2), 2, torch.Generator().manual_seed(0))
            b = torch.randn(1, 3, 2, 2, dtype=D, requires_grad=(rank == 0))
            lsd.scan(op, b)
            results["mixed_grad_flags_raise"] = ["no error raised"]
        except RuntimeError as exc:
            ok = "every rank's inputs must require gradients" in str(exc)
            results["mixed_grad_flags_raise"] = [] if ok else [str(exc)]
        except Exception:                           # noqa: BLE001
            results["mixed_grad_flags_raise"] = [traceback.format_exc()]
        # An error on one rank before the exchange: that rank re-raises, the others raise too.
        try:
            op = random_operator("diagonal", (1, 3, 2), 2, torch.Generator().manual_seed(0))
            lsd.scan(op, torch.randn(1, 3, 2, 2, dtype=D),
                     method="kernel" if rank == world - 1 else "blelloch")   # no kernel on CPU
            results["one_rank_error_raises_everywhere"] = ["no error raised"]
        except (RuntimeError, ValueError) as exc:
            want = "method='kernel'" if rank == world - 1 else f"rank(s) [{world - 1}]"
            results["one_rank_error_raises_everywhere"] = [] if want in str(exc) else [str(exc)]
        except Exception:                           # noqa: BLE001
            results["one_rank_error_raises_everywhere"] = [traceback.format_exc()]
        dist.barrier()
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as fh:
            json.dump(results, fh)
        dist.destroy_process_group()


def _spawn(world, cases):
    with tempfile.TemporaryDirectory() as out_dir:
        return run_ranks(_worker, world, out_dir, (cases, out_dir), SPAWN_TIMEOUT)


@pytest.fixture(scope="module")
def world2():
    return _spawn(2, CASES_2)


@pytest.fixture(scope="module")
def world4():
    return _spawn(4, CASES_4)


def _report(results, name):
    errs = {r: res.get(name, ["case did not run"]) for r, res in results.items()}
    if all(e is None for e in errs.values()):
        pytest.skip("needs TRITON_INTERPRET=1 (no CUDA)")
    bad = {r: e for r, e in errs.items() if e}
    assert not bad, "\n".join(f"rank {r}: " + "\n".join(e) for r, e in bad.items())


EXTRA = ["mixed_grad_flags_raise", "one_rank_error_raises_everywhere"]


@pytest.mark.parametrize("name", sorted(CASES_2) + EXTRA)
def test_two_ranks(world2, name):
    _report(world2, name)


@pytest.mark.parametrize("name", sorted(CASES_4) + EXTRA)
def test_four_ranks(world4, name):
    _report(world4, name)


# ----------------------------------------------------------------------------------- in-process
def test_cu_seqlens_is_rejected():
    op = ls.Diagonal(torch.rand(1, 4, 3, dtype=D))
    with pytest.raises(NotImplementedError, match="cu_seqlens"):
        lsd.scan(op, torch.randn(1, 4, 3, dtype=D), cu_seqlens=torch.tensor([0, 2, 4]))


def test_needs_process_group():
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("a process group is initialised in this process")
    op = ls.Diagonal(torch.rand(1, 4, 3, dtype=D))
    with pytest.raises(RuntimeError, match="init_process_group"):
        lsd.scan(op, torch.randn(1, 4, 3, dtype=D))


@pytest.mark.parametrize("family", ["diagonal", "block_diagonal", "companion", "householder"])
@pytest.mark.parametrize("T", [1, 2, 7, 16])
def test_tree_reduce_matches_dense_product(family, T):
    g = torch.Generator().manual_seed(T)
    op = random_operator(family, (2, T, 3), 4, g, n_h=2)
    x = torch.randn(2, T, 3, 4, dtype=D, generator=g)
    total, fin = lsd.tree_reduce(op, x, 1)
    dense = op.to_dense()
    P = torch.eye(4, dtype=D).expand(2, 3, 4, 4)
    h = torch.zeros(2, 3, 4, dtype=D)
    for t in range(T):
        P = dense[:, t] @ P
        h = (dense[:, t] @ h.unsqueeze(-1)).squeeze(-1) + x[:, t]
    assert ls.testing.rel_err(total.to_dense().squeeze(1), P) < 1e-12
    assert ls.testing.rel_err(fin.squeeze(1), h) < 1e-12
    _, fin2 = lsd.tree_reduce(op, x, 1, need_op=False)
    assert ls.testing.rel_err(fin2, fin) < 1e-14


def test_shard_bounds_cover():
    for T in (0, 1, 5, 11, 16):
        for w in (1, 2, 3, 4):
            b = [lsd.shard_bounds(T, w, r) for r in range(w)]
            assert b[0][0] == 0 and b[-1][1] == T
            assert all(b[i][1] == b[i + 1][0] for i in range(w - 1))
            assert max(hi - lo for lo, hi in b) - min(hi - lo for lo, hi in b) <= 1


def test_shard_bounds_weights():
    assert [lsd.shard_bounds(12, 2, r, weights=[2, 1]) for r in range(2)] == [(0, 8), (8, 12)]
    b = [lsd.shard_bounds(10, 3, r, weights=[1, 2, 1]) for r in range(3)]
    assert b[0][0] == 0 and b[-1][1] == 10 and b[0][1] == b[1][0] and b[1][1] == b[2][0]
    with pytest.raises(ValueError, match="positive"):
        lsd.shard_bounds(10, 2, 0, weights=[1, 0])
