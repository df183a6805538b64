"""Append the rows of a ``benchmarks/scan_throughput.py`` console log to a RESULTS markdown file.

For a run stopped before it wrote its own table (a device call's time limit): the rows are parsed
from the script's own log lines (``kind impl BxTxNxm: ms TB/s % {extra}``), not retyped.

    python tools/scan_log_to_results.py scan.log --results benchmarks/RESULTS.md --note "..."
"""
from __future__ import annotations

import argparse
import ast
import re

ROW = re.compile(r"^(fwd|fwdbwd)\s+(\S+)\s+B(\d+) T(\d+) N(\d+) m(\d+):\s+([\d.]+) ms\s+([\d.]+) TB/s\s+([\d.]+)%\s*(\{.*\})?\s*$")


def parse(path):
    env, copy, rows = None, None, []
    for line in open(path):
        line = line.rstrip("\n")
        if line.startswith("env: "):
            env = ast.literal_eval(line[5:])
        elif line.startswith("copy bandwidth: "):
            copy = float(line.split()[2])
        elif (m := ROW.match(line)):
            kind, impl, B, T, N, mm, ms, tbs, pct, extra = m.groups()
            rows.append(dict(kind=kind, impl=impl, B=int(B), T=int(T), N=int(N), m=int(mm), ms=float(ms),
                             tbs=float(tbs), pct=float(pct), extra=ast.literal_eval(extra) if extra else {}))
    return env, copy, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--results", default="benchmarks/RESULTS.md")
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    env, copy, rows = parse(a.log)
    with open(a.results, "a") as f:
        f.write(f"\n## scan_throughput.py (rows parsed from the run's log), {env['date']}\n\n"
                f"{env['device']} ({env['sms']} SMs), torch {env['torch']}, Triton {env['triton']}; "
                f"copy {copy:.3f} TB/s; fp32. ms = do_bench median; graph ms = do_bench_cudagraph median "
                f"(GPU time only). {a.note}\n\n"
                "| kind | impl | B | T | N | m | ms | TB/s | % copy | graph ms | graph % copy | extra |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            ex = dict(r["extra"])
            g, gp = ex.pop("graph_ms", "—"), ex.pop("graph_pct_copy", "—")
            f.write(f"| {r['kind']} | {r['impl']} | {r['B']} | {r['T']} | {r['N']} | {r['m']} | {r['ms']:.4f} | "
                    f"{r['tbs']:.3f} | {r['pct']} | {g} | {gp} | {ex if ex else ''} |\n")
    print(f"appended {len(rows)} rows to {a.results}")


if __name__ == "__main__":
    main()
