"""End-to-end demo: raw shards -> partitions -> features and checks per shard -> the corpus
selection (one budget, one objective over every shard) -> selected/<shard>.parquet.

    python -m datamask_pipeline.demo [--data-root DIR] [--algorithm DiSF] [--lamb 0.5]
        [--select-ratio 0.1 | --select-rows N | --select-tokens N] [--mode auto]

With ``--per-shard-chain`` it runs the per-shard chain instead (each shard alone with
``select_ratio``: features -> checks -> mask -> selected_per_shard/, then the catalog).

1. Generates the sample corpus (``engine.sample.generate_corpus``: topic clusters of different
   tightness, quality correlated with the cluster, ids, text, source) into the raw location,
   unless it already holds parquet shards (then those are used as they are).
2. Registers the shards as partitions in the Dagster instance of ``$DAGSTER_HOME`` (default
   ``<repo>/.dagster_home``), so the runs show up in ``dagster dev -w workspace.yaml`` later.
3. Materializes the preset's job (``datamask_job`` for ``pipeline``, ``datamask_upstream_job``,
   ``datamask_cpu_demo_job``: ingestion, blocking checks, mask learning, selected subset)
   for every shard, then ``corpus_summary_job``, through Dagster's in-process executor with the
   definitions' own resources, and prints where the selected parquet files are and a summary.

Defaults: the ``pipeline`` preset (solver ``auto``, the measured best route) on ``--device cpu``
with one torch thread, shard reports included. ``--preset upstream --device auto --cpu-threads 0``
runs the paper's learner with upstream's GPU settings. Exit code 1 when a shard failed (its reason is printed).
"""

import argparse
import os
import sys
import time

from datamask_pipeline import settings


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m datamask_pipeline.demo",
                                description="Run the DATAMASK pipeline end to end on a sample corpus.")
    p.add_argument("--shards", type=int, default=4, help="shards to generate (default 4)")
    p.add_argument("--rows", type=int, default=5000, help="rows per shard (default 5000)")
    p.add_argument("--dim", type=int, default=768, help="embedding dimension (default 768)")
    p.add_argument("--seed", type=int, default=0, help="corpus seed (default 0)")
    p.add_argument("--preset", default="pipeline", choices=settings.PRESETS,
                   help="method knobs, i.e. which job runs the shards (default pipeline: "
                        "datamask_job, the measured best solver; upstream: "
                        "datamask_upstream_job, the paper's learner with upstream's settings; "
                        "cpu-demo: datamask_cpu_demo_job, pipeline with CPU-sized learner knobs)")
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda:N (default cpu)")
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="torch CPU threads of the mask step (default 1: the demo's small "
                   "per-step tensors gain little from more, and lose a lot when the machine is "
                   "busy; 0 = torch's default)")
    p.add_argument("--data-root", default=None,
                   help="data root (default env DATAMASK_DATA_ROOT, else <repo>/data); its raw/ "
                        "folder, or the root itself when it holds *.parquet files, are the shards")
    p.add_argument("--algorithm", default=None,
                   help="diversity term: DiSF, Facility, Pair_simi (default: the preset's, DiSF)")
    p.add_argument("--lamb", type=float, default=None, help="λ in [0, 1] (default 0.5)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--select-ratio", type=float, default=None,
                        help="corpus budget: fraction of the corpus's rows (default 0.1)")
    budget.add_argument("--select-rows", type=int, default=None,
                        help="corpus budget: number of rows")
    budget.add_argument("--select-tokens", type=int, default=None,
                        help="corpus budget: number of tokens (met within one document)")
    p.add_argument("--token-column", default=None,
                   help="raw column with each row's token count (else words of the text column)")
    p.add_argument("--mode", default="auto",
                   choices=("auto", "gather", "exchange", "per_shard", "random_blocks"),
                   help="corpus mode (default auto: one selection over the whole corpus while "
                        "it fits, exchange rounds beyond; per_shard and random_blocks are the "
                        "paper's independent blocks)")
    p.add_argument("--id-column", default=None,
                   help="the id column (default chunk_id; a corpus without one whose files have "
                        "an 'id' column uses that, and says so)")
    p.add_argument("--no-dedup", action="store_true",
                   help="select from every row (default: exact and near-duplicates across the "
                        "corpus are dropped first, cosine >= --dedup-threshold)")
    p.add_argument("--dedup-threshold", type=float, default=None,
                   help="cosine at or above which two rows are near-duplicates (default 0.98)")
    p.add_argument("--per-shard-chain", action="store_true",
                   help="run the per-shard chain instead of the corpus stage (each shard alone, "
                        "its own select_ratio; outputs under selected_per_shard/)")
    return p


