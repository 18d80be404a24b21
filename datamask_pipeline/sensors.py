"""The raw-shard sensor: new raw files become partitions and get a run; changed files get a
new run; every new or changed file's ``size:mtime`` (from one listing, no per-file stat) is
recorded as the data version of its ``raw_shard`` partition.

Every evaluation lists ``<raw>/*.parquet``. A file whose name is not a valid partition key is
logged and skipped. The cursor remembers each file's ``size:mtime`` signature, so a file that
is rewritten in place triggers a run again (the run key includes the signature, so one version
of a file never runs twice). A shard registered without the sensor (the register command) gets
a run on the sensor's first look only if it has no selected subset yet.
"""

import json
import os

import dagster as dg

from assets.partitions import PARTITIONS_NAME, scan_raw, shards
from datamask_pipeline import settings
from datamask_pipeline.engine.storage import StorageError
from resources.storage import DataRoot

from .jobs import datamask_job

RAW_SHARD_KEY = dg.AssetKey("raw_shard")


def _has_selection(instance: dg.DagsterInstance, key: str) -> bool:
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("selected_subset"), asset_partitions=[key]),
        limit=1,
    ).records
    return bool(recs)


@dg.sensor(
    name="raw_shard_sensor",
    job=datamask_job,
    minimum_interval_seconds=int(os.environ.get(settings.ENV_SENSOR_INTERVAL) or 30),
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Registers new raw shards (<raw>/*.parquet) as partitions of 'shards' and "
    "requests a datamask_job run for every new or rewritten shard.",
)
def raw_shard_sensor(context: dg.SensorEvaluationContext, data_root: DataRoot):
    try:
        scan = scan_raw(data_root.raw_root)
    except StorageError as exc:
        return dg.SkipReason(f"raw location {data_root.raw_root} cannot be listed: {exc}")
    for uri, reason in scan.invalid:
        context.log.warning(f"ignoring {uri}: not a valid partition key ({reason})")
    seen = json.loads(context.cursor) if context.cursor else {}
    registered = set(context.instance.get_dynamic_partitions(PARTITIONS_NAME))
    signatures = {k: scan.signature(k) for k in sorted(scan.files)}  # from the one listing
    new = [k for k in signatures if k not in registered]
    requests = []
    for key, sig in signatures.items():
        if key not in registered:
            reason = "new shard"
        elif key in seen and seen[key] != sig:
            reason = "raw shard rewritten"
        elif key not in seen and not _has_selection(context.instance, key):
            reason = "registered shard without a selection"
        else:
            continue
        requests.append(dg.RunRequest(partition_key=key, run_key=f"{key}:{sig}",
                                      tags={"datamask/trigger": reason}))
    if new:
        context.log.info(f"registering {len(new)} new shard(s): {new[:20]}")
    # raw_shard's data version per partition (what makes features stale in the UI when a raw
    # file changes): recorded for every shard whose signature this sensor has not seen yet.
    observations = [
        dg.AssetObservation(asset_key=RAW_SHARD_KEY, partition=key,
                            tags={"dagster/data_version": sig})
        for key, sig in signatures.items() if seen.get(key) != sig
    ]
    return dg.SensorResult(
        run_requests=requests,
        asset_events=observations,
        dynamic_partitions_requests=[shards.build_add_request(new)] if new else [],
        cursor=json.dumps(signatures, sort_keys=True),
        skip_reason=None if requests or new else "no new or rewritten shards",
    )
