"""End-to-end demo: raw shards -> partitions -> features and checks per shard -> the corpus
selection (one budget, one objective over every shard) -> selected/<shard>.parquet.

    python -m datamask_pipeline.demo [--data-root DIR] [--algorithm DiSF] [--lamb 0.5]
        [--select-ratio 0.1 | --select-rows N | --select-tokens N] [--mode auto]

With ``--per-shard-chain`` it runs the per-shard chain instead (each shard alone with
``--select-ratio``: features -> checks -> mask -> selected_per_shard/, then the catalog).

1. Finds the shards (``resolve_input``). A data root the user names (``--data-root``, env
   ``DATAMASK_DATA_ROOT``, or the raw location ``DATAMASK_RAW_ROOT``) is used as it is: its
   ``raw/*.parquet``, or its own ``*.parquet`` files. A named data root without parquet files
   is refused with one line saying what was found and what is expected, and nothing is
   written. Only when no data root is named (or with ``--generate-sample``) is the sample corpus
   generated (``engine.sample.generate_corpus``: topic clusters of different tightness,
   quality correlated with the cluster, ids, text, source) into ``<repo>/data/raw``, and the
   output says it is sample data; a later run without a data root uses that sample again.
2. Checks every flag value and combination before any work (``check_flags``): one line naming
   the flag, the value and what is allowed, exit code 2.
3. Registers the shards as partitions in the Dagster instance of ``$DAGSTER_HOME`` (default
   ``<repo>/.dagster_home``), so the runs show up in ``dagster dev -w workspace.yaml`` later.
4. Materializes ``features_job`` for every shard, then ``corpus_job`` (or, with
   ``--per-shard-chain``, the preset's job, ``datamask_job`` for ``pipeline``, then
   ``corpus_summary_job``) through Dagster's in-process executor with the definitions' own
   resources, and prints every output with its path (the selected rows, the corpus report,
   the lineage) and a summary.

Defaults: the ``pipeline`` preset (solver ``auto``, the measured best route) on ``--device cpu``
with one torch thread, shard reports included. ``--preset upstream --device auto --cpu-threads 0``
runs the paper's learner with upstream's GPU settings. Exit code 1 when a shard failed (its
reason is printed), 2 for a flag or input refused before any work.
"""

import os
import sys
import time

from datamask_pipeline import settings
from datamask_pipeline.engine.cli_flags import CommandLine, number, whole
from datamask_pipeline.register import InstanceError, open_instance

# the sample corpus's shape: used only when the sample is generated
SAMPLE_DEFAULTS = {"shards": 4, "rows": 5000, "dim": 768, "seed": 0}
# what a data root must hold, said when one is refused
EXPECTED = ("expected a folder with raw/*.parquet or *.parquet files (an id column, chunk_id or "
            "id, and a text column or embeddings)")
# flags of the corpus selection that the per-shard chain has no use for
CORPUS_ONLY = ("select_rows", "select_tokens", "token_column", "mode", "no_dedup",
               "dedup_threshold")


class InputError(ValueError):
    """A flag, a data root or a combination refused before any work (one line)."""


