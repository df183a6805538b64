"""Test metrics of the synthetic-task harness (micro, macro, per-sequence, loss, scaled) and the
precision helpers the training step shares with them (bf16 autocast on CUDA, fp32 logits)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from . import distributed as _dist

if TYPE_CHECKING:
    from .train import TrainConfig

__all__ = ["evaluate"]


def _autocast(cfg: TrainConfig, device: torch.device):
    use = device.type == "cuda" and cfg.amp in ("auto", "bf16")
    if use:
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def _upcast(logits):
    """Half-precision (autocast) logits -> float32 for the loss; float32/float64 unchanged."""
    return logits if logits.dtype in (torch.float32, torch.float64) else logits.float()


@torch.no_grad()
def evaluate(model, batches, n_out: int, device, cfg: TrainConfig | None = None,
             chance: float = 0.0, *, dist_info: _dist.DistInfo | None = None) -> dict:
    """Test metrics over a list of ``(X, Y)`` batches (numpy or torch).

    ``dist_info`` (multi-process training): in data-parallel mode rank ``r`` evaluates batches
    ``r, r + N, …``; in sequence-parallel mode every rank evaluates its time shard of every batch
    (``model`` already in sequence-parallel mode). The counts are summed over the ranks, so every
    rank returns the same metrics."""
    mode = dist_info.mode if dist_info is not None else "single"
    if mode != "single":
        batches = list(batches)
    model.eval()
    # counts accumulate on the device and are read once at the end (a read per batch would wait
    # for the device every batch: 217 batches for the Chomsky test sets)
    acc = torch.zeros(5, dtype=torch.float64, device=device)     # correct, total, seq_ok, n_seq, loss
    cls = torch.zeros(3, n_out, dtype=torch.float64, device=device)  # correct, total, predicted
    ctx = _autocast(cfg, device) if cfg is not None else torch.autocast("cpu", enabled=False)
    seq_bad, seq_has = [], []                 # sequence parallel: per-sequence counts to sum
    for i, (X, Y) in enumerate(batches):
        if mode == "dp" and i % dist_info.world != dist_info.rank:
            continue
        X = torch.as_tensor(X, device=device)
        Y = torch.as_tensor(Y, device=device)
        if mode == "sp":
            lo, hi = _dist.shard_bounds(X.shape[1], dist_info.world, dist_info.rank)
            X, Y = X[:, lo:hi], Y[:, lo:hi]
        with ctx:
            logits = model(X)
        logits = _upcast(logits)
        mask = Y != -100
        pred = logits.argmax(-1)
        ok = (pred == Y) & mask
        has = mask.any(1)
        acc += torch.stack([
            ok.sum().double(), mask.sum().double(),
            ((ok | ~mask).all(1) & has).sum().double(), has.sum().double(),
            F.cross_entropy(logits.flatten(0, -2), Y.flatten(), ignore_index=-100,
                            reduction="sum").double()])
        if mode == "sp":
            seq_bad.append((mask & ~ok).sum(1).double().cpu())
            seq_has.append(mask.sum(1).double().cpu())
        # per-class counts by scatter (fixed shapes; unscored positions add 0)
        w = mask.flatten().double()
        y = Y.flatten().clamp(0, n_out - 1)
        pr = pred.flatten().clamp(0, n_out - 1)
        cls[0].scatter_add_(0, y, ok.flatten().double())
        cls[1].scatter_add_(0, y, w)
        cls[2].scatter_add_(0, pr, w)
    acc, cls = acc.cpu(), cls.cpu()
    correct, total, seq_ok, n_seq = (int(round(float(v))) for v in acc[:4])
    loss_sum = float(acc[4])
    cls_correct, cls_total, cls_pred = cls[0], cls[1], cls[2]
    model.train()
    if mode != "single":
        head = torch.tensor([correct, total, seq_ok, n_seq, loss_sum], dtype=torch.float64)
        parts = [head, cls_correct, cls_total, cls_pred]
        if mode == "sp":
            parts += [torch.cat(seq_bad) if seq_bad else torch.zeros(0, dtype=torch.float64),
                      torch.cat(seq_has) if seq_has else torch.zeros(0, dtype=torch.float64)]
        sizes = [p.numel() for p in parts]
        parts = list(_dist.all_reduce_sum(torch.cat(parts), device).split(sizes))
        head, cls_correct, cls_total, cls_pred = parts[:4]
        correct, total, seq_ok, n_seq = (int(round(float(v))) for v in head[:4])
        loss_sum = float(head[4])
        if mode == "sp":
            bad, has = parts[4], parts[5]
            seq_ok = int(((bad == 0) & (has > 0)).sum())
            n_seq = int((has > 0).sum())
    micro = correct / max(total, 1)
    # torchmetrics' macro MulticlassAccuracy: per-class recall, averaged over the classes that
    # occur as a target or a prediction (a predicted class without support scores 0)
    present = (cls_total > 0) | (cls_pred > 0)
    recall = cls_correct / cls_total.clamp_min(1)
    macro = float(recall[present].mean()) if present.any() else 0.0
    out = {"micro": micro, "macro": macro, "seq": seq_ok / max(n_seq, 1),
           "loss": loss_sum / max(total, 1), "scored": total}
    if chance:
        out["scaled"] = (micro - chance) / (1.0 - chance)
    return out
