"""Hardware efficiency on its own (issue 12 item 4): each term's dominant kernel as a fraction
of the same process's matmul / copy peak, in ``--rounds`` interleaved rounds.

    .venv/bin/python -m bench.efficiency --threads 1                # n = 10^5 x 128, 5 rounds
    .venv/bin/python -m bench.efficiency --quick --out DIR          # seconds (tests/bench/)

A round measures the peaks (``kernels.peaks``), every kernel (``kernels.kernels``), then the
peaks again; each fraction is taken against the higher of the round's two peaks (the ceiling
the machine reached around the kernel), and the report gives its median over the rounds with
the min–max spread. Same data and settings as the full bench's hardware section
(``bench.run --mode full``: G = 128, batch m = 1000, k' = 100, d = 128). The memory-bound
kernels are listed with what bounds them. No timing is asserted anywhere in the tests.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from .common import loadavg, machine_info, median

# What holds each memory-bound kernel below the copy peak (a copy streams contiguous memory;
# these do not).
LIMITS = {
    "Facility objective given S": "random row gather: each of the G·k' rows of S is a separate "
                                  "m-float read, then a max over k' rows (latency of scattered "
                                  "reads, no reuse)",
    "Pair-wise objective": "gather of G·k' unit rows (d floats each, scattered), then a sum: "
                           "scattered reads",
    "Pair-wise greedy / polish mat-vec": "streams the n×d matrix once per mat-vec, 2 flops per "
                                         "4-byte read: bounded by read bandwidth (bytes counted: "
                                         "the read only)",
}
TARGET = 0.5  # compute-bound kernels: >= 50% of matmul peak


def _limit(kernel: str) -> str:
    return next((v for k, v in LIMITS.items() if kernel.startswith(k)), "")


def run(args) -> dict:
    import numpy as np
    import torch

    from datamask_pipeline.engine.sample import make_table

    from . import kernels

    torch.set_num_threads(args.threads)
    dev = torch.device("cpu")
    t = make_table(args.rows, dim=args.dim, seed=0)
    x = np.asarray(t.column("feature_arr").combine_chunks().flatten(),
                   dtype=np.float32).reshape(args.rows, args.dim).copy()
    q = t.column("quality_score").to_numpy().astype(np.float32)
    partial = max(min(0.05, 1000 / args.rows), 300 / args.rows)
    res = {"command": " ".join([".venv/bin/python", "-m", "bench.efficiency"] + args.argv),
           "created": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": machine_info(dev), "rows": args.rows, "dim": args.dim,
           "threads": args.threads, "rounds": args.rounds, "G": args.G, "partial": partial,
           "loadavg_start": loadavg(), "per_round": []}
    for _ in range(args.rounds):
        before = kernels.peaks(dev, reps=args.reps, quick=args.quick)
        ks = kernels.kernels(x, q, dev, G=args.G, partial=partial, select_ratio=0.1, peak=before,
                             reps=args.reps)
        after = kernels.peaks(dev, reps=args.reps, quick=args.quick)
        pk = {**before, "matmul_gflops": max(before["matmul_gflops"], after["matmul_gflops"]),
              "copy_gbps": max(before["copy_gbps"], after["copy_gbps"]),
              "before": before, "after": after}
        for k in ks:  # against the round's best peak: a ceiling the machine reached
            if "gflops" in k:
                k["fraction_of_matmul"] = k["gflops"] / pk["matmul_gflops"]
            if "gbps" in k:
                k["fraction_of_copy"] = k["gbps"] / pk["copy_gbps"]
        res["per_round"].append({"peaks": pk, "kernels": ks})
    res["loadavg_end"] = loadavg()
    res["summary"] = summarize(res["per_round"])
    return res


def summarize(per_round: list) -> list:
    """Per kernel: median and min/max of its fraction (and of the peaks) over the rounds."""
    out = []
    for i, first in enumerate(per_round[0]["kernels"]):
        rows = [r["kernels"][i] for r in per_round]
        key = "fraction_of_matmul" if first["bound"] == "compute" else "fraction_of_copy"
        rate = "gflops" if first["bound"] == "compute" else "gbps"
        fr = [r[key] for r in rows]
        out.append({"kernel": first["kernel"], "bound": first["bound"], "of": key,
                    "median": median(fr), "min": min(fr), "max": max(fr),
                    "rate_median": median([r[rate] for r in rows]), "rate_unit": rate,
                    "meets_target": (median(fr) >= TARGET) if first["bound"] == "compute" else None,
                    "limit": _limit(first["kernel"]) if first["bound"] == "memory" else "",
                    "note": first.get("note", "")})
    return out


def report(res: dict) -> str:
    pk = [r["peaks"] for r in res["per_round"]]
    mm = [p["matmul_gflops"] for p in pk]
    cp = [p["copy_gbps"] for p in pk]
    lines = ["## Hardware efficiency (interleaved rounds)", "", "Produced by:", "", "```",
             res["command"], "```", "",
             f"Machine: {res['machine']['cpu_model']}, {res['machine']['cpu_count']} cores, torch "
             f"threads {res['threads']}, loadavg {res['loadavg_start']} → {res['loadavg_end']}. "
             f"n = {res['rows']:,} × {res['dim']}, G = {res['G']}, {res['rounds']} rounds; each "
             "round measures the peaks, every kernel (median of its reps), the peaks again, and "
             "takes each fraction against the higher peak. Peaks over the "
             f"rounds: matmul {median(mm):.1f} GFLOP/s ({min(mm):.1f}–{max(mm):.1f}), copy "
             f"{median(cp):.1f} GB/s ({min(cp):.1f}–{max(cp):.1f}) (read + write).", "",
             "| kernel | bound | achieved (median) | fraction of peak: median (min–max) | "
             "≥ 50% | what bounds it |",
             "|---|---|---|---|---|---|"]
    for s in res["summary"]:
        unit = "GFLOP/s" if s["rate_unit"] == "gflops" else "GB/s"
        of = "matmul" if s["bound"] == "compute" else "copy"
        met = "" if s["meets_target"] is None else ("yes" if s["meets_target"] else "**no**")
        lines.append(f"| {s['kernel']} | {s['bound']} | {s['rate_median']:.1f} {unit} | "
                     f"{s['median']:.0%} of {of} ({s['min']:.0%}–{s['max']:.0%}) | {met} | "
                     f"{s['limit'] or s['note']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--G", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default="bench/results")
    p.add_argument("--tag", default="efficiency")
    p.add_argument("--quick", action="store_true", help="2000 x 32, 1 round: the CI smoke run")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.argv = argv
    if args.quick:
        args.rows, args.dim, args.G, args.rounds, args.reps = 2000, 32, 16, 1, 1
        if args.out == p.get_default("out"):
            args.out = "bench/results/tmp/efficiency_quick"
    res = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"results_{args.tag}.json").write_text(json.dumps(res, indent=1, default=float))
    (out / f"REPORT_{args.tag}.md").write_text(report(res))
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