def _parser() -> CommandLine:
    p = CommandLine("datamask_pipeline.demo",
                    description="Run the DATAMASK pipeline end to end: on your parquet files "
                                "(--data-root DIR), or on a generated sample corpus when no "
                                "data root is given.")
    data = p.add_argument_group("data")
    data.add_argument("--data-root", default=None,
                      help="your corpus: a folder whose raw/ holds the *.parquet shards, or that "
                           "holds them itself (then the outputs go beside them); default env "
                           "DATAMASK_DATA_ROOT. A named folder without parquet files is refused. "
                           "With neither, <repo>/data: the sample corpus is generated into "
                           "data/raw on the first run and used again after")
    data.add_argument("--generate-sample", action="store_true",
                      help="generate the sample corpus into the data root's raw/ folder (which "
                           "must hold no parquet files yet); what happens anyway when no data "
                           "root is given")
    data.add_argument("--id-column", default=None,
                      help="the id column (default chunk_id; files without one that have an "
                           "'id' column use that, and say so)")
    sample = p.add_argument_group("sample corpus (only when it is generated)")
    sample.add_argument("--shards", type=whole(1), default=None,
                        help=f"shards to generate (default {SAMPLE_DEFAULTS['shards']})")
    sample.add_argument("--rows", type=whole(2), default=None,
                        help=f"rows per shard (default {SAMPLE_DEFAULTS['rows']})")
    sample.add_argument("--dim", type=whole(1), default=None,
                        help=f"embedding dimension (default {SAMPLE_DEFAULTS['dim']})")
    sample.add_argument("--seed", type=whole(0), default=None,
                        help=f"corpus seed (default {SAMPLE_DEFAULTS['seed']})")
    run = p.add_argument_group("run")
    run.add_argument("--preset", default="pipeline", choices=settings.PRESETS,
                     help="method knobs, i.e. which job runs the shards (default pipeline: "
                          "datamask_job, the measured best solver; upstream: "
                          "datamask_upstream_job, the paper's learner with upstream's settings; "
                          "cpu-demo: datamask_cpu_demo_job, pipeline with CPU-sized learner knobs)")
    run.add_argument("--device", default="cpu", help="auto | cpu | cuda:N (default cpu)")
    run.add_argument("--cpu-threads", type=whole(0), default=1,
                     help="torch CPU threads of the mask step (default 1: the demo's small "
                     "per-step tensors gain little from more, and lose a lot when the machine is "
                     "busy; 0 = torch's default)")
    run.add_argument("--per-shard-chain", action="store_true",
                     help="run the per-shard chain instead of the corpus stage (each shard "
                          "alone, --select-ratio of its rows; outputs under selected_per_shard/)")
    sel = p.add_argument_group("selection")
    sel.add_argument("--algorithm", default=None,
                     help="diversity term: DiSF, Facility, Pair_simi (default: the preset's, DiSF)")
    sel.add_argument("--lamb", type=float, default=None, help="λ in [0, 1] (default 0.5)")
    budget = sel.add_mutually_exclusive_group()
    budget.add_argument("--select-ratio", type=float, default=None,
                        help="corpus budget: fraction of the corpus's rows, in (0, 1) "
                             "(default 0.1)")
    budget.add_argument("--select-rows", type=whole(1), default=None,
                        help="corpus budget: number of rows")
    budget.add_argument("--select-tokens", type=whole(1), default=None,
                        help="corpus budget: number of tokens (met within one document)")
    sel.add_argument("--token-column", default=None,
                     help="with --select-tokens: raw column with each row's token count (else "
                          "tokens of the text column)")
    sel.add_argument("--mode", default=None,
                     choices=("auto", "gather", "exchange", "per_shard", "random_blocks"),
                     help="corpus mode (default auto: one selection over the whole corpus while "
                          "it fits, exchange rounds beyond; per_shard and random_blocks are the "
                          "paper's independent blocks)")
    sel.add_argument("--no-dedup", action="store_true",
                     help="select from every row (default: exact and near-duplicates across the "
                          "corpus are dropped first, cosine >= --dedup-threshold)")
    sel.add_argument("--dedup-threshold", type=number(0.0, 1.0, low_open=True), default=None,
                     help="cosine in (0, 1] at or above which two rows are near-duplicates "
                          "(default 0.98)")
    return p


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _given(args, names) -> list:
    """The flags among ``names`` (argparse dests) that were given on the command line."""
    return [n for n in names if getattr(args, n) not in (None, False)]


def given_knobs(args) -> dict:
    """The method knobs given as flags (algorithm, lamb, select_ratio)."""
    return {k: getattr(args, k) for k in ("algorithm", "lamb", "select_ratio")
            if getattr(args, k) is not None}


