"""Solver × term × n: whole-shard f / f_greedy and time / greedy's time, through the engine's
one entry (``engine.select.select_shard``), and the ``auto`` table derived from it.

    .venv/bin/python -m bench.solvers --sizes 5000,20000,100000 --reps 3 --threads 1
    .venv/bin/python -m bench.solvers --quick          # seconds: CI smoke run (no table written)

Every (term, n) cell runs each solver ``reps`` times round-robin (so machine noise hits them
alike) and keeps the medians and the spread. Greedy (the engine's exact greedy) runs where
``--greedy-max-n`` allows; elsewhere its time is extrapolated from the growth fitted on the
sizes where it ran, and labelled. ``--write-table`` turns the results into
``datamask_pipeline/engine/solver_table.json``: per term, λ and n, the fastest solver whose f
is the best measured (within ``TIE`` relative), with the command that produced it. The table
is keyed by device: the rules of the device this run measured (``--device``: cpu, cuda) are
merged in and every other device's rules are kept, so one run on a GPU machine adds GPU rules
without touching the CPU ones (``engine.solver_table.merge``):

    .venv/bin/python -m bench.solvers --device cuda --sizes 5000,20000,100000 --reps 1 --write-table
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np

from .common import DataSource, machine_info, median, torch_threads

TERMS = ("DiSF", "Facility", "Pair_simi")
SOLVERS = ("paper", "paper+polish", "topk+polish", "sgreedy+polish")
# Two f values within this relative distance count as the same f (float noise of the
# whole-shard evaluation is ~1e-7).
TIE = 1e-6
OUT = Path(__file__).resolve().parent / "results"


def _solve_time(sel) -> float:
    """Solver seconds, the whole-shard scoring of the references excluded."""
    t = sel.timings
    return t.get("learn_s", 0.0) + t.get("start_s", 0.0) + t.get("polish_s", 0.0)


class _Shard:
    def __init__(self, x, q, ids):
        self.embeddings, self.quality, self.ids = x, q, ids


def run_cell(x, q, ids, term: str, opts) -> dict:
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.select import select_shard

    n = x.shape[0]
    shard = _Shard(x, q, ids)
    partial = max(opts.partial, min(1.0, 30 / (opts.select_ratio * n)))
    partial = min(partial, opts.max_batch / n) if opts.max_batch / n >= 30 / (opts.select_ratio * n) else partial
    base = LearnerConfig(algorithm=term, lamb=opts.lamb, select_ratio=opts.select_ratio,
                         n_epochs=opts.steps, n_rollout=opts.rollouts, partial=partial,
                         seed=opts.seed)
    solvers = list(opts.solvers)
    run_greedy = n <= opts.greedy_max_n.get(term, 0)
    if run_greedy:
        solvers.append("greedy")
    runs = {s: [] for s in solvers}
    for rep in range(opts.reps if n <= opts.reps_max_n else 1):
        for s in solvers:
            if s == "greedy" and rep > 0 and n > opts.reps_max_n // 2:
                continue  # exact greedy once at the larger sizes: it dominates the bench's time
            sel = select_shard(shard, base.replace(solver=s), device=opts.device,
                               references=False)
            runs[s].append({"f": sel.scores["selection"].f, "time_s": _solve_time(sel),
                            "route": sel.route, "guard": sel.guard,
                            "f_topk": sel.scores["quality_topk"].f,
                            "converged": (sel.polish or {}).get("converged"),
                            "swaps": (sel.polish or {}).get("swaps")})
            print(f"  {term} n={n} {s:15s} f={runs[s][-1]['f']:.7f} t={runs[s][-1]['time_s']:.2f}s"
                  + (f" guard: {sel.guard}" if sel.guard else ""), flush=True)
    cell = {"term": term, "n": n, "d": int(x.shape[1]), "lamb": float(opts.lamb), "partial": partial,
            "steps": opts.steps, "rollouts": opts.rollouts, "solvers": {}}
    for s, rs in runs.items():
        ts = [r["time_s"] for r in rs]
        cell["solvers"][s] = {"f": median([r["f"] for r in rs]), "time_s": median(ts),
                              "time_min_s": min(ts), "time_max_s": max(ts), "reps": len(rs),
                              "runs": rs}
    cell["f_topk"] = runs[solvers[0]][0]["f_topk"]
    return cell


def fit_growth(points: list) -> dict | None:
    """Least-squares fit of log t = a + b log n over (n, t) points (≥ 2 sizes)."""
    pts = [(n, t) for n, t in points if t and t > 0]
    if len({n for n, _ in pts}) < 2:
        return None
    ln = np.log([p[0] for p in pts])
    lt = np.log([p[1] for p in pts])
    b, a = np.polyfit(ln, lt, 1)
    return {"exponent": float(b), "log_coef": float(a), "fitted_on": sorted({p[0] for p in pts})}


def add_greedy_reference(cells: list) -> None:
    """f_greedy and greedy's time per cell: measured, or the time extrapolated (labelled)."""
    for term in {c["term"] for c in cells}:
        mine = [c for c in cells if c["term"] == term]
        fit = fit_growth([(c["n"], c["solvers"]["greedy"]["time_s"]) for c in mine
                          if "greedy" in c["solvers"]])
        for c in mine:
            g = c["solvers"].get("greedy")
            if g:
                c["greedy_time_s"], c["greedy_time_kind"], c["f_greedy"] = g["time_s"], "measured", g["f"]
            elif fit:
                c["greedy_time_s"] = float(math.exp(fit["log_coef"] + fit["exponent"] * math.log(c["n"])))
                c["greedy_time_kind"] = f"extrapolated (n^{fit['exponent']:.2f}, fitted on {fit['fitted_on']})"
                c["f_greedy"] = None
            else:
                c["greedy_time_s"], c["greedy_time_kind"], c["f_greedy"] = None, "unknown", None
            c["greedy_fit"] = fit
            for s, r in c["solvers"].items():
                r["frac_of_greedy"] = (r["f"] / c["f_greedy"]) if c["f_greedy"] else None
                r["time_vs_greedy"] = (r["time_s"] / c["greedy_time_s"]) if c["greedy_time_s"] else None


