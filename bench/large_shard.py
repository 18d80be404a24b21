"""One shard at paper size through the pipeline, per term (issue 12 item 3).

    .venv/bin/python -m bench.large_shard --rows 1000000 --dim 768 --terms Facility,DiSF
    .venv/bin/python -m bench.large_shard --quick --out DIR      # seconds (tests/bench/)

For each term: a fresh Dagster instance over one generated raw shard (hard-linked, generated
once), README's ``dagster asset materialize --select features,mask,selected_subset`` with the
pipeline's defaults (solver ``auto``) and only ``algorithm`` (plus ``--knob k=v`` overrides) as
run config, at ``--threads`` torch threads. Recorded: each step's duration (Dagster's
STEP_SUCCESS lines), the run's wall and CPU time, its peak RSS (``ru_maxrss`` of the run's
process tree), the route the mask step took, and the whole-shard f of the selection, quality top-k
and random from the mask's selection record. Then, in this process, the reference at this
size: the engine's stochastic greedy (``baselines.stochastic_greedy``) on the same features,
scored by the same whole-shard objective; exact greedy only below ``--greedy-max-rows``.
A term the pre-flight refuses is recorded with the refusal's message. No timing is asserted.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .common import loadavg, machine_info
from .overhead import KEY, REPO, measured, run_steps, shard_env

CHAIN = "features,mask,selected_subset"


def generate(base: Path, rows: int, dim: int, seed: int = 0) -> Path:
    from datamask_pipeline.engine.sample import generate_corpus

    raw_dir = base / "raw_once"
    if raw_dir.exists():
        shutil.rmtree(raw_dir)
    generate_corpus(str(raw_dir), n_shards=1, rows_per_shard=rows, dim=dim, seed=seed)
    return raw_dir / f"{KEY}.parquet"


def workdir_for(base: Path, term: str, raw_file: Path, threads: int) -> tuple[Path, dict]:
    """A fresh data root with the raw shard hard-linked in, and a fresh instance with it
    registered as a partition (what ``python -m datamask_pipeline.register`` does)."""
    import dagster as dg

    from assets.partitions import register_shards

    wd = base / term
    if wd.exists():
        shutil.rmtree(wd)
    (wd / "dagster_home").mkdir(parents=True)
    (wd / "data" / "raw").mkdir(parents=True)
    shutil.copyfile(REPO / "dagster.yaml", wd / "dagster_home" / "dagster.yaml")
    os.link(raw_file, wd / "data" / "raw" / raw_file.name)
    with dg.DagsterInstance.from_config(str(wd / "dagster_home")) as instance:
        reg = register_shards(instance, str(wd / "data" / "raw"))
    if reg["added"] != [KEY]:
        raise RuntimeError(f"registering {raw_file} gave {reg}")
    return wd, shard_env(wd, threads)


def run_chain(wd: Path, env: dict, config: dict, timeout_s: int) -> dict:
    exe = Path(sys.executable).with_name("dagster")
    cmd = [str(exe), "asset", "materialize", "-m", "datamask_pipeline.definitions", "--select",
           CHAIN, "--partition", KEY, "--config-json",
           json.dumps({"ops": {"mask": {"config": config}}})]
    r = measured(cmd, env, timeout_s=timeout_s)
    r["command"] = " ".join(cmd[:-1] + [f"'{cmd[-1]}'"])
    r["steps_s"] = run_steps(wd)[1]
    return r


def selection_record(wd: Path):
    from datamask_pipeline.engine.storage.mask_file import read_mask

    _, rec = read_mask(str(wd / "data" / "masks" / f"{KEY}.parquet"), columns=["selected"])
    return rec


def reference(wd: Path, term: str, lamb: float, select_ratio: float, greedy_max_rows: int,
              seed: int = 0) -> dict:
    """Stochastic greedy (and exact greedy where small enough) on the published features,
    scored on the whole shard like the selection."""
    import numpy as np

    from datamask_pipeline.engine import terms as T
    from datamask_pipeline.engine.baselines import greedy, stochastic_greedy
    from datamask_pipeline.engine.config import LearnerConfig, n_select
    from datamask_pipeline.engine.data import read_shard
    from datamask_pipeline.engine.evaluate import make_ground_set
    from datamask_pipeline.engine.select import score_selection

    from assets.ingest import EMBEDDING, ID, QUALITY
    from datamask_pipeline.engine.data import Columns

    shard = read_shard(str(wd / "data" / "features" / f"{KEY}.parquet"),
                       columns=Columns(id=ID, quality=(QUALITY,), embedding=EMBEDDING))
    x, q = shard.embeddings, np.asarray(shard.quality)
    n = x.shape[0]
    k = n_select(select_ratio, n)
    term_obj = LearnerConfig(algorithm=term).diversity_term()
    out = {}
    runs = {"stochastic_greedy": lambda: stochastic_greedy(x, q, k, term_obj, lamb, seed=seed,
                                                           device="cpu")}
    if n <= greedy_max_rows:
        runs["greedy"] = lambda: greedy(x, q, k, term_obj, lamb, device="cpu")
    for name, fn in runs.items():
        t = time.perf_counter()
        idx = fn()
        wall = time.perf_counter() - t
        ground = make_ground_set(x, q, device="cpu")
        s = score_selection(ground, idx, term_obj, lamb)
        del ground
        out[name] = {"wall_s": wall, **s.as_dict()}
    out["sample_size"] = T.sample_size(n, k, 0.01)
    return out


def run(args) -> dict:
    base = Path(args.workdir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    res = {"command": " ".join([".venv/bin/python", "-m", "bench.large_shard"] + args.argv),
           "created": _dt.datetime.now().isoformat(timespec="seconds"),
           "machine": None, "rows": args.rows, "dim": args.dim, "threads": args.threads,
           "terms": {}, "tag": args.tag}
    import torch

    torch.set_num_threads(args.threads)
    res["machine"] = machine_info(torch.device("cpu"))
    t = time.perf_counter()
    raw = generate(base, args.rows, args.dim)
    res["generate_s"] = time.perf_counter() - t
    res["raw_bytes"] = raw.stat().st_size
    knobs = dict(kv.split("=", 1) for kv in args.knob)
    for term in args.terms.split(","):
        wd, env = workdir_for(base, term, raw, args.threads)
        cfg = {"algorithm": term}
        for k, v in knobs.items():
            if k.startswith(term + ".") or "." not in k:
                cfg[k.split(".", 1)[-1]] = json.loads(v)
        row = {"config": cfg, "loadavg_before": loadavg()}
        r = run_chain(wd, env, cfg, args.timeout_s)
        row.update({k: r[k] for k in ("wall_s", "cpu_s", "peak_rss_bytes", "steps_s",
                                      "command", "rc")})
        row["loadavg_after"] = loadavg()
        if r["rc"] != 0:
            log = r["stdout"] + r["stderr"]
            # the pre-flight (memory) or the run's first step (an impossible config) refuses it
            hits = [j for j in (log.find("PreflightError"), log.find("invalid mask configuration"))
                    if j >= 0]
            i = min(hits) if hits else -1
            row["refused"] = (log[i:i + 800] if i >= 0 else r["tail"][-1500:])
        else:
            rec = selection_record(wd)
            row.update({"route": rec.route, "solver": rec.solver, "n": rec.n, "k": rec.k,
                        "scores": rec.scores, "polish": rec.polish, "engine_timings_s": rec.timings})
            if not args.no_reference:
                row["reference"] = reference(wd, term, rec.lamb, rec.k / rec.n,
                                             args.greedy_max_rows)
        res["terms"][term] = row
        _write(res, Path(args.out))
        if not args.keep:
            shutil.rmtree(wd, ignore_errors=True)
    if not args.keep:
        shutil.rmtree(base / "raw_once", ignore_errors=True)
    return res


def _gib(b):
    return f"{b / 2**30:.2f} GiB"


def report(res: dict) -> str:
    lines = [f"## One shard at {res['rows']:,} × {res['dim']} through the pipeline", "",
             "Produced by:", "", "```", res["command"], "```", "",
             f"Machine: {res['machine']['cpu_model']}, {res['machine']['cpu_count']} cores, "
             f"torch threads {res['threads']}. Raw shard generated in {res['generate_s']:.1f} s "
             f"({_gib(res['raw_bytes'])} of zstd parquet). One run per term (n = 1: a run at "
             "this size takes minutes to hours here), so no spread is given.", "",
             "| term | route | features | checks | mask | selected_subset | run wall | peak RSS | "
             "f selection | f quality top-k | f random | reference f (time) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for term, r in res["terms"].items():
        st = r.get("steps_s", {})
        checks = sum(v for k, v in st.items() if "check" in k or "validate" in k)
        if r.get("refused"):
            lines.append(f"| {term} | refused | | | | | {r['wall_s']:.0f} s | "
                         f"{_gib(r['peak_rss_bytes'])} | — | — | — | {r['refused'][:200]!r} |")
            continue
        sc = r["scores"]
        ref = r.get("reference", {})
        refs = "; ".join(f"{k} {v['f']:.6f} ({v['wall_s']:.0f} s)" for k, v in ref.items()
                         if isinstance(v, dict))
        sel = sc.get("datamask") or sc.get("selection")
        lines.append(
            f"| {term} | {r['route']} | {st.get('features', 0):.1f} s | {checks:.1f} s | "
            f"{st.get('mask', 0):.1f} s | {st.get('selected_subset', 0):.1f} s | "
            f"{r['wall_s']:.0f} s | {_gib(r['peak_rss_bytes'])} | {sel['f']:.6f} | "
            f"{sc['quality_topk']['f']:.6f} | {sc['random']['f']:.6f} | {refs or '—'} |")
    lines.append("")
    for term, r in res["terms"].items():
        for key in ("steps_s_note", "peak_rss_note"):
            if r.get(key):
                lines.append(f"- {term}: {r[key]}.")
        if r.get("polish"):
            p = r["polish"]
            lines.append(f"- {term} polish: stop `{p.get('stop')}`, rounds {p.get('rounds')}, "
                         f"swaps {p.get('swaps')}, f {p.get('f_start'):.6f} → {p.get('f_end'):.6f}; "
                         f"config {json.dumps(r['config'])}; engine timings "
                         f"{ {k: round(v, 1) for k, v in r.get('engine_timings_s', {}).items()} }")
    return "\n".join(lines) + "\n"


def _write(res: dict, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    tag = res.get("tag", "large_shard")
    (out / f"results_{tag}.json").write_text(json.dumps(res, indent=1, default=float))
    (out / f"REPORT_{tag}.md").write_text(report(res))


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--terms", default="Pair_simi,Facility,DiSF")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--knob", action="append", default=[],
                   help="extra mask config, KEY=JSON or TERM.KEY=JSON (e.g. DiSF.polish_time_budget_s=600)")
    p.add_argument("--greedy-max-rows", type=int, default=20_000)
    p.add_argument("--no-reference", action="store_true")
    p.add_argument("--timeout-s", type=int, default=4 * 3600)
    p.add_argument("--workdir", default="bench/results/tmp/large_shard_work")
    p.add_argument("--out", default="bench/results")
    p.add_argument("--tag", default="large_shard")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--quick", action="store_true", help="400 x 16, every term: the CI smoke run")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.argv = argv
    if args.quick:
        args.rows, args.dim = 400, 16
        if args.out == "bench/results":
            args.out = "bench/results/tmp/large_shard_quick"
        if args.tag == "large_shard":
            args.tag = "large_shard_quick"
        if args.workdir == p.get_default("workdir"):
            args.workdir = str(Path(args.out) / "work")
    res = run(args)
    res["tag"] = args.tag
    _write(res, Path(args.out))
    print(json.dumps({t: {k: r.get(k) for k in ("route", "wall_s", "peak_rss_bytes")}
                      for t, r in res["terms"].items()}, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