def check_flags(args) -> None:
    """Every flag value and combination, before any work (raises InputError, one line): the
    method knobs by the engine's rules (``LearnerConfig``), the device, and flags that would
    otherwise be silently ignored."""
    from datamask_pipeline.engine.cli_flags import learner_config
    from datamask_pipeline.engine.config import ConfigError

    if args.per_shard_chain:
        ignored = _given(args, CORPUS_ONLY)
        if ignored:
            raise InputError(f"{', '.join(_flag(n) for n in ignored)}: a corpus selection "
                             "flag, and --per-shard-chain selects each shard alone "
                             "(--select-ratio of its rows); drop one or the other")
    if args.token_column is not None and args.select_tokens is None:
        raise InputError(f"--token-column {args.token_column}: only used with --select-tokens N "
                         "(the budget in tokens); add it or drop --token-column")
    if args.no_dedup and args.dedup_threshold is not None:
        raise InputError(f"--dedup-threshold {args.dedup_threshold:g} with --no-dedup: no "
                         "deduplication runs; drop one of them")
    if given_knobs(args):  # the preset's own values are valid: nothing else to check
        try:
            learner_config(settings.learner_defaults(args.preset), given_knobs(args), _flag)
        except ConfigError as exc:
            raise InputError(str(exc)) from None
    if args.device.strip().lower() != "cpu":  # cpu always exists; the others import torch
        from datamask_pipeline.engine.device import DeviceError, resolve_device

        try:
            resolve_device(args.device)
        except DeviceError as exc:
            raise InputError(f"--device {args.device}: {exc}") from None


def _listing(uri) -> tuple:
    """(what ``uri`` is: missing, file or folder; its *.parquet files; its other files)."""
    from datamask_pipeline.engine import storage

    if not storage.exists(uri):
        return "missing", [], []
    try:
        files = storage.list_files(uri, suffix=None)
    except storage.StorageError:
        return "file", [], []
    parquet = [f for f in files if f.endswith(".parquet")]
    return "folder", parquet, [f for f in files if not f.endswith(".parquet")]


def _found(uri: str, kind: str, others: list, raw_kind: str | None = None,
           raw_others: tuple = ()) -> str:
    """What a refused location holds, in words."""
    if kind == "missing":
        return "no such folder"
    if kind == "file":
        return "a file, not a folder" + (" (name the folder that holds it)"
                                         if uri.endswith(".parquet") else "")
    def files(n_others, where):
        if not n_others:
            return f"{where} is empty"
        exts = sorted({os.path.splitext(f)[1] or "(no extension)" for f in n_others})
        return f"{where} holds {len(n_others)} file(s) ({', '.join(exts)}) and no *.parquet"

    parts = [files(others, "it")]
    if raw_kind == "folder":
        parts.append(files(raw_others, "its raw/"))
    return "; ".join(parts)


