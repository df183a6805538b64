"""Run the grid of :mod:`lrnn_scan.bench.suite` and collect one row per measurement."""
from __future__ import annotations

import gc
import math
import sys
from typing import Callable

import torch

from .measure import copy_bandwidth, device_label, environment, peak_memory, time_fn
from .peers import layer_peer_cases, scan_peer_fns
from .suite import (Config, _dtype, layer_cases, make_layer_fn, make_scan_fn,
                    scan_bytes, scan_cases)

__all__ = ["run", "Progress"]


class Progress:
    """tqdm over the grid when installed, else one printed line per item."""

    def __init__(self, total: int, label: str, enabled: bool = True, stream=None):
        self.total, self.label, self.n, self.enabled = total, label, 0, enabled
        self.stream = stream or sys.stderr
        self._bar = None
        if enabled:
            try:
                from tqdm.auto import tqdm
                self._bar = tqdm(total=total, desc=label, file=self.stream)
            except ImportError:
                pass

    def update(self, desc: str) -> None:
        self.n += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.set_postfix_str(desc)
            self._bar.update(1)
        else:
            print(f"[{self.label}] {self.n}/{self.total} {desc}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _flops_scan(kind: str, H: int, m: int) -> int:
    if kind == "hlru":
        return 2 * H * m + 2 * H
    return 2 * H * m * m + 2 * H


def _free(cfg: Config) -> None:
    gc.collect()
    if torch.device(cfg.device).type == "cuda":  # NOT YET RUN ON A GPU
        torch.cuda.empty_cache()


def _sig(x: float, digits: int = 4):
    """``x`` to ``digits`` significant digits (None for NaN)."""
    return None if math.isnan(x) else float(f"{x:.{digits}g}")


def _measure(fn, cfg: Config) -> tuple[float, float, str]:
    ms = time_fn(fn, cfg.device, warmup=cfg.warmup, rep=cfg.rep)
    mem, how = (peak_memory(fn, cfg.device) if cfg.memory else (float("nan"), "off"))
    return ms, mem, how


def run(cfg: Config, *, progress: bool = True, log: Callable[[str], None] = print,
        on_row: Callable[[dict], None] | None = None) -> dict:
    """Run every case of ``cfg``; returns ``{"meta": ..., "rows": [...], "skipped": [...]}``.

    ``on_row(row)`` is called with each row as soon as it is measured (the CLI prints it and
    appends it to ``rows_partial.jsonl``, so a run cut short keeps what it measured)."""
    label = device_label(cfg.device)
    env = environment(cfg.device)
    esize = torch.empty((), dtype=_dtype(cfg.dtype)).element_size()
    bw = copy_bandwidth(cfg.device)
    log(f"[{label}] {env['device']}; torch {env['torch']}, Triton {env['triton']}; "
        f"copy bandwidth {bw:.1f} GB/s (measured now)")
    rows, skipped = [], []
    scases = scan_cases(cfg)
    lcases = layer_cases(cfg)
    if lcases and cfg.peers:
        target = cfg.params
        extra, why = layer_peer_cases(cfg, target)
        lcases += extra
        skipped += why
    peer_slots = [c for c in scases if c.kind == "bd_materialised"] if cfg.peers else []
    total = (len(scases) + len(peer_slots) + len(lcases)) * len(cfg.modes)
    bar = Progress(total, f"{label} bench", enabled=progress)
    common = dict(device_label=label, device=env["device"], dtype=cfg.dtype)

    def add(level, view, impl, kind, m, B, T, H, mode, ms, mem, how, nbytes, **extra):
        gbps = nbytes / (ms * 1e-3) / 1e9 if nbytes and ms > 0 else float("nan")
        row = dict(level=level, view=view, impl=impl, kind=kind, m=m, B=B, T=T, blocks=H,
                   mode=mode, ms=round(ms, 5), tokens_per_s=round(B * T / (ms * 1e-3), 1),
                   peak_mem_mib=_sig(mem), mem_method=how,
                   bytes=nbytes or None, gb_per_s=_sig(gbps), pct_copy=_sig(100 * gbps / bw),
                   **common)
        row.update(extra)
        rows.append(row)
        if on_row is not None:
            on_row(row)
        return row

    for case in scases:
        for mode in cfg.modes:
            desc = f"{case.view} {case.kind} m={case.m} T={case.T} {mode}"
            fn = None
            try:
                fn = make_scan_fn(case, cfg, mode)
                ms, mem, how = _measure(fn, cfg)
                add("scan", case.view, case.impl, case.kind, case.m, case.B, case.T, case.H, mode,
                    ms, mem, how, scan_bytes(case.kind, case.B, case.T, case.H, case.m, mode, esize),
                    N=case.N, flops_per_step=_flops_scan(case.kind, case.H, case.m))
            except Exception as exc:  # noqa: BLE001 - record (e.g. out of memory) and go on
                skipped.append(f"{desc}: failed ({type(exc).__name__}: {str(exc)[:200]})")
                _free(cfg)
            bar.update(desc)
            del fn
        _free(cfg)
    for case in peer_slots:
        for mode in cfg.modes:
            for name, fn, why in scan_peer_fns(case, cfg, mode):
                desc = f"{case.view} peer {name} m={case.m} T={case.T} {mode}"
                if fn is None:
                    if not any(s.startswith(f"{name}: skipped") for s in skipped):
                        skipped.append(f"{name}: skipped ({why})")
                    continue
                try:
                    ms, mem, how = _measure(fn, cfg)
                    add("scan", case.view, name, "bd_materialised", case.m, case.B, case.T, case.H,
                        mode, ms, mem, how,
                        scan_bytes("bd_materialised", case.B, case.T, case.H, case.m, mode, esize),
                        N=case.N, flops_per_step=_flops_scan("bd", case.H, case.m))
                except Exception as exc:  # noqa: BLE001
                    skipped.append(f"{desc}: failed ({type(exc).__name__}: {str(exc)[:200]})")
                    _free(cfg)
            bar.update(f"{case.view} peers m={case.m} T={case.T} {mode}")
    for case in lcases:
        model = None
        for mode in cfg.modes:
            desc = f"C {case.kind} m={case.m} d={case.d_model} {mode}"
            try:
                fn, model = make_layer_fn(case, cfg, mode, model=model)
                ms, mem, how = _measure(fn, cfg)
                add("layer", "C", case.impl, case.kind, case.m, case.B, case.T, None, mode, ms, mem,
                    how, 0, d_model=case.d_model, n_layers=case.n_layers, params=case.params,
                    flops_per_step=case.flops_per_step or None)
            except Exception as exc:  # noqa: BLE001
                skipped.append(f"{desc}: failed ({type(exc).__name__}: {str(exc)[:200]})")
                _free(cfg)
            bar.update(desc)
        del model
        _free(cfg)
    bar.close()
    for s in skipped:
        log(f"[{label}] {s}")
    meta = dict(env, copy_gb_per_s=round(bw, 3), config={k: (list(v) if isinstance(v, tuple) else v)
                                                       for k, v in cfg.__dict__.items()})
    return dict(meta=meta, rows=rows, skipped=skipped)
