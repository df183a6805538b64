"""Result files: CSV + JSON of every row, the FLOPs table, PNG plots (matplotlib optional) and,
only when asked (``--record``), dated rows appended to ``benchmarks/RESULTS.md``."""
from __future__ import annotations

import csv
import datetime as _dt
import json
from pathlib import Path

from .flops import flops_markdown

__all__ = ["write_outputs", "write_plots", "append_results", "stamp"]

COLUMNS = ["device_label", "level", "view", "impl", "kind", "m", "B", "T", "blocks", "N",
           "d_model", "n_layers", "params", "mode", "ms", "tokens_per_s", "peak_mem_mib",
           "mem_method", "bytes", "gb_per_s", "pct_copy", "flops_per_step", "dtype", "device"]


def stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")


def write_outputs(result: dict, flops_rows: list[dict], out: Path, tag: str) -> dict:
    """Write ``bench_<tag>.csv``/``.json`` and ``flops_table.{csv,md}``; returns the paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    p = out / f"bench_{tag}.csv"
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in result["rows"]:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in COLUMNS})
    paths["csv"] = p
    p = out / f"bench_{tag}.json"
    p.write_text(json.dumps(dict(result, flops_table=flops_rows), indent=1, default=str))
    paths["json"] = p
    p = out / "flops_table.csv"
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(flops_rows[0]))
        w.writeheader()
        w.writerows(flops_rows)
    paths["flops_csv"] = p
    p = out / "flops_table.md"
    p.write_text("FLOPs per step of the hidden-to-hidden update (paper's Table 5), from each "
                 "layer's flops_per_step(); projections not counted.\n\n" + flops_markdown(flops_rows)
                 + "\n")
    paths["flops_md"] = p
    return paths


def write_plots(result: dict, out: Path, tag: str, log=print) -> list[Path]:
    """One PNG per view (ms vs m, forward and forward+backward) and ms vs FLOPs per step."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: plots skipped (pip install 'lrnn-scan[plot]')")
        return []
    rows, label = result["rows"], result["meta"]["device_label"]
    dev = result["meta"]["device"]
    written = []
    for view, title in (("A", "fixed number of blocks"), ("B", "fixed hidden size")):
        vr = [r for r in rows if r["level"] == "scan" and r["view"] == view]
        if not vr:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
        for ax, mode in zip(axes[0], ("fwd", "fwdbwd")):
            keys = sorted({(r["impl"], r["kind"], r["T"]) for r in vr if r["mode"] == mode})
            for impl, kind, T in keys:
                pts = sorted((r["m"], r["ms"]) for r in vr if r["mode"] == mode and r["impl"] == impl
                             and r["kind"] == kind and r["T"] == T)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                        label=f"{impl if impl != 'lrnn_scan' else kind} T={T}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("block size m")
            ax.set_ylabel("ms (median)")
            ax.set_title(f"[{label}] view {view}: {title}, {mode}")
            ax.legend(fontsize=7)
        fig.suptitle(f"{label}: {dev}", fontsize=9)
        fig.tight_layout()
        p = out / f"bench_{tag}_view{view}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    lr = [r for r in rows if r["level"] == "layer"]
    if lr:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), squeeze=False)
        for ax, mode in zip(axes[0], ("fwd", "fwdbwd")):
            for r in lr:
                if r["mode"] != mode:
                    continue
                name = r["kind"] + (f" m={r['m']}" if r.get("m") else "")
                ax.bar(name, r["tokens_per_s"])
            ax.set_ylabel("tokens/s")
            ax.tick_params(axis="x", rotation=60, labelsize=7)
            ax.set_title(f"[{label}] view C: parameter-matched layers, {mode}")
        fig.tight_layout()
        p = out / f"bench_{tag}_viewC.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    fr = [r for r in rows if r.get("flops_per_step") and r["mode"] == "fwd"]
    if fr:
        fig, ax = plt.subplots(figsize=(6, 4.5))
        groups = sorted({(r["level"], r["kind"], r["impl"]) for r in fr})
        for level, kind, impl in groups:
            pts = [(r["flops_per_step"], r["ms"] / r["T"] * 1e3) for r in fr
                   if (r["level"], r["kind"], r["impl"]) == (level, kind, impl)]
            name = kind if impl == "lrnn_scan" else f"{impl} ({kind})"
            ax.scatter([p[0] for p in pts], [p[1] for p in pts],
                       marker="o" if level == "scan" else "s", label=f"{level}: {name}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("FLOPs per step (Table 5, flops_per_step())")
        ax.set_ylabel("µs per time step (median, whole batch)")
        ax.set_title(f"[{label}] measured time vs FLOPs per step (fwd)")
        ax.legend(fontsize=6)
        fig.tight_layout()
        p = out / f"bench_{tag}_time_vs_flops.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        written.append(p)
    return written


def append_results(result: dict, path: Path, command: str) -> None:
    """Append a dated section (device, versions, shapes, every row) to a Markdown results file."""
    meta = result["meta"]
    lines = [f"\n## lrnn-scan bench — {meta['date']} — [{meta['device_label']}] {meta['device']}, "
             f"torch {meta['torch']}, Triton {meta['triton']}, {meta['config']['dtype']}, "
             f"copy {meta['copy_gb_per_s']:.1f} GB/s\n",
             f"(`{command}`; medians; GB/s = bytes(inputs read once + outputs written once) / time; "
             f"peak memory via {result['rows'][0]['mem_method'] if result['rows'] else 'n/a'})\n",
             "| level | view | impl | kind | m | B | T | blocks | d_model | params | mode | ms | "
             "tokens/s | peak MiB | GB/s | % copy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        def g(k):
            v = r.get(k)
            return "" if v is None else v
        lines.append(f"| {r['level']} | {r['view']} | {r['impl']} | {r['kind']} | {g('m')} | {r['B']} | "
                     f"{r['T']} | {g('blocks')} | {g('d_model')} | {g('params')} | {r['mode']} | "
                     f"{r['ms']:.4f} | {r['tokens_per_s']:.0f} | {g('peak_mem_mib')} | "
                     f"{g('gb_per_s')} | {g('pct_copy')} |")
    if result["skipped"]:
        lines.append("\nSkipped: " + "; ".join(result["skipped"]))
    with Path(path).open("a") as f:
        f.write("\n".join(lines) + "\n")