def best_route(cell: dict) -> dict:
    """The fastest solver whose f is the best measured in the cell (greedy excluded: it is
    the reference, not a route ``auto`` takes)."""
    cands = {s: r for s, r in cell["solvers"].items() if s != "greedy"}
    f_best = max(r["f"] for r in cands.values())
    tied = {s: r for s, r in cands.items() if r["f"] >= f_best - TIE * abs(f_best)}
    s = min(tied, key=lambda k: tied[k]["time_s"])
    return {"solver": s, "f": tied[s]["f"], "time_s": tied[s]["time_s"], "f_best": f_best}


# Cells of results written before the bench recorded λ were all run at its default.
DEFAULT_LAMB = 0.5


def build_rules(cells: list) -> dict:
    """{term: [{max_n, solver, why, lamb}]}: per term and λ measured, sizes between two
    measured n go to the nearer one on a log scale; the last row covers every larger n."""
    rules: dict = {}
    for term in sorted({c["term"] for c in cells}):
        rows = []
        for lamb in sorted({c.get("lamb", DEFAULT_LAMB) for c in cells if c["term"] == term}):
            mine = sorted((c for c in cells if c["term"] == term and c.get("lamb", DEFAULT_LAMB) == lamb),
                          key=lambda c: c["n"])
            for i, c in enumerate(mine):
                b = best_route(c)
                nxt = mine[i + 1]["n"] if i + 1 < len(mine) else None
                max_n = int(math.sqrt(c["n"] * nxt)) if nxt else 10**12
                why = (f"measured at n={c['n']}: f={b['f']:.7g}, the best of the solvers measured, "
                       f"in {b['time_s']:.3g}s")
                rows.append({"max_n": max_n, "solver": b["solver"], "why": why, "lamb": float(lamb)})
        rules[term] = rows
    return rules


def build_table(cells: list, command: str, results_path: str, device: str = "cpu",
                table: dict | None = None, machine: dict | None = None) -> dict:
    """``solver_table.json`` with this run's rules for ``device`` merged into ``table`` (the
    committed table when written by ``--write-table``; empty when None): the other devices,
    and the terms and λ values this run did not measure, are kept."""
    from datamask_pipeline.engine import solver_table

    m = machine or {}
    source = {"command": command, "results": results_path,
              "created": _dt.datetime.now().isoformat(timespec="seconds"),
              "lamb": sorted({c.get("lamb", DEFAULT_LAMB) for c in cells}),
              "machine": ", ".join(str(v) for v in (m.get("cuda_device") or m.get("cpu_model"),
                                                    m.get("torch_threads") and f"{m['torch_threads']} torch threads")
                                   if v)}
    return solver_table.merge(table or {}, device, build_rules(cells), source)