def resolve_input(args, environ=None, default_root: str | None = None) -> dict:
    """Where the shards come from, decided before anything is written (raises InputError,
    one line): ``{"root", "raw", "generate": bool, "files": [the parquet shards], "named":
    how the user named the location, or None}``. See the module docstring. ``environ``:
    the environment (default ``os.environ``); ``default_root``: the data root when none is
    named (default ``<repo>/data``)."""
    from datamask_pipeline.engine import storage

    env = os.environ if environ is None else environ
    sample_flags = [n for n in SAMPLE_DEFAULTS if getattr(args, n) is not None]
    env_root = (env.get(settings.ENV_DATA_ROOT) or "").strip()
    env_raw = (env.get(settings.ENV_RAW_ROOT) or "").strip()
    root = args.data_root or env_root or default_root or settings.default_data_root()
    named = (f"--data-root {args.data_root}" if args.data_root else
             f"{settings.ENV_DATA_ROOT}={env_root}" if env_root else None)
    if env_raw:
        raw, raw_named = env_raw, f"{settings.ENV_RAW_ROOT}={env_raw}"
    else:
        raw, raw_named = storage.join(root, "raw"), None
    kind, files, others = _listing(raw)
    if args.generate_sample:
        if files or others:
            raise InputError(f"--generate-sample: {raw} already holds {len(files) + len(others)} "
                             "file(s); the sample goes into an empty or new folder: remove "
                             "them, or name another --data-root")
        return {"root": root, "raw": raw, "generate": True, "files": [], "named": named}
    if not named and not raw_named:  # no data root named: the sample corpus, made once
        if not files and not others:
            return {"root": root, "raw": raw, "generate": True, "files": [], "named": None}
        if not files:
            raise InputError(f"{raw}: {_found(raw, kind, others)}; remove it to generate "
                             f"the sample corpus there, or name your data with --data-root DIR")
        if sample_flags:
            raise InputError(
                f"{' '.join(f'{_flag(n)} {getattr(args, n)}' for n in sample_flags)}: {raw} "
                f"already holds {len(files)} parquet shard(s) from an earlier run, which are "
                f"used as they are; remove {raw} to generate a new sample with these flags, "
                "or leave them out")
        return {"root": root, "raw": raw, "generate": False, "files": files, "named": None}
    if raw_named:
        if not files:
            raise InputError(f"{raw_named}: {_found(raw, kind, others)}; {EXPECTED}")
    elif not files:  # the data root itself may hold the shards
        root_kind, own, own_others = _listing(root)
        if not own:
            raise InputError(
                f"{named}: {_found(root, root_kind, own_others, kind, others)}; {EXPECTED} "
                f"— or {'omit --data-root' if args.data_root else 'unset ' + settings.ENV_DATA_ROOT}"
                " to generate sample data")
        raw, files = root, own
    if sample_flags:
        raise InputError(
            f"{', '.join(_flag(n) for n in sample_flags)}: only for a generated sample, and "
            f"{named or raw_named} holds your {len(files)} parquet file(s); leave them out "
            "(or add --generate-sample and name an empty --data-root)")
    return {"root": root, "raw": raw, "generate": False, "files": files,
            "named": named or raw_named}


