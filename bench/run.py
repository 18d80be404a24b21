"""DATAMASK benchmark suite.

    .venv/bin/python -m bench.run --mode quick            # seconds: CI smoke run
    .venv/bin/python -m bench.run --mode full             # the recorded run (bench/results/)
    .venv/bin/python -m bench.run --mode full --parquet shard.parquet --sizes 10000,50000
    .venv/bin/python -m bench.run --mode full --device cuda --sizes 1000000 --dim 768 ...

Writes ``<out>/results_<mode>.json`` (machine-readable, rewritten after every section) and
``<out>/REPORT.md`` (the command, the machine, library versions, every table). Sections:

* ``time_to_greedy``: per term and n, greedy vs the learner ("paper") with whole-shard
  evaluation of its read-out, "paper+polish", "topk+polish", "greedy+polish"; the greedy growth
  exponent and extrapolated greedy times where greedy was not run;
* ``term_norm``: none vs standardize, whole-shard f;
* ``hardware``: matmul / copy peaks, per-term kernels as fractions of them, the learner's time
  inside vs outside the objective;
* ``speedups``: before/after of the engine speed-ups, interleaved;
* ``pipeline``: one shard through Dagster vs the bare engine CLI (full mode).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import sys
import time
from pathlib import Path

TERMS = ("DiSF", "Facility", "Pair_simi")
SECTIONS = ("time_to_greedy", "term_norm", "hardware", "speedups", "pipeline", "peer")

MODES = {
    "quick": dict(sizes=[2000], dim=32, steps=100, rollouts=32, reps=1, reps_small=1,
                  greedy_max_n={"DiSF": 10**9, "Facility": 10**9, "Pair_simi": 10**9},
                  polish_budget_s=60.0, term_norm_n=2000, kernel_n=2000, share_steps=30,
                  pipeline=False, pipeline_rows=1000, pipeline_dim=32, pipeline_preset="cpu-demo",
                  ablation_max_n=10**9),
    "full": dict(sizes=[5000, 10000, 20000, 50000, 100000], dim=128, steps=1000, rollouts=128,
                 reps=1, reps_small=3,
                 greedy_max_n={"DiSF": 20000, "Facility": 20000, "Pair_simi": 100000},
                 polish_budget_s=150.0, term_norm_n=10000, kernel_n=100000, share_steps=150,
                 pipeline=True, pipeline_rows=5000, pipeline_dim=768, pipeline_preset="upstream",
                 ablation_max_n=20000),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=tuple(MODES), default="quick")
    p.add_argument("--out", default=None, help="output folder (default: bench/results for full, "
                                               "bench/results/tmp/<mode> otherwise)")
    p.add_argument("--parquet", default=None, help="use this shard (first n rows per size) instead "
                                                   "of the sample generator")
    p.add_argument("--sizes", default=None, help="comma-separated n (default per mode)")
    p.add_argument("--dim", type=int, default=None, help="embedding dim of generated shards")
    p.add_argument("--terms", default=",".join(TERMS))
    p.add_argument("--steps", type=int, default=None, help="learner steps (n_epochs)")
    p.add_argument("--rollouts", type=int, default=None, help="G")
    p.add_argument("--partial", type=float, default=0.05)
    p.add_argument("--max-batch", type=int, default=1000, help="cap on the batch m = partial * n")
    p.add_argument("--max-batch-term", action="append", default=[],
                   help="TERM=M: a per-term cap on the batch (repeatable)")
    p.add_argument("--lamb", type=float, default=0.5)
    p.add_argument("--select-ratio", type=float, default=0.1)
    p.add_argument("--reps", type=int, default=None, help="repetitions for n > 10^4")
    p.add_argument("--reps-small", type=int, default=None, help="repetitions for n <= 10^4")
    p.add_argument("--greedy-max-n", action="append", default=[],
                   help="TERM=N: run greedy up to this n (else extrapolate); repeatable")
    p.add_argument("--polish-budget-s", type=float, default=None)
    p.add_argument("--ablation-max-n", type=int, default=None,
                   help="run topk+polish only up to this n (default per mode)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", default="", help="comma-separated sections to skip: " + ",".join(SECTIONS))
    p.add_argument("--pipeline", action=argparse.BooleanOptionalAction, default=None,
                   help="time Dagster vs the engine CLI (default: full mode only)")
    p.add_argument("--pipeline-rows", type=int, default=None)
    p.add_argument("--pipeline-dim", type=int, default=None)
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for the whole run (and OMP_NUM_THREADS of the pipeline "
                        "subprocesses); default: torch's choice")
    p.add_argument("--tag", default=None,
                   help="suffix for the output names (results_<mode>_<tag>.json, REPORT_<tag>.md)")
    p.add_argument("--peer-path", default=None,
                   help="folder where apricot-select is installed (pip --target): run the outside "
                        "peer section (facility location, lambda = 0)")
    p.add_argument("--greedy-points-from", default=None,
                   help="results JSON of an earlier run on the same machine: its measured greedy "
                        "times join the growth fit used for extrapolation")
    return p


class Opts:
    def __init__(self, args):
        m = MODES[args.mode]
        self.mode = args.mode
        self.sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else list(m["sizes"])
        self.dim = args.dim or m["dim"]
        self.terms = [t.strip() for t in args.terms.split(",") if t.strip()]
        self.steps = args.steps or m["steps"]
        self.rollouts = args.rollouts or m["rollouts"]
        self.partial = args.partial
        self.max_batch = args.max_batch
        self.max_batch_term = {t: int(v) for t, v in (i.split("=") for i in args.max_batch_term)}
        self.lamb = args.lamb
        self.select_ratio = args.select_ratio
        self.reps_big = args.reps or m["reps"]
        self.reps_small = args.reps_small or m["reps_small"]
        self.reps = 1
        self.greedy_max_n = dict(m["greedy_max_n"])
        for item in args.greedy_max_n:
            t, v = item.split("=")
            self.greedy_max_n[t] = int(float(v))
        self.polish_budget_s = args.polish_budget_s or m["polish_budget_s"]
        self.ablation_max_n = args.ablation_max_n or m["ablation_max_n"]
        self.device = args.device
        self.seed = args.seed
        self.skip = {s for s in args.skip.split(",") if s}
        self.pipeline = m["pipeline"] if args.pipeline is None else args.pipeline
        self.pipeline_rows = args.pipeline_rows or m["pipeline_rows"]
        self.pipeline_dim = args.pipeline_dim or m["pipeline_dim"]
        self.pipeline_preset = m["pipeline_preset"]
        self.term_norm_n = m["term_norm_n"]
        self.kernel_n = m["kernel_n"]
        self.share_steps = m["share_steps"]


def _jsonable(o):
    import numpy as np

    if isinstance(o, dict):
        return {str(k): _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
        return None
    return o


def _write(out: Path, res: dict) -> None:
    from .report import render

    out.mkdir(parents=True, exist_ok=True)
    tag = f"_{res['tag']}" if res.get("tag") else ""
    path = out / f"results_{res['mode']}{tag}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(_jsonable(res), indent=1, allow_nan=False))
    tmp.replace(path)
    (out / f"REPORT{tag}.md").write_text(render(_jsonable(res)))


def _warmup(opts, dev) -> None:
    """One tiny run of greedy, the learner and the polish per term, so that no timed run pays
    for first-call initialisation (thread pools, kernel selection, CUDA context)."""
    from datamask_pipeline.engine.baselines import greedy
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.learner import learn
    from datamask_pipeline.engine.polish import polish

    from .common import sample_data

    x, q, _ = sample_data(600, opts.dim, seed=123)
    for term in opts.terms:
        g = greedy(x, q, 60, term, opts.lamb, device=dev)
        learn(x, q, LearnerConfig(algorithm=term, n_epochs=5, n_rollout=8, partial=0.5), device=dev)
        polish(x, q, g, term, opts.lamb, device=dev)


def _defaults(res: dict) -> dict:
    """What ``solver=auto`` (the pipeline's default) picks per term, from the table that
    ``python -m bench.solvers --write-table`` measured (engine/solver_table.json)."""
    from datamask_pipeline.engine import solver_table
    from datamask_pipeline.engine.config import profile_defaults

    rules = solver_table.load().get("rules", {}).get("cpu", {})
    out = {}
    for term in TERMS:
        rows = rules.get(term, [])
        picks = "; ".join(f"n ≤ {r['max_n']:,}: `{r['solver']}` ({r['why']})" for r in rows)
        out[term] = {"solver": "auto", "engine_default": profile_defaults("pipeline")["solver"],
                     "why": picks or f"not measured: {solver_table.FALLBACK}"}
    return out


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    opts = Opts(args)
    repo = Path(__file__).resolve().parent.parent
    out = Path(args.out) if args.out else (repo / "bench" / "results" if opts.mode == "full"
                                           else repo / "bench" / "results" / "tmp" / opts.mode)
    import torch

    from datamask_pipeline.engine.device import resolve_device

    from . import common, kernels, time_to_greedy as ttg

    dev = resolve_device(opts.device)
    opts.device = dev
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    src = common.DataSource(opts.dim, opts.seed, args.parquet)
    if src.max_n is not None:
        opts.sizes = [n for n in opts.sizes if n <= src.max_n] or [src.max_n]
    cmd = " ".join([".venv/bin/python -m bench.run"] + [shlex.quote(a) for a in
                                                         (argv if argv is not None else sys.argv[1:])])
    res = {"schema_version": 1, "mode": opts.mode, "tag": args.tag, "command": cmd,
           "started": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": common.machine_info(dev), "data": src.describe(),
           "settings": {"sizes": opts.sizes, "dim": opts.dim, "terms": opts.terms, "steps": opts.steps,
                        "rollouts": opts.rollouts, "partial": opts.partial, "max_batch": opts.max_batch,
                        "max_batch_term": opts.max_batch_term,
                        "lamb": opts.lamb, "select_ratio": opts.select_ratio,
                        "reps_small": opts.reps_small, "reps_big": opts.reps_big,
                        "greedy_max_n": opts.greedy_max_n, "polish_budget_s": opts.polish_budget_s,
                        "ablation_max_n": opts.ablation_max_n,
                        "device": str(dev), "seed": opts.seed},
           "notes": []}

    def log(msg):
        print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)

    data_cache = {}

    def data(n):
        if n not in data_cache:
            data_cache.clear()
            data_cache[n] = src.get(n)
        return data_cache[n]

    # ------------------------------------------------------------ time to greedy
    if "time_to_greedy" not in opts.skip:
        cells = []
        res["time_to_greedy"] = {"cells": cells}
        extra = {}
        if args.greedy_points_from:
            prev = json.loads(Path(args.greedy_points_from).read_text())
            for c in prev.get("time_to_greedy", {}).get("cells", []):
                if c["greedy"].get("measured"):
                    extra.setdefault(c["term"], []).append((c["n"], c["greedy"]["wall_s"]))
            res["time_to_greedy"]["greedy_points_from"] = {"path": args.greedy_points_from,
                                                           "points": extra}
        log("warm-up (first calls of every kernel, not timed)")
        _warmup(opts, dev)
        for n in opts.sizes:
            x, q, ids = data(n)
            for term in opts.terms:
                opts.reps = opts.reps_small if n <= 10_000 else opts.reps_big
                run_g = n <= opts.greedy_max_n.get(term, 0)
                log(f"time_to_greedy {term} n={n} (greedy {'run' if run_g else 'extrapolated'})")
                cells.append(ttg.run_cell(x, q, ids, term, opts, run_greedy=run_g, log=log))
                res["time_to_greedy"]["greedy_fits"] = ttg.add_extrapolations(cells, extra)
                _write(out, res)
        res["defaults"] = _defaults(res)
        _write(out, res)

    # ----------------------------------------------------------------- term norm
    if "term_norm" not in opts.skip:
        from datamask_pipeline.engine.evaluate import evaluate_selection
        from datamask_pipeline.engine.learner import learn
        from datamask_pipeline.engine.polish import polish

        n = min(opts.term_norm_n, max(opts.sizes), src.max_n or opts.term_norm_n)
        x, q, ids = data(n)
        rows, verdict = [], {}
        for term in opts.terms:
            cfg = ttg.learner_config(term, n, opts)
            pair = {}
            for norm in ("none", "standardize"):
                log(f"term_norm {term} {norm} n={n}")
                with common.Timer(dev) as t:
                    r = learn(x, q, cfg.replace(term_norm=norm), ids=ids, device=dev)
                ev = evaluate_selection(x, q, r.selected_idx, lamb=opts.lamb, terms=(term,), device=dev)
                pr = polish(x, q, r.selected_idx, term, opts.lamb, device=dev,
                            time_budget_s=opts.polish_budget_s)
                fp = evaluate_selection(x, q, pr.selected, lamb=opts.lamb, terms=(term,), device=dev)
                row = {"term": term, "term_norm": norm, "n": n, "f": ev["f"][term], "f_qua": ev["f_qua"],
                       "f_div": ev["f_div"][term], "f_polished": fp["f"][term], "learner_s": t.wall}
                rows.append(row)
                pair[norm] = row
            a, b = pair["none"], pair["standardize"]
            better = "none" if a["f"] >= b["f"] else "standardize"
            verdict[term] = (f"whole-shard f {a['f']:.6f} (none) vs {b['f']:.6f} (standardize): "
                             f"{better} is higher by {abs(a['f'] - b['f']):.2e} after the learner; after the "
                             f"polish {a['f_polished']:.6f} vs {b['f_polished']:.6f}; standardize moves "
                             f"f_div {b['f_div'] - a['f_div']:+.4f} and f_qua {b['f_qua'] - a['f_qua']:+.4f}")
        res["term_norm"] = {"n": n, "rows": rows, "verdict": verdict}
        _write(out, res)

    # ------------------------------------------------------------------ hardware
    if "hardware" not in opts.skip:
        log("hardware peaks and kernels")
        pk = kernels.peaks(dev, quick=opts.mode == "quick")
        n = min(opts.kernel_n, max(opts.sizes), src.max_n or opts.kernel_n)
        x, q, ids = data(n)
        part = min(opts.partial, opts.max_batch / n)
        ks = kernels.kernels(x, q, dev, G=opts.rollouts, partial=max(part, 300 / n),
                             select_ratio=opts.select_ratio, peak=pk)
        share = []
        ns = min(10_000 if opts.mode == "full" else n, n)
        xs, qs = x[:ns], q[:ns]
        for term in opts.terms:
            cfg = ttg.learner_config(term, ns, opts)
            log(f"objective share {term} n={ns}")
            r = kernels.objective_share(xs, qs, cfg, dev, steps=opts.share_steps)
            r.update({"term": term, "n": ns, "G": cfg.n_rollout, "m": cfg.sizes(ns)["batch"]})
            share.append(r)
        log("thread scaling (1 vs all threads, interleaved)")
        threads = kernels.thread_scaling(xs, qs, dev, ttg.learner_config("DiSF", ns, opts),
                                         steps=opts.share_steps) if dev.type == "cpu" else None
        res["hardware"] = {"device": str(dev), "peaks": pk, "kernels": ks, "objective_share": share,
                           "thread_scaling": threads}
        _write(out, res)

    # ------------------------------------------------------------------ speedups
    if "speedups" not in opts.skip:
        log("speed-ups before/after")
        n = min(10_000 if opts.mode == "full" else 2000, max(opts.sizes), src.max_n or 10**9)
        x, q, ids = data(n)
        res["speedups"] = kernels.speedups(x, q, dev, G=opts.rollouts, quick=opts.mode == "quick")
        _write(out, res)

    # ------------------------------------------------------------------ pipeline
    if "pipeline" not in opts.skip:
        if opts.pipeline and dev.type == "cpu":
            from .pipeline import pipeline_overhead

            log(f"pipeline: Dagster vs engine CLI, {opts.pipeline_rows} rows x {opts.pipeline_dim}-d")
            work = out / "tmp" / "pipeline" if opts.mode == "full" else out / "pipeline_work"
            import shutil

            shutil.rmtree(work, ignore_errors=True)
            res["pipeline"] = pipeline_overhead(work, opts.pipeline_rows, opts.pipeline_dim,
                                                preset=opts.pipeline_preset, threads=args.threads,
                                                log=log)
        else:
            res["pipeline"] = {"skipped": "not requested in this mode (--pipeline to run it)"
                               if not opts.pipeline else "CPU only"}
        _write(out, res)

    # ---------------------------------------------------------------------- peer
    if "peer" not in opts.skip and args.peer_path:
        from .peer import run_peer

        n = min(10_000 if opts.mode == "full" else 2000, max(opts.sizes), src.max_n or 10**9)
        x, q, ids = data(n)
        log(f"peer: apricot-select facility location vs ours, n={n}")
        res["peer"] = run_peer(x, q, ids, opts, args.peer_path, log=log)
        _write(out, res)

    res["machine"]["loadavg_end"] = common.loadavg()
    res["total_s"] = time.perf_counter() - t_start
    if torch.cuda.is_available() and dev.type == "cuda":
        res["machine"]["cuda_max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    _write(out, res)
    tag = f"_{args.tag}" if args.tag else ""
    log(f"wrote {out / f'results_{opts.mode}{tag}.json'} and {out / f'REPORT{tag}.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
