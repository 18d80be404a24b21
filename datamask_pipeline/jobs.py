"""Jobs: the per-shard chain, once per preset of the method knobs, and the corpus summary.

A preset is a named run config: ``datamask_job`` runs ``MaskConfig``'s defaults (the
``pipeline`` profile); ``datamask_upstream_job`` and ``datamask_cpu_demo_job`` carry their
preset's knobs as the job's config, filled in by the Launchpad for a partition and used by
``execute_in_process(partition_key=...)``. The values live in ``engine.config``
(``settings.learner_defaults``). A run config given at launch replaces the job's whole config.

``dg launch --job NAME --partition KEY`` in Dagster 1.13 runs a partitioned job without its
config (dagster-io/dagster#34045), so give it the preset's::

    dg launch --job datamask_upstream_job --partition KEY \
        --config-json "$(python -m datamask_pipeline.jobs upstream)"
"""

import json
import warnings

import dagster as dg

from assets.corpus import corpus_dedup, corpus_selection, corpus_subset
from assets.ingest import features
from assets.learn import mask
from assets.report import corpus_summary
from assets.select import selected_subset
from assets.shard_report import shard_report
from datamask_pipeline import settings

CHAIN = dg.AssetSelection.assets(features, mask, shard_report, selected_subset)

datamask_job = dg.define_asset_job(
    "datamask_job",
    selection=CHAIN,
    description="One shard end to end: ingestion -> blocking DuckDB checks -> mask learning "
    "(gpu pool) -> shard report (no pool) and selected subset. Partitioned by shard (one run "
    "per partition).",
    # Run retries are the instance's (dagster.yaml run_retries), so UI launches and backfills
    # of the assets get them too.
)


def preset_run_config(preset: str) -> dict:
    """The run config that gives the ``mask`` step every knob of ``preset``."""
    return {"ops": {"mask": {"config": settings.learner_defaults(preset)}}}


datamask_upstream_job = dg.define_asset_job(
    "datamask_upstream_job",
    selection=CHAIN,
    config=preset_run_config("upstream"),
    description="datamask_job with upstream's exact method (solver paper: the policy-gradient "
    "learner alone, upstream's knobs), filled in as this job's run config.",
)

datamask_cpu_demo_job = dg.define_asset_job(
    "datamask_cpu_demo_job",
    selection=CHAIN,
    config=preset_run_config("cpu-demo"),
    description="datamask_job with the pipeline profile and CPU-sized learner knobs "
    "(engine.config.CPU_DEMO_PRESET: fewer steps and rollouts when a learning solver runs).",
)

# preset name -> the job that runs it
PRESET_JOBS = {"pipeline": datamask_job, "upstream": datamask_upstream_job,
               "cpu-demo": datamask_cpu_demo_job}


def warn_preset_env() -> None:
    """``DATAMASK_PRESET`` no longer changes MaskConfig's defaults: when it is set, warn and
    name the job that runs that preset."""
    value = settings.preset_env()
    if value is None:
        return
    from datamask_pipeline.engine.config import DEPRECATED_PROFILES

    job = PRESET_JOBS.get(DEPRECATED_PROFILES.get(value, value))
    todo = (f"launch job {job.name!r} instead" if job is not None else
            "launch one of " + ", ".join(f"{j.name!r} ({p})" for p, j in PRESET_JOBS.items()))
    warnings.warn(f"{settings.ENV_PRESET}={value} is ignored: MaskConfig's defaults are the "
                  f"pipeline profile; {todo} (Launchpad, or `dg launch --job NAME --config-json "
                  f"\"$(python -m datamask_pipeline.jobs PRESET)\"`)",
                  UserWarning, stacklevel=2)


warn_preset_env()  # once per process: this module is imported once, by the definitions

corpus_summary_job = dg.define_asset_job(
    "corpus_summary_job",
    selection=dg.AssetSelection.assets(corpus_summary),
    description="Rebuild the corpus catalog (catalog.duckdb) over all selected shards.",
)


features_job = dg.define_asset_job(
    "features_job",
    selection=dg.AssetSelection.assets(features),
    description="One shard's ingestion and its blocking DuckDB checks (what the corpus "
    "selection reads). Partitioned by shard.",
)

corpus_job = dg.define_asset_job(
    "corpus_job",
    selection=dg.AssetSelection.assets(corpus_dedup, corpus_selection, corpus_subset),
    description="Deduplication across the corpus, then the corpus selection over every shard "
    "that passed its checks (one budget, one objective), then each shard's selected rows under "
    "selected/ (only changed shards are rewritten).",
)


def corpus_run_config(dedup: dict | None = None, **knobs) -> dict:
    """The run config of ``corpus_job``: the corpus knobs (CorpusConfig fields) and the
    deduplication's (DedupConfig fields)."""
    ops = {"corpus_selection": {"config": knobs}}
    if dedup:
        ops["corpus_dedup"] = {"config": dedup}
    return {"ops": ops}


def main(argv=None) -> int:
    """``python -m datamask_pipeline.jobs PRESET``: print the run config of a preset's job."""
    from datamask_pipeline.engine.cli_flags import CommandLine

    jobs = "; ".join(f"{p}: {j.name}" for p, j in PRESET_JOBS.items())
    p = CommandLine(
        "datamask_pipeline.jobs",
        description="Print the run config (JSON) that gives the mask step every knob of a "
                    f"preset, for the preset's job ({jobs}). Dagster 1.13's `dg launch --job "
                    "NAME --partition KEY` runs a partitioned job without its own config "
                    "(dagster-io/dagster#34045), so pass it this: dg launch --job "
                    "datamask_upstream_job --partition KEY --config-json \"$(python -m "
                    "datamask_pipeline.jobs upstream)\"",
    )
    p.add_argument("preset", choices=list(PRESET_JOBS),
                   help="the preset whose run config to print")
    args = p.parse_args(argv)
    print(json.dumps(preset_run_config(args.preset)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
