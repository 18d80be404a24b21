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

The scan is batched: a few event-log queries per asset and one listing per location, whatever
the number of shards, and one tick requests at most ``DATAMASK_SCHEDULE_MAX_RUNS`` runs
(default 100; the rest wait for the next tick).

Cron: env ``DATAMASK_SCHEDULE_CRON`` (default daily at 03:00). Stopped by default.
"""

import os

import dagster as dg

from assets.ingest import features
from assets.learn import mask, scheduled_config_hash
from assets.partitions import PARTITIONS_NAME, scan_raw
from assets.select import selected_subset
from datamask_pipeline import settings
from datamask_pipeline.engine import storage
from resources.storage import DataRoot

from .jobs import datamask_job

ENV_MAX_RUNS = "DATAMASK_SCHEDULE_MAX_RUNS"

CHAIN = (features, mask, selected_subset)
# Runs one tick may request; the rest wait for the next tick (a code or config change must not
# launch every shard at once). Env DATAMASK_SCHEDULE_MAX_RUNS.
DEFAULT_MAX_RUNS = 100
ID_CHUNK = 1000  # storage ids per event-log query


def _latest_records(instance: dg.DagsterInstance, asset_key: dg.AssetKey, keys) -> dict:
    """{partition: latest materialization record} for ``keys``: one query for the latest
    storage ids of every partition, then the records by storage id in chunks."""
    ids = instance.get_latest_storage_id_by_partition(
        asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(keys))
    wanted = sorted(ids.values())
    out = {}
    for s in range(0, len(wanted), ID_CHUNK):
        chunk = wanted[s : s + ID_CHUNK]
        recs = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=chunk), limit=len(chunk)).records
        for rec in recs:
            out[rec.partition_key] = rec
    return out


def _selected_files(data_root: DataRoot) -> set:
    """Partition keys with a selected parquet file, from one listing."""
    try:
        uris = storage.list_files(data_root.selected_root, suffix=".parquet")
    except storage.StorageError:  # not created yet: nothing there
        return set()
    return {storage.partition_key_for(u) for u in uris}


def stale_reasons(instance: dg.DagsterInstance, keys, data_root: DataRoot,
                  expected_config_hash: str) -> dict:
    """{key: why the shard needs a run} for every shard of ``keys`` that does (up-to-date ones
    are left out). Three event-log queries per asset (not per shard) and one listing each of
    the raw and the selected location, whatever the number of shards."""
    keys = list(keys)
    recs = {a.key: _latest_records(instance, a.key, keys) for a in CHAIN}
    try:
        raw = scan_raw(data_root.raw_root).files
    except storage.StorageError:
        raw = {}
    selected = _selected_files(data_root)
    current = {a.key: a.code_versions_by_key[a.key] for a in CHAIN}
    out = {}
    for key in keys:
        feats, msk, sel = (recs[a.key].get(key) for a in CHAIN)
        if sel is None:
            out[key] = "missing: no selected subset yet"
        elif feats is None or msk is None:
            out[key] = "missing: an upstream step was never materialized"
        elif feats.storage_id > msk.storage_id:
            out[key] = "stale: features were re-materialized after the mask"
        elif msk.storage_id > sel.storage_id:
            out[key] = "stale: the mask was re-materialized after the selected subset"
        else:
            reason = None
            for asset_def, rec in zip(CHAIN, (feats, msk, sel)):
                got = rec.asset_materialization.tags.get("dagster/code_version")
                if got != current[asset_def.key]:
                    reason = (f"stale: code version of {asset_def.key.to_user_string()} changed "
                              f"({got} -> {current[asset_def.key]})")
                    break
            if reason is None:
                entry = msk.asset_materialization.metadata.get("config_hash")
                got_hash = None if entry is None else str(entry.value)
                if got_hash != expected_config_hash:
                    reason = (f"stale: config hash {got_hash} differs from the scheduled config "
                              f"{expected_config_hash}")
            if reason is None and key in raw and raw[key][1] / 1e9 > feats.timestamp:
                reason = "stale: the raw shard was modified after ingestion"
            if reason is None and key not in selected:
                reason = "missing: the selected parquet file is gone"
            if reason is not None:
                out[key] = reason
    return out


def stale_reason(instance: dg.DagsterInstance, key: str, data_root: DataRoot,
                 expected_config_hash: str) -> str | None:
    """Why shard ``key`` needs a run, or None when its selection is up to date."""
    return stale_reasons(instance, [key], data_root, expected_config_hash).get(key)


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
    keys = sorted(context.instance.get_dynamic_partitions(PARTITIONS_NAME))
    reasons = stale_reasons(context.instance, keys, data_root, expected)
    if not reasons:
        return dg.SkipReason("every registered shard has an up-to-date selection")
    cap = settings.env_int(ENV_MAX_RUNS) or DEFAULT_MAX_RUNS
    launch = sorted(reasons)[:cap]
    context.log.info(
        f"{len(reasons)} of {len(keys)} shard(s) need a run; requesting {len(launch)} this tick "
        f"(at most {cap}, {ENV_MAX_RUNS}); first: "
        + "; ".join(f"{k}: {reasons[k]}" for k in launch[:10]))
    return [dg.RunRequest(partition_key=key, run_key=f"{key}@{tick}",
                          tags={"datamask/reason": reasons[key][:200]}) for key in launch]