def _raw_location(args) -> None:
    """A data root that holds parquet files itself (and no raw/ folder with any) is the raw
    location: the outputs go to folders beside the files."""
    from datamask_pipeline.engine import storage

    root = settings.data_root()
    if settings.is_set(settings.ENV_RAW_ROOT) or not storage.exists(root):
        return
    raw = storage.join(root, "raw")
    has_raw = storage.exists(raw) and bool(storage.list_files(raw))
    if not has_raw and storage.list_files(root):
        os.environ[settings.ENV_RAW_ROOT] = root


def _id_column(args) -> None:
    """``--id-column``, or ``id`` when the raw files have no ``chunk_id`` but an ``id``."""
    import pyarrow.parquet as pq

    from datamask_pipeline.engine import storage

    if args.id_column:
        os.environ[settings.ENV_ID_COLUMN] = args.id_column
        return
    if settings.is_set(settings.ENV_ID_COLUMN):
        return
    raw = settings.raw_root()
    files = storage.list_files(raw) if storage.exists(raw) else []
    if not files:
        return
    fs, path = storage.resolve(files[0])
    with fs.open_input_file(path) as fh:
        names = pq.ParquetFile(fh).schema_arrow.names
    if "chunk_id" not in names and "id" in names:
        os.environ[settings.ENV_ID_COLUMN] = "id"
        print("id column: 'id' (the files have no 'chunk_id'; --id-column names another)")


def _failure_reason(result) -> str:
    msgs = []
    for ev in result.get_asset_check_evaluations():
        if not ev.passed and ev.description:
            msgs.append(ev.description)
    for ev in result.all_events:
        if ev.is_step_failure and ev.step_failure_data is not None:
            err = ev.step_failure_data.error
            msgs.append(f"{ev.step_key}: {err.message.strip() if err else 'failed'}")
    return "\n    ".join(msgs) or "run failed"


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.shards < 1 or args.rows < 2 or args.dim < 1:
        print("demo: error: need --shards >= 1, --rows >= 2 and --dim >= 1", file=sys.stderr)
        return 2

    from datamask_pipeline import settings

    if args.data_root:
        os.environ[settings.ENV_DATA_ROOT] = args.data_root
    os.environ[settings.ENV_DEVICE] = args.device
    os.environ[settings.ENV_CPU_THREADS] = str(args.cpu_threads)
    home = settings.ensure_dagster_home()
    _raw_location(args)
    _id_column(args)

    from datamask_pipeline.engine import storage
    from datamask_pipeline.engine.sample import generate_corpus

    root, raw = settings.data_root(), settings.raw_root()
    existing = storage.list_files(raw) if storage.exists(raw) else []
    if existing:
        print(f"using the {len(existing)} existing raw shard(s) in {raw}")
    else:
        t = time.perf_counter()
        generate_corpus(raw, n_shards=args.shards, rows_per_shard=args.rows, dim=args.dim,
                        seed=args.seed)
        print(f"generated {args.shards} shard(s) x {args.rows} rows, {args.dim}-d embeddings in "
              f"{raw} ({time.perf_counter() - t:.1f}s)")
        os.environ.setdefault(settings.ENV_EMBEDDING_DIM, str(args.dim))

    # The definitions read the environment set above (device, dimension, data root).
    import dagster as dg

    from assets.partitions import register_shards, scan_raw
    from datamask_pipeline.definitions import defs
    from datamask_pipeline.jobs import PRESET_JOBS, preset_run_config

    instance = dg.DagsterInstance.get()
    reg = register_shards(instance, raw)
    for uri, reason in reg["invalid"]:
        print(f"skipping {uri}: {reason}", file=sys.stderr)
    keys = sorted(scan_raw(raw).shards)
    job = defs.resolve_job_def(PRESET_JOBS[args.preset].name)
    print(f"DAGSTER_HOME={home}; {len(keys)} partition(s) ({len(reg['added'])} newly registered); "
          f"preset {args.preset} ({job.name if args.per_shard_chain else 'features_job, then corpus_job'}), "
          f"device {args.device}")

    quiet = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}  # no DEBUG event lines
    if not args.per_shard_chain:
        return _corpus(args, defs, instance, keys, quiet, root, home)
    # a run config given at launch replaces the job's own: keep the preset's knobs in it
    chain_config = {**preset_run_config(args.preset), **quiet}
    failed, times = {}, {}
    for i, key in enumerate(keys, 1):
        t = time.perf_counter()
        print(f"[{i}/{len(keys)}] {key}: materializing features -> checks -> mask -> selected_subset ...",
              flush=True)
        result = job.execute_in_process(partition_key=key, instance=instance,
                                        run_config=chain_config, raise_on_error=False)
        times[key] = time.perf_counter() - t
        if result.success:
            print(f"[{i}/{len(keys)}] {key}: done in {times[key]:.1f}s (run {result.run_id})", flush=True)
        else:
            failed[key] = _failure_reason(result)
            print(f"[{i}/{len(keys)}] {key}: FAILED (run {result.run_id})\n    {failed[key]}", flush=True)

    summary = defs.resolve_job_def("corpus_summary_job").execute_in_process(
        instance=instance, run_config=quiet, raise_on_error=False)
    if not summary.success:
        print(f"corpus summary FAILED: {_failure_reason(summary)}", file=sys.stderr)
        return 1
    _print_summary(root, keys, times)
    if failed:
        print(f"\n{len(failed)} shard(s) failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print("\nOpen the UI on the same instance:  DAGSTER_HOME=" + home +
          " .venv/bin/dagster dev -w workspace.yaml")
    return 0