def markdown(cells: list, command: str, info: dict) -> str:
    lines = ["## Solvers × term × n (whole-shard f / f_greedy, time / greedy's time)", "",
             "Produced by:", "", "```", command, "```", "",
             f"Machine: {info.get('cpu_model')}, {info.get('cpu_count')} cores, torch threads "
             f"{info.get('torch_threads')}, load {info.get('loadavg_start')} → {info.get('loadavg_end')}. "
             "Times are solver seconds (learning + start selection + polish; the scoring of the "
             "reference selections excluded), medians over interleaved reps, with [min–max]. "
             "Greedy is the engine's exact greedy; *ext* marks a time extrapolated from its growth.", ""]
    for term in sorted({c["term"] for c in cells}):
        lines += [f"### {term}", "",
                  "| n | greedy time | solver | f / f_greedy | f − f_topk | time | × greedy's time | reps | note |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in sorted((c for c in cells if c["term"] == term), key=lambda c: c["n"]):
            gt = c.get("greedy_time_s")
            gts = "—" if gt is None else (f"{gt:.3g}s" + ("" if c["greedy_time_kind"] == "measured" else " *ext*"))
            best = best_route(c)["solver"]
            for s, r in c["solvers"].items():
                frac = "—" if r.get("frac_of_greedy") is None else f"{100 * r['frac_of_greedy']:.3f}%"
                tvg = "—" if r.get("time_vs_greedy") is None else f"{100 * r['time_vs_greedy']:.2f}%"
                note = "auto's choice" if s == best else ""
                guards = [x["guard"] for x in r["runs"] if x.get("guard")]
                if guards:
                    note += (" " if note else "") + "guard fired"
                lines.append(f"| {c['n']} | {gts} | {s} | {frac} | {r['f'] - c['f_topk']:+.6f} | "
                             f"{r['time_s']:.3g}s [{r['time_min_s']:.3g}–{r['time_max_s']:.3g}] | "
                             f"{tvg} | {r['reps']} | {note} |")
        lines.append("")
    return "\n".join(lines)


def auto_route(term: str, n: int, lamb: float = DEFAULT_LAMB, device: str = "cpu") -> str:
    """The route ``solver: auto`` runs today for ``term`` at n rows (the pipeline profile):
    the table's rule, then route_for's overrides (e.g. sparse facility location -> greedy)."""
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.select import route_for

    return route_for(LearnerConfig.profile("pipeline", algorithm=term, lamb=lamb), n, device)[0]


def readme_table(cells: list, solvers=SOLVERS) -> str:
    """The README's summary: per term and n, each solver's f / f_greedy · time / greedy's time,
    and the route ``auto`` runs there today, from ``engine.select.route_for`` (marked where it
    is not the measured best of the row, e.g. facility location on the sparse similarity,
    which these dense cells do not measure). tests/engine/test_docs.py and
    tests/engine/test_solver_docs.py keep the README equal to this table rendered from the
    committed results."""
    head = "| term | n | greedy (exact) | " + " | ".join(f"`{s}`" for s in solvers) + " | `auto` runs |"
    lines = [head, "|" + "---|" * (len(solvers) + 4)]
    for c in sorted(cells, key=lambda c: (c["term"], c["n"])):
        gt = c.get("greedy_time_s")
        g = "—" if gt is None else f"{gt:.3g} s" + ("" if c["greedy_time_kind"] == "measured" else " *ext*")
        row = [c["term"], f"{c['n']:,}", g]
        for s in solvers:
            r = c["solvers"].get(s)
            if r is None:
                row.append("—")
                continue
            frac = "f ?" if r.get("frac_of_greedy") is None else f"{100 * r['frac_of_greedy']:.3f}%"
            tvg = f"{r['time_s']:.3g} s" if r.get("time_vs_greedy") is None else f"{100 * r['time_vs_greedy']:.2f}% time"
            row.append(f"{frac} · {tvg}")
        best, now = best_route(c)["solver"], auto_route(c["term"], c["n"], c.get("lamb", DEFAULT_LAMB))
        row.append(f"`{now}`" + ("" if now == best else f" (not measured here; best here `{best}`)"))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def learner_table(cells: list, solvers=("paper", "paper+polish", "topk+polish")) -> str:
    """The README's learner-at-the-paper's-settings table: per term and n, each solver's f
    against exact greedy's (where greedy ran) and against quality top-k, its median time with
    the range, and the learner's time over ``topk+polish``'s (medians of the same cell's
    interleaved reps). tests/engine/test_docs.py keeps the README equal to it."""
    lines = ["| term | n | steps · partial · rollouts | greedy f (time) | "
             + " | ".join(f"`{s}`: f / f_greedy, f − f_topk, time" for s in solvers)
             + " | `paper` time ÷ `topk+polish` time |",
             "|" + "---|" * (len(solvers) + 5)]
    for c in sorted(cells, key=lambda c: (c["term"], c["n"])):
        g = c["solvers"].get("greedy")
        row = [c["term"], f"{c['n']:,}", f"{c['steps']:,} · {c['partial']:g} · {c['rollouts']}",
               "—" if g is None else f"{g['f']:.5f} ({g['time_s']:.3g} s)"]
        for name in solvers:
            r = c["solvers"].get(name)
            if r is None:
                row.append("—")
                continue
            frac = "—" if g is None else f"{100 * r['f'] / g['f']:.3f}%"
            row.append(f"{frac}, {r['f'] - c['f_topk']:+.5f}, {r['time_s']:.3g} s "
                       f"[{r['time_min_s']:.3g}–{r['time_max_s']:.3g}] ×{r['reps']}")
        p, t = c["solvers"].get("paper"), c["solvers"].get("topk+polish")
        row.append("—" if not (p and t) else f"{p['time_s'] / t['time_s']:,.0f}×")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.solvers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI smoke run: n=1500, d=16, 30 steps")
    p.add_argument("--sizes", default="5000,20000")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--terms", default=",".join(TERMS))
    p.add_argument("--solvers", default=",".join(SOLVERS))
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--rollouts", type=int, default=128)
    p.add_argument("--partial", type=float, default=0.05)
    p.add_argument("--max-batch", type=int, default=1000)
    p.add_argument("--lamb", type=float, default=0.5)
    p.add_argument("--select-ratio", type=float, default=0.1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--reps-max-n", type=int, default=20000, help="one rep above this n")
    p.add_argument("--greedy-max-n", action="append", default=[],
                   help="TERM=N: run exact greedy up to this n (default DiSF=20000, "
                        "Facility=20000, Pair_simi=100000)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--parquet", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--tag", default="solvers")
    p.add_argument("--also", action="append", default=[],
                   help="results JSON of an earlier run of this section (other sizes or terms): "
                        "its cells join this run's report and table (repeatable)")
    p.add_argument("--write-table", action="store_true",
                   help="merge this run's rules for its device into the solver table (the other "
                        "devices' rules are kept)")
    p.add_argument("--table", default=None,
                   help="the solver table --write-table merges into (default: the engine's "
                        "datamask_pipeline/engine/solver_table.json)")
    a = p.parse_args(argv)
    if a.quick:
        a.sizes, a.dim, a.steps, a.rollouts, a.reps = "1500", 16, 30, 16, 1
    a.sizes = [int(s) for s in a.sizes.split(",")]
    a.terms = [t for t in a.terms.split(",") if t]
    a.solvers = [s for s in a.solvers.split(",") if s]
    a.greedy_max_n = {"DiSF": 20000, "Facility": 20000, "Pair_simi": 100000,
                      **{t: int(float(v)) for t, v in (i.split("=") for i in a.greedy_max_n)}}
    out = Path(a.out) if a.out else (OUT / "tmp" / "quick" if a.quick else OUT)
    out.mkdir(parents=True, exist_ok=True)
    command = ".venv/bin/python -m bench.solvers " + " ".join(shlex.quote(s) for s in (argv if argv is not None else sys.argv[1:]))
    t0 = time.perf_counter()
    with torch_threads(a.threads):
        info = machine_info(a.device)
        data = DataSource(a.dim, a.seed, a.parquet)
        cells = []
        for n in a.sizes:
            x, q, ids = data.get(n)
            for term in a.terms:
                cells.append(run_cell(x, q, ids, term, a))
        info["loadavg_end"] = machine_info(a.device).get("loadavg_start")
    earlier = [json.loads(Path(f).read_text()) for f in a.also]
    commands = [e["command"] for e in earlier] + [command]
    for e in earlier:
        mine = {(c["term"], c["n"]) for c in cells}
        cells += [c for c in e["cells"] if (c["term"], c["n"]) not in mine]
    add_greedy_reference(cells)
    command = "\n".join(commands)
    res = {"command": command, "machine": info, "data": data.describe(), "cells": cells,
           "wall_s": time.perf_counter() - t0}
    json_path = out / f"results_{a.tag}.json"
    json_path.write_text(json.dumps(res, indent=1, default=float))
    (out / f"REPORT_{a.tag}.md").write_text(markdown(cells, command, info) + "\n")
    if a.write_table:
        from datamask_pipeline.engine import solver_table
        from datamask_pipeline.engine.device import resolve_device

        try:
            rel = str(json_path.resolve().relative_to(Path(__file__).resolve().parent.parent))
        except ValueError:
            rel = str(json_path)
        path = Path(a.table) if a.table else solver_table.TABLE_PATH
        old = json.loads(path.read_text()) if path.exists() else {}
        device = resolve_device(a.device).type
        table = build_table(cells, command, rel, device=device, table=old, machine=info)
        path.write_text(json.dumps(table, indent=1, ensure_ascii=False) + "\n")
        print(f"merged the {device} rules into {path}")
    print(f"wrote {json_path} and REPORT_{a.tag}.md in {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
