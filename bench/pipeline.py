"""Pipeline overhead: one shard materialized through Dagster (``python -m datamask_pipeline.demo``,
in-process executor, the definitions' own resources) against the bare engine CLI
(``python -m datamask_pipeline.engine.cli``) on the same shard with the same config, each in
its own process, interleaved."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from .common import median


def _engine_cmd(raw: str, out: str, cfg: dict) -> list:
    return [sys.executable, "-m", "datamask_pipeline.engine.cli", "--input", raw, "--output", out,
            "--device", "cpu", "--algorithm", cfg["algorithm"], "--lamb", str(cfg["lamb"]),
            "--select_ratio", str(cfg["select_ratio"]), "--n_epochs", str(cfg["n_epochs"]),
            "--n_rollout", str(cfg["n_rollout"]), "--partial", str(cfg["partial"]),
            "--max_lr", str(cfg["max_lr"]), "--min_lr", str(cfg["min_lr"]), "--init", cfg["init"],
            "--seed", str(cfg["seed"]), "--solver", cfg["solver"], "--no-progress"]


def pipeline_overhead(workdir: Path, rows: int, dim: int, reps: int = 1, timeout_s: int = 900,
                      preset: str = "upstream", threads: int | None = None, log=print) -> dict:
    repo = Path(__file__).resolve().parent.parent
    if not (repo / "datamask_pipeline" / "definitions.py").is_file():
        return {"skipped": "datamask_pipeline/definitions.py does not exist"}
    from datamask_pipeline import settings
    from datamask_pipeline.engine.sample import generate_corpus

    workdir = Path(workdir).resolve()
    root = workdir / "data"
    raw_dir = root / "raw"
    uris = generate_corpus(str(raw_dir), n_shards=1, rows_per_shard=rows, dim=dim, seed=0)
    raw = uris[0]
    cfg = settings.learner_defaults(preset)  # the knobs the Dagster run gets, given to the CLI too
    env = {**os.environ, "DATAMASK_DATA_ROOT": str(root), "DAGSTER_HOME": str(workdir / "dagster_home"),
           "DATAMASK_DEVICE": "cpu",
           "DATAMASK_EMBEDDING_DIM": str(dim), "PYTHONPATH": str(repo)}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
        env["DATAMASK_CPU_THREADS"] = str(threads)
    # the shard generated above is the data root's: the demo refuses sample-shape flags there
    demo_cmd = [sys.executable, "-m", "datamask_pipeline.demo", "--preset", preset,
                "--device", "cpu", "--data-root", str(root)]
    runs = {"engine_cli": [], "dagster_demo": []}
    shard_s, learn_s = [], []
    errors = []
    for rep in range(reps):
        for name in ("engine_cli", "dagster_demo"):
            cmd = _engine_cmd(raw, str(workdir / f"engine_out_{rep}.parquet"), cfg) \
                if name == "engine_cli" else demo_cmd
            t = time.perf_counter()
            try:
                p = subprocess.run(cmd, cwd=str(repo), env=env, capture_output=True, text=True,
                                   timeout=timeout_s)
            except subprocess.TimeoutExpired:
                errors.append(f"{name}: timed out after {timeout_s}s")
                continue
            wall = time.perf_counter() - t
            if p.returncode != 0:
                errors.append(f"{name}: exit {p.returncode}: {(p.stderr or p.stdout)[-800:]}")
                continue
            runs[name].append(wall)
            if name == "dagster_demo":
                m = re.search(r"done in ([0-9.]+)s", p.stdout)
                if m:
                    shard_s.append(float(m.group(1)))
            else:
                m = re.search(r'"learn_s":\s*([0-9.]+)', p.stdout)
                if m:
                    learn_s.append(float(m.group(1)))
            log(f"  pipeline {name} rep {rep}: {wall:.1f}s")
            if name == "dagster_demo":  # the next demo run must re-materialize, not reuse
                for sub in ("features", "masks", "selected", "reports", "checkpoints"):
                    p2 = root / sub
                    if p2.exists():
                        import shutil

                        shutil.rmtree(p2, ignore_errors=True)
    out = {"rows": rows, "dim": dim, "preset": preset, "config": cfg, "reps": reps, "threads": threads,
           "engine_cli_wall_s": median(runs["engine_cli"]),
           "engine_learn_s": median(learn_s),
           "dagster_demo_wall_s": median(runs["dagster_demo"]),
           "dagster_shard_materialize_s": median(shard_s),
           "runs": runs, "errors": errors,
           "executor": "in_process (the definitions' default; the multiprocess executor was not timed)"}
    e, dsh = out["engine_cli_wall_s"], out["dagster_shard_materialize_s"]
    if e and dsh:
        out["added_fraction_shard"] = dsh / e - 1.0
    if e and out["dagster_demo_wall_s"]:
        out["added_fraction_process"] = out["dagster_demo_wall_s"] / e - 1.0
    return out
