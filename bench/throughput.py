"""I/O throughput of the pipeline's file steps against raw pyarrow / DuckDB on the same file.

    .venv/bin/python -m bench.throughput                       # the recorded run: bench/results/
    .venv/bin/python -m bench.throughput --quick --out DIR     # seconds: CI smoke run

On one generated shard (``engine.sample.make_table``, default 10^5 rows x 768-d) it times, per
family, our step against its raw counterpart:

* ``validation``: ``assets.validate.run_checks`` on the features file, on a connection set up as
  the ``validate_features`` asset sets it up, vs a raw DuckDB scan and a raw pyarrow scan that
  read every value of the same file once;
* ``subset``: ``storage.write_selected_rows`` for a 10% selection vs a raw pyarrow read of the
  whole raw file + ``is_in`` filter + write of the same rows;
* ``ingest``: ``assets.ingest.write_features`` vs a raw pyarrow read of the three columns +
  cast + write with the same (zstd) compression.

Every variant runs in its own subprocess (imports excluded from its time; its peak RSS is its
``ru_maxrss``, with the part that the imports already held shown apart), round-robin across
variants for ``--reps`` rounds after one untimed warm-up round (warms the page cache), with the
variant order rotated every round. Reported: median and [min-max] wall seconds, rows/s, MB/s of
the input file, process CPU seconds, peak RSS, and ours/raw throughput (target >= 0.5).
Results: ``results_throughput.json`` and ``REPORT_throughput.md`` in ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from .common import cpu_model, loadavg, median, peak_rss_bytes

REPO = Path(__file__).resolve().parent.parent
TARGET = 0.5  # ours / raw throughput

# family -> (our variant, raw counterparts), and the file whose bytes/rows a variant reads
FAMILIES = {
    "validation": ("validate_ours", ("validate_raw_duckdb", "validate_raw_pyarrow",
                                     "validate_ours_per_rule")),
    "subset": ("subset_ours", ("subset_raw_pyarrow",)),
    "ingest": ("ingest_ours", ("ingest_raw_pyarrow",)),
}
INPUT = {"validate": "features", "subset": "raw", "ingest": "raw"}
DESCRIBE = {
    "validate_ours": "assets.validate.run_checks (every contract rule, DuckDB, as the asset)",
    "validate_ours_per_rule": "before: run_checks(prefetch=False), one count query (scan) per rule",
    "validate_raw_duckdb": "DuckDB: SELECT count(*), sum(quality), sum(list_sum(embedding))",
    "validate_raw_pyarrow": "pyarrow: iter_batches + sum of quality and of every embedding value",
    "subset_ours": "storage.write_selected_rows (streamed, UTF-8 checked, sha256, atomic)",
    "subset_raw_pyarrow": "pyarrow: read_table + filter(is_in) + write_table (whole file in memory)",
    "ingest_ours": "assets.ingest.write_features (streamed, canonical schema, zstd, atomic)",
    "ingest_raw_pyarrow": "pyarrow: read_table(3 columns) + cast + write_table (zstd)",
}


# ------------------------------------------------------------------ the variants (child side)
def _validate_ours(paths: dict, prefetch: bool = True):
    import duckdb

    from assets.validate import T, VALIDATION_MEMORY_LIMIT, _Context, run_checks, sql_string
    from resources.contract import DataContract

    ctx = _Context("bench", paths["raw"], paths["features"], DataContract())
    con = duckdb.connect(":memory:")
    try:
        # the asset's set-up (assets/validate.py: validate_features)
        con.execute(f"SET memory_limit = {sql_string(VALIDATION_MEMORY_LIMIT)}")
        con.execute(f"CREATE TEMP VIEW {T} AS SELECT * FROM read_parquet({sql_string(paths['features'])})")
        t0 = time.perf_counter()
        results = run_checks(con, ctx, prefetch=prefetch)
        rows = con.execute(f"SELECT count(*) FROM {T}").fetchall()[0][0]
        elapsed = time.perf_counter() - t0
    finally:
        con.close()
    failed = {k: v for k, v in results.items() if v}
    if failed:
        raise RuntimeError(f"validation of the generated shard failed: {failed}")
    return int(rows), elapsed


def _validate_raw_duckdb(paths: dict):
    import duckdb

    from assets.validate import VALIDATION_MEMORY_LIMIT, sql_string

    con = duckdb.connect(":memory:")
    try:
        con.execute(f"SET memory_limit = {sql_string(VALIDATION_MEMORY_LIMIT)}")
        t0 = time.perf_counter()
        rows, _, _ = con.execute(
            "SELECT count(*), sum(quality), sum(list_sum(embedding)) FROM read_parquet(?)",
            [paths["features"]]).fetchall()[0]
        elapsed = time.perf_counter() - t0
    finally:
        con.close()
    return int(rows), elapsed


def _validate_raw_pyarrow(paths: dict):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    pf = pq.ParquetFile(paths["features"])
    rows, total = 0, 0.0
    for batch in pf.iter_batches(batch_size=8192):
        rows += batch.num_rows
        total += (pc.sum(batch.column("quality")).as_py() or 0.0)
        total += (pc.sum(batch.column("embedding").flatten()).as_py() or 0.0)
    return rows, time.perf_counter() - t0


def _subset_ours(paths: dict):
    import numpy as np

    from datamask_pipeline.engine.storage import write_selected_rows

    ids = np.load(paths["selected"])
    t0 = time.perf_counter()
    info = write_selected_rows(paths["raw"], paths["out"], ids, "chunk_id")
    elapsed = time.perf_counter() - t0
    if info["rows"] != len(ids):
        raise RuntimeError(f"subset wrote {info['rows']} rows, {len(ids)} selected")
    return _rows(paths["raw"]), elapsed


def _subset_raw_pyarrow(paths: dict):
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    ids = pa.array(np.load(paths["selected"]))
    t0 = time.perf_counter()
    table = pq.read_table(paths["raw"])
    kept = table.filter(pc.is_in(table.column("chunk_id"), value_set=ids))
    pq.write_table(kept, paths["out"])
    elapsed = time.perf_counter() - t0
    if kept.num_rows != len(ids):
        raise RuntimeError(f"raw subset kept {kept.num_rows} rows, {len(ids)} selected")
    return table.num_rows, elapsed


def _ingest_ours(paths: dict):
    from assets.ingest import write_features
    from datamask_pipeline.engine.data import Columns

    t0 = time.perf_counter()
    info = write_features(paths["raw"], paths["out"], Columns())
    return info["rows"], time.perf_counter() - t0


def _ingest_raw_pyarrow(paths: dict):
    import pyarrow as pa
    import pyarrow.parquet as pq

    t0 = time.perf_counter()
    t = pq.read_table(paths["raw"], columns=["chunk_id", "quality_score", "feature_arr"])
    out = pa.table({"id": t.column("chunk_id"),
                    "quality": t.column("quality_score").cast(pa.float64()),
                    "embedding": t.column("feature_arr").cast(pa.list_(pa.float32()))})
    pq.write_table(out, paths["out"], compression="zstd")
    return out.num_rows, time.perf_counter() - t0


def _rows(path: str) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


VARIANTS = {
    "validate_ours": _validate_ours,
    "validate_raw_duckdb": _validate_raw_duckdb,
    "validate_ours_per_rule": lambda paths: _validate_ours(paths, prefetch=False),
    "validate_raw_pyarrow": _validate_raw_pyarrow,
    "subset_ours": _subset_ours,
    "subset_raw_pyarrow": _subset_raw_pyarrow,
    "ingest_ours": _ingest_ours,
    "ingest_raw_pyarrow": _ingest_raw_pyarrow,
}




def _child(variant: str, paths: dict) -> dict:
    """Run one variant in this (fresh) process; imports happen before the clock starts."""
    fn = VARIANTS[variant]
    # the imports of the variant, before the timed part (they are what the step's process
    # already holds when it starts; shown apart from the step's own memory)
    if variant.startswith("validate"):
        import duckdb  # noqa: F401
    if variant in ("validate_ours", "validate_ours_per_rule", "validate_raw_duckdb"):
        import assets.validate  # noqa: F401
    if variant == "ingest_ours":
        import assets.ingest  # noqa: F401
    import numpy  # noqa: F401
    import pyarrow.parquet  # noqa: F401

    import datamask_pipeline.engine.storage  # noqa: F401

    rss_imports = peak_rss_bytes()
    c0 = time.process_time()
    rows, seconds = fn(paths)
    cpu = time.process_time() - c0
    peak = peak_rss_bytes()
    return {"variant": variant, "rows": rows, "wall_s": seconds, "cpu_s": cpu,
            "peak_rss_bytes": peak, "rss_after_imports_bytes": rss_imports}


# ------------------------------------------------------------------ the driver (parent side)


def make_shard(work: Path, rows: int, dim: int, select_ratio: float, seed: int = 0) -> dict:
    """The raw shard (engine sample generator), its features file (our ingestion) and the 10%
    selection; returns their paths."""
    import numpy as np

    from assets.ingest import write_features
    from datamask_pipeline.engine import storage
    from datamask_pipeline.engine.data import Columns
    from datamask_pipeline.engine.sample import make_table

    work.mkdir(parents=True, exist_ok=True)
    raw, feats, sel = work / "raw.parquet", work / "features.parquet", work / "selected.npy"
    table = make_table(rows, dim=dim, seed=seed)
    # as engine.sample.generate_corpus writes raw shards
    storage.atomic_write_table(table, str(raw), row_group_size=8192, compression="zstd")
    write_features(str(raw), str(feats), Columns())
    ids = table.column("chunk_id").to_numpy()
    k = max(1, int(round(select_ratio * rows)))
    chosen = np.sort(np.random.default_rng(seed).choice(ids, size=k, replace=False))
    np.save(sel, chosen)
    return {"raw": str(raw), "features": str(feats), "selected": str(sel)}


def _run_variant(variant: str, paths: dict, work: Path, threads: int | None) -> dict:
    out = work / f"out_{variant}.parquet"
    out.unlink(missing_ok=True)
    args = {**paths, "out": str(out)}
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "bench.throughput", "--child", variant,
                           "--paths", json.dumps(args)], cwd=REPO, env=env,
                          capture_output=True, text=True)
    total = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"variant {variant} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rec = json.loads(proc.stdout.strip().splitlines()[-1])
    rec["process_wall_s"] = total
    rec["out_bytes"] = out.stat().st_size if out.exists() else None
    out.unlink(missing_ok=True)
    return rec




def summarize(runs: dict, paths: dict) -> dict:
    """Per variant: median/min/max wall, rows/s and MB/s of its input file, peak RSS; per
    family: ours / raw throughput and whether it meets the target."""
    variants = {}
    for v, recs in runs.items():
        walls = [r["wall_s"] for r in recs]
        in_path = paths[INPUT[v.split("_")[0]]]
        in_bytes = os.path.getsize(in_path)
        rows = recs[0]["rows"]
        med = median(walls)
        variants[v] = {
            "what": DESCRIBE[v], "input": os.path.basename(in_path), "input_bytes": in_bytes,
            "rows": rows, "reps": len(recs), "wall_s": walls, "median_s": med,
            "min_s": min(walls), "max_s": max(walls),
            "rows_per_s": rows / med, "mb_per_s": in_bytes / 1e6 / med,
            "cpu_s_median": median([r["cpu_s"] for r in recs]),
            "peak_rss_mib": max(r["peak_rss_bytes"] for r in recs) / 2**20,
            "rss_after_imports_mib": median([r["rss_after_imports_bytes"] for r in recs]) / 2**20,
            "out_bytes": recs[0].get("out_bytes"),
        }
    families = {}
    for fam, (ours, raws) in FAMILIES.items():
        if ours not in variants:
            continue
        vs = {}
        for raw in raws:
            ratio = variants[raw]["median_s"] / variants[ours]["median_s"]
            vs[raw] = {"throughput_ratio": ratio, "meets_target": ratio >= TARGET}
        families[fam] = {"ours": ours, "vs": vs, "target": TARGET}
    return {"variants": variants, "families": families}


def render(res: dict) -> str:
    m = res["machine"]
    lines = [
        "## I/O throughput: our file steps vs raw pyarrow / DuckDB on the same file", "",
        "Produced by:", "", "```", res["command"], "```", "",
        f"Shard: {res['rows']:,} rows x {res['dim']}-d from `engine.sample.make_table` "
        f"(raw {res['raw_bytes'] / 1e6:.1f} MB zstd, features {res['features_bytes'] / 1e6:.1f} MB "
        f"zstd); selection {res['select_ratio']:.0%}. Machine: {m['cpu_model']}, {m['cpu_count']} "
        f"cores, shared with other jobs: load average {m['loadavg_start']} at the start, "
        f"{m['loadavg_end']} at the end (per round: {res['loadavg_rounds']}). "
        f"OMP_NUM_THREADS={res['threads'] or 'unset'}; DuckDB and pyarrow use their own thread pools.",
        "",
        f"Each variant is its own process, {res['reps']} interleaved rounds (order rotated) after "
        f"{res['warmup_rounds']} untimed warm-up round(s); time = the step alone (imports excluded), median "
        "[min–max]. MB/s = input file bytes / median time. Peak RSS = the process's peak resident "
        "memory (VmHWM); 'imports' = its peak before the step started.", "",
        "| family | variant | what | median s [min–max] | rows/s | MB/s | CPU s | peak RSS MiB "
        "(imports) |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for fam, (ours, raws) in FAMILIES.items():
        for v in (ours, *raws):
            r = res["variants"].get(v)
            if r is None:
                continue
            lines.append(
                f"| {fam} | `{v}` | {r['what']} | {r['median_s']:.3g} [{r['min_s']:.3g}–"
                f"{r['max_s']:.3g}] | {r['rows_per_s']:,.0f} | {r['mb_per_s']:.1f} "
                f"| {r['cpu_s_median']:.3g} | {r['peak_rss_mib']:.0f} ({r['rss_after_imports_mib']:.0f}) |")
    lines += ["", f"Ours / raw throughput (target ≥ {TARGET:.0%}):", "",
              "| family | ours | raw | ours/raw | target met |", "|---|---|---|---:|---|"]
    for fam, f in res["families"].items():
        for raw, c in f["vs"].items():
            lines.append(f"| {fam} | `{f['ours']}` | `{raw}` | {c['throughput_ratio']:.0%} "
                         f"| {'yes' if c['meets_target'] else '**no**'} |")
    if res.get("notes"):
        lines += [""] + [f"- {n}" for n in res["notes"]]
    return "\n".join(lines) + "\n"


def run(rows: int, dim: int, reps: int, select_ratio: float, out: Path, work: Path,
        threads: int | None, command: str, families=tuple(FAMILIES), warmup: int = 1,
        log=print) -> dict:
    import platform

    t_start = time.perf_counter()
    log(f"generating {rows:,} x {dim} shard in {work}")
    paths = make_shard(work, rows, dim, select_ratio)
    variants = [v for fam in families for v in (FAMILIES[fam][0], *FAMILIES[fam][1])]
    runs = {v: [] for v in variants}
    load_rounds = []
    machine = {"cpu_count": os.cpu_count(), "cpu_model": cpu_model(),
               "python": platform.python_version(), "loadavg_start": loadavg()}
    for rnd in range(1 - warmup, reps + 1):  # rounds < 1: untimed warm-up
        shift = rnd % len(variants)
        for v in variants[shift:] + variants[:shift]:
            rec = _run_variant(v, paths, work, threads)
            if rnd >= 1:
                runs[v].append(rec)
            log(f"round {rnd}{' (warm-up)' if rnd < 1 else ''} {v}: {rec['wall_s']:.3f}s, "
                f"peak RSS {rec['peak_rss_bytes'] / 2**20:.0f} MiB")
        if rnd >= 1:
            load_rounds.append(loadavg())
    machine["loadavg_end"] = loadavg()
    import duckdb
    import pyarrow

    machine.update(duckdb=duckdb.__version__, pyarrow=pyarrow.__version__)
    res = {"schema_version": 1, "command": command,
           "started": _dt.datetime.now().isoformat(timespec="seconds"), "machine": machine,
           "rows": rows, "dim": dim, "reps": reps, "warmup_rounds": warmup,
           "select_ratio": select_ratio, "threads": threads,
           "raw_bytes": os.path.getsize(paths["raw"]),
           "features_bytes": os.path.getsize(paths["features"]),
           "loadavg_rounds": load_rounds, "runs": runs, **summarize(runs, paths), "notes": []}
    for fam, f in res["families"].items():
        for raw, c in f["vs"].items():
            if not c["meets_target"]:
                res["notes"].append(
                    f"{fam}: `{f['ours']}` reaches {c['throughput_ratio']:.0%} of `{raw}`'s "
                    f"throughput, under the {TARGET:.0%} target.")
    res["total_s"] = time.perf_counter() - t_start
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results_throughput.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(res, indent=1, allow_nan=False))
    tmp.replace(path)
    (out / "REPORT_throughput.md").write_text(render(res))
    log(f"wrote {path} and {out / 'REPORT_throughput.md'}")
    return res




def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--reps", type=int, default=3, help="timed interleaved rounds (>= 1)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--select-ratio", type=float, default=0.1)
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the variants")
    p.add_argument("--quick", action="store_true", help="2,000 x 16, 1 round, no warm-up (CI)")
    p.add_argument("--out", default=None, help="default bench/results (bench/results/tmp/throughput "
                                               "with --quick)")
    p.add_argument("--work", default=None, help="scratch folder for the shard (default "
                                                "bench/results/tmp/throughput_work)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--paths", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, json.loads(args.paths))))
        return 0
    if args.quick:
        args.rows, args.dim, args.reps, args.warmup = 2000, 16, 1, 0
    if args.reps < 1:
        p.error("--reps must be >= 1")
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        p.error(f"unknown families {unknown}; known: {list(FAMILIES)}")
    tmp = REPO / "bench" / "results" / "tmp"
    out = Path(args.out) if args.out else (tmp / "throughput" if args.quick else REPO / "bench" / "results")
    work = Path(args.work) if args.work else tmp / "throughput_work"
    cmd = " ".join([".venv/bin/python -m bench.throughput"]
                   + [shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])])
    t0 = time.perf_counter()
    run(args.rows, args.dim, args.reps, args.select_ratio, out, work, args.threads, cmd,
        families=families, warmup=args.warmup, log=lambda m: print(f"[{time.perf_counter() - t0:7.1f}s] {m}", flush=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