def _budget_label(b: dict) -> str:
    from datamask_pipeline.engine.corpus import CorpusBudget

    return CorpusBudget(b["kind"], b["value"]).label


def corpus_knobs(args) -> dict:
    """The corpus_selection config of the demo's flags (the preset's knobs, then the flags)."""
    knobs = dict(settings.learner_defaults(args.preset))
    for flag, knob in (("algorithm", "algorithm"), ("lamb", "lamb"),
                       ("select_ratio", "select_ratio"), ("select_rows", "select_rows"),
                       ("select_tokens", "select_tokens"), ("token_column", "token_column")):
        v = getattr(args, flag)
        if v is not None:
            knobs[knob] = v
    knobs["mode"] = args.mode
    return knobs


def _corpus(args, defs, instance, keys, quiet, root, home) -> int:
    """Features and checks for every shard, then the corpus selection and its subsets."""
    import json

    from datamask_pipeline.engine import storage
    from datamask_pipeline.jobs import corpus_run_config
    from resources.storage import DataRoot

    features_job = defs.resolve_job_def("features_job")
    failed, t_all = {}, time.perf_counter()
    for i, key in enumerate(keys, 1):
        t = time.perf_counter()
        result = features_job.execute_in_process(partition_key=key, instance=instance,
                                                 run_config=quiet, raise_on_error=False)
        checks_ok = all(ev.passed for ev in result.get_asset_check_evaluations())
        if result.success and checks_ok:
            print(f"[{i}/{len(keys)}] {key}: features and checks done in "
                  f"{time.perf_counter() - t:.1f}s", flush=True)
        else:
            failed[key] = _failure_reason(result)
            print(f"[{i}/{len(keys)}] {key}: FAILED, left out of the corpus\n    {failed[key]}",
                  flush=True)
    knobs = corpus_knobs(args)
    print(f"corpus selection: {json.dumps({k: knobs[k] for k in knobs if k in ('algorithm', 'lamb', 'select_ratio', 'select_rows', 'select_tokens', 'mode')})}",
          flush=True)
    t = time.perf_counter()
    dedup = {"enabled": not args.no_dedup}
    if args.dedup_threshold is not None:
        dedup["threshold"] = args.dedup_threshold
    result = defs.resolve_job_def("corpus_job").execute_in_process(
        instance=instance, run_config={**corpus_run_config(dedup=dedup, **knobs), **quiet},
        raise_on_error=False)
    if not result.success:
        print(f"corpus selection FAILED: {_failure_reason(result)}", file=sys.stderr)
        return 1
    data_root = DataRoot(root=root)
    fs, path = storage.resolve(storage.join(data_root.corpus_dir(), "selection.json"))
    with fs.open_input_file(path) as fh:
        summary = json.loads(fh.read())
    print(f"\ncorpus selection done in {time.perf_counter() - t:.1f}s "
          f"(whole demo {time.perf_counter() - t_all:.1f}s)")
    dd = summary.get("dedup") or {}
    if dd.get("enabled"):
        print(f"deduplication: {dd.get('dropped', 0):,} of {dd.get('rows', 0):,} rows dropped "
              f"({dd.get('exact_dropped', 0) or 0:,} exact text, {dd.get('fuzzy_dropped', 0) or 0:,} "
              f"fuzzy text (containment >= {dd['containment']:g}), "
              f"{dd.get('near_dropped', 0) or 0:,} near (cosine >= {dd['threshold']:g}))")
    else:
        print("deduplication: off")
    print(f"mode {summary['mode']} ({summary['route']}); budget {_budget_label(summary['budget'])}"
          f" of the {summary['n_input']:,} input rows; {summary['selected_rows']:,} rows selected "
          f"from the {summary['n']:,} left after deduplication")
    if summary.get("tokens"):
        print(f"tokens: {summary['tokens']['selected']:,} selected for a target of "
              f"{summary['tokens']['target']:,}")
    if summary.get("scores"):
        print(f"whole-corpus f (λ={summary['lamb']:g}, {summary['term']}), {summary['scored_by']}:")
        for name, sc in summary["scores"].items():
            label = f"corpus {summary['mode']}" if name == "selection" else name
            print(f"  {label:<22} f={sc['f']:.6f}  f_qua={sc['f_qua']:.6f}  f_div={sc['f_div']:.6f}")
    print(f"\n{'shard':<16} {'rows':>9} {'selected':>9} {'share':>7}")
    for key in sorted(summary["sizes"]):
        c = summary["counts"].get(key, 0)
        print(f"{key:<16} {summary['sizes'][key]:>9,} {c:>9,} {c / max(1, summary['selected_rows']):>7.1%}")
    for key, why in sorted(summary.get("excluded", {}).items()):
        print(f"{key:<16} left out: {why}")
    print(f"\nSelected rows: {data_root.corpus_selected_root}/<shard>.parquet")
    print(f"Lineage (shard, raw file, row, id of every selected row): "
          f"{storage.join(data_root.corpus_dir(), 'selection.parquet')}")
    print("Open the UI on the same instance:  DAGSTER_HOME=" + home +
          " .venv/bin/dagster dev -w workspace.yaml")
    if failed:
        print(f"\n{len(failed)} shard(s) failed their checks and were left out: "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def _print_summary(root: str, keys: list, times: dict) -> None:
    import duckdb

    from datamask_pipeline.engine import storage
    from resources.storage import DataRoot

    data_root = DataRoot(root=root)
    catalog = data_root.catalog()
    _, path = storage.resolve(catalog)
    con = duckdb.connect(path, read_only=True) if storage.is_local(catalog) else None
    rows = []
    if con is not None:
        try:
            rows = con.execute(
                "SELECT partition_key, rows_raw, rows_selected, kept_fraction, quality_mean_before, "
                "quality_mean_after, f_selection, f_quality_topk, f_random, selected_uri, route "
                "FROM shards ORDER BY partition_key").fetchall()
        finally:
            con.close()
    print(f"\nSelected parquet files ({storage.join(root, 'selected')}):")
    for r in rows:
        print(f"  {r[9]}")
    print(f"Corpus catalog (DuckDB): {catalog}")
    print(f"Corpus report: {storage.join(data_root.corpus_report_dir(), 'corpus_report.html')}")
    print(f"Shard reports: {storage.join(root, 'reports')}/<shard>/report.html\n")
    hdr = ("shard", "rows", "selected", "kept", "q before", "q after", "f selection", "f top-k",
           "f random", "time s", "route")
    fmt = "{:<12} {:>7} {:>8} {:>6} {:>8} {:>8} {:>11} {:>10} {:>10} {:>7}  {}"
    print(fmt.format(*hdr))

    def f(v, spec):
        return "-" if v is None else format(v, spec)

    tot_raw = tot_sel = 0
    for r in rows:
        tot_raw += r[1]
        tot_sel += r[2]
        print(fmt.format(r[0], r[1], r[2], f(r[3], ".1%"), f(r[4], ".4f"), f(r[5], ".4f"),
                         f(r[6], ".5f"), f(r[7], ".5f"), f(r[8], ".5f"), f(times.get(r[0]), ".1f"),
                         r[10] or "-"))
    if rows:
        print(fmt.format("total", tot_raw, tot_sel, f(tot_sel / tot_raw, ".1%"), "", "", "", "", "",
                         f(sum(times.values()), ".1f"), ""))
    missing = sorted(set(keys) - {r[0] for r in rows})
    if missing:
        print(f"no selection for: {', '.join(missing)}")


if __name__ == "__main__":
    raise SystemExit(main())