def id_column(args, first_file: str, environ=None) -> tuple:
    """(the id column of the shards, a note or None): ``--id-column``, else
    ``DATAMASK_ID_COLUMN``, else detected from the first file's columns the way ``train_mask``
    detects it (``engine.id_column``). Raises InputError (one line)."""
    from datamask_pipeline.engine.id_column import IdColumnError, detect_id_column, file_columns

    env = os.environ if environ is None else environ
    given = args.id_column or (env.get(settings.ENV_ID_COLUMN) or "").strip() or None
    flag = "--id-column" if args.id_column else (settings.ENV_ID_COLUMN if given else
                                                 "--id-column")
    try:
        return detect_id_column(file_columns(first_file), given, where=first_file, flag=flag)
    except IdColumnError as exc:
        raise InputError(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{first_file}: cannot read it as parquet ({exc}); {EXPECTED}") from None


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
    p = _parser()
    args = p.parse_args(argv)
    try:
        return _main(args)
    except (InputError, InstanceError) as exc:
        p.fail(str(exc))


def _main(args) -> int:
    where = resolve_input(args)  # nothing is written before the flags and input are checked
    check_flags(args)
    if where["files"]:
        col, note = id_column(args, where["files"][0])
        os.environ[settings.ENV_ID_COLUMN] = col
        if note:
            print(note)
    home, instance = open_instance()  # InstanceError: one line with the fix

    from datamask_pipeline.engine import storage
    from datamask_pipeline.engine.sample import generate_corpus

    os.environ[settings.ENV_DATA_ROOT] = root = where["root"]
    if where["raw"] != storage.join(root, "raw"):  # the named raw location, or the root itself
        os.environ[settings.ENV_RAW_ROOT] = where["raw"]
    raw = where["raw"]
    os.environ[settings.ENV_DEVICE] = args.device
    os.environ[settings.ENV_CPU_THREADS] = str(args.cpu_threads)
    if where["generate"]:
        shape = {n: SAMPLE_DEFAULTS[n] if getattr(args, n) is None else getattr(args, n)
                 for n in SAMPLE_DEFAULTS}
        t = time.perf_counter()
        generate_corpus(raw, n_shards=shape["shards"], rows_per_shard=shape["rows"],
                        dim=shape["dim"], seed=shape["seed"])
        why = ("--generate-sample" if args.generate_sample else
               "no data root given (--data-root DIR runs on your own parquet files)")
        print(f"SAMPLE DATA: {why}: generated {shape['shards']} shard(s) x {shape['rows']} rows "
              f"of sample text with {shape['dim']}-d embeddings in {raw} "
              f"({time.perf_counter() - t:.1f}s)")
        os.environ.setdefault(settings.ENV_EMBEDDING_DIM, str(shape["dim"]))
    elif where["named"]:
        print(f"data: the {len(where['files'])} parquet file(s) in {raw} ({where['named']})")
    else:
        print(f"SAMPLE DATA: the {len(where['files'])} sample shard(s) an earlier run generated "
              f"in {raw} (--data-root DIR runs on your own parquet files)")

    # The definitions read the environment set above (device, dimension, data root).
    from assets.partitions import register_shards, scan_raw
    from datamask_pipeline.definitions import defs
    from datamask_pipeline.jobs import PRESET_JOBS, preset_run_config

    try:
        reg = register_shards(instance, raw)
    except storage.StorageError as exc:
        raise InputError(f"{raw}: {exc}") from None
    for uri, reason in reg["invalid"]:
        print(f"skipping {uri}: {reason}", file=sys.stderr)
    keys = sorted(scan_raw(raw).shards)
    if not keys:
        raise InputError(f"{raw}: none of its {len(reg['invalid'])} parquet file(s) has a name "
                         "that can be a shard key (letters, digits, '_' and '-'); rename them "
                         "(e.g. shard_000.parquet)")
    job = defs.resolve_job_def(PRESET_JOBS[args.preset].name)
    print(f"DAGSTER_HOME={home}; {len(keys)} partition(s) ({len(reg['added'])} newly registered); "
          f"preset {args.preset} ({job.name if args.per_shard_chain else 'features_job, then corpus_job'}), "
          f"device {args.device}")

    quiet = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}  # no DEBUG event lines
    if not args.per_shard_chain:
        return _corpus(args, defs, instance, keys, quiet, root, home)
    # a run config given at launch replaces the job's own: keep the preset's knobs in it, and
    # the knobs given as flags over them
    chain_config = {**preset_run_config(args.preset), **quiet}
    chain_config["ops"]["mask"]["config"].update(given_knobs(args))
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
    knobs["mode"] = args.mode or "auto"
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
    print("\nOutputs:")
    for label, path, what in corpus_outputs(result):
        print(f"  {label:<14} {path}" + (f"  ({what})" if what else ""))
    print("Open the UI on the same instance:  DAGSTER_HOME=" + home +
          " .venv/bin/dagster dev -w workspace.yaml")
    if failed:
        print(f"\n{len(failed)} shard(s) failed their checks and were left out: "
              f"{', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


# (asset, its materialization's path metadata, label, what it holds) of the corpus job's outputs
CORPUS_OUTPUTS = (
    ("corpus_subset", "selected_root", "selected rows", "one <shard>.parquet per shard"),
    ("corpus_subset", "report", "corpus report", ""),
    ("corpus_selection", "selection", "lineage",
     "shard, raw file, row, id of every selected row: one <shard>.parquet per shard"),
    ("corpus_dedup", "duplicates", "duplicates", "the rows deduplication dropped"),
)


def corpus_outputs(result) -> list:
    """``[(label, path, what)]``: every file the corpus job wrote, where the run's own
    materializations say it is (the selected rows' folder, ``corpus/report.html``, the
    selection's folder ``corpus/selection/<version>``, ``corpus/duplicates.parquet``)."""
    out = []
    for asset, key, label, what in CORPUS_OUTPUTS:
        for mat in result.asset_materializations_for_node(asset):
            value = mat.metadata.get(key)
            if value is not None:
                path = str(value.value)
                per_shard = key in ("selected_root", "selection")
                out.append((label, f"{path}/<shard>.parquet" if per_shard else path, what))
    return out


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
