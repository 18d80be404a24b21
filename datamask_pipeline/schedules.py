"""The refresh schedule: one run per registered shard whose selection is missing or stale.

A shard is *stale* (first reason found wins) when

1. it has no ``selected_subset`` materialization (missing);
2. ``features`` was materialized after ``mask``, or ``mask`` after ``selected_subset`` (an
   upstream output is newer than what was built from it);
3. the code version recorded on any of the three materializations differs from the code's
   current ``code_version`` (the logic changed);
4. the config hash recorded by the latest ``mask`` differs from the hash of the config the
   schedule runs with (the defaults of ``MaskConfig``, so ``DATAMASK_PRESET`` counts);
5. the raw file was modified after the latest ingestion, or the selected parquet is gone.

Cron: env ``DATAMASK_SCHEDULE_CRON`` (default daily at 03:00). Stopped by default.
"""

import os

import dagster as dg

from assets.ingest import features
from assets.learn import mask, scheduled_config_hash
from assets.partitions import PARTITIONS_NAME
from assets.select import selected_subset
from datamask_pipeline import settings
from datamask_pipeline.engine import storage
from resources.storage import DataRoot

from .jobs import datamask_job

CHAIN = (features, mask, selected_subset)


def latest_materialization(instance: dg.DagsterInstance, asset_key: dg.AssetKey, key: str):
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, asset_partitions=[key]), limit=1
    ).records
    return recs[0] if recs else None


def stale_reason(instance: dg.DagsterInstance, key: str, data_root: DataRoot,
                 expected_config_hash: str) -> str | None:
    """Why shard ``key`` needs a run, or None when its selection is up to date."""
    recs = {a.key: latest_materialization(instance, a.key, key) for a in CHAIN}
    feats, msk, sel = (recs[a.key] for a in CHAIN)
    if sel is None:
        return "missing: no selected subset yet"
    if feats is None or msk is None:
        return "missing: an upstream step was never materialized"
    if feats.storage_id > msk.storage_id:
        return "stale: features were re-materialized after the mask"
    if msk.storage_id > sel.storage_id:
        return "stale: the mask was re-materialized after the selected subset"
    for asset_def in CHAIN:
        current = asset_def.code_versions_by_key[asset_def.key]
        got = recs[asset_def.key].asset_materialization.tags.get("dagster/code_version")
        if got != current:
            return (f"stale: code version of {asset_def.key.to_user_string()} changed "
                    f"({got} -> {current})")
    entry = msk.asset_materialization.metadata.get("config_hash")
    got_hash = None if entry is None else str(entry.value)
    if got_hash != expected_config_hash:
        return f"stale: config hash {got_hash} differs from the scheduled config {expected_config_hash}"
    raw = data_root.raw_shard(key)
    if storage.exists(raw):
        fs, path = storage.resolve(raw)
        mtime_ns = fs.get_file_info(path).mtime_ns
        if mtime_ns is not None and mtime_ns / 1e9 > feats.timestamp:
            return "stale: the raw shard was modified after ingestion"
    if not storage.exists(data_root.selected(key)):
        return "missing: the selected parquet file is gone"
    return None


@dg.schedule(
    name="refresh_stale_shards",
    job=datamask_job,
    cron_schedule=os.environ.get(settings.ENV_SCHEDULE_CRON) or settings.DEFAULT_CRON,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Launches one datamask_job run per registered shard whose selection is missing "
    "or stale (see datamask_pipeline/schedules.py for the rules).",
)
def refresh_stale_shards(context: dg.ScheduleEvaluationContext, data_root: DataRoot):
    expected = scheduled_config_hash()
    # One run per shard and tick: the run key dedupes re-evaluations of the same tick, while
    # a shard that is still stale at the next tick gets a new run.
    tick = context.scheduled_execution_time.isoformat()
    requests = []
    for key in sorted(context.instance.get_dynamic_partitions(PARTITIONS_NAME)):
        reason = stale_reason(context.instance, key, data_root, expected)
        if reason is None:
            continue
        context.log.info(f"{key}: {reason}")
        requests.append(dg.RunRequest(partition_key=key, run_key=f"{key}@{tick}",
                                      tags={"datamask/reason": reason[:200]}))
    if not requests:
        return dg.SkipReason("every registered shard has an up-to-date selection")
    return requests
