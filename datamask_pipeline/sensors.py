"""The raw-shard sensor: registers new raw files as partitions and records the data version
of every rewritten one; it launches nothing.

Every evaluation lists ``<raw>/*.parquet`` once (``scan_raw``: size and mtime from the listing,
no per-file stat). A file whose name is not a valid partition key is logged and skipped. The
cursor remembers each file's ``size:mtime`` signature. A file whose signature differs from the
one the cursor holds (rewritten in place) gets a ``raw_shard`` observation with its new
signature as data version. A file the cursor has not seen yet gets none: a new shard is newly
missing, which is all automation needs, and 10,000 new shards are then one partition request
instead of 10,000 recorded events (``daemon_apply`` against ``rewrite_apply`` in
``bench/results/REPORT_orchestration.md``). The same holds for the first tick after the cursor
was reset: the files it finds are recorded, not re-launched. Launching is Dagster's automation's job
(``datamask_pipeline/automation.py``): a new shard is newly missing, a new data version is an
updated dependency, and the ``datamask_automation`` sensor requests the shard's automated steps
(one backfill for many shards).
"""

import json
import os

import dagster as dg

from assets.partitions import PARTITIONS_NAME, raw_observations, scan_raw, shards
from datamask_pipeline import settings
from datamask_pipeline.engine.storage import StorageError
from resources.storage import DataRoot


@dg.sensor(
    name="raw_shard_sensor",
    minimum_interval_seconds=int(os.environ.get(settings.ENV_SENSOR_INTERVAL) or 30),
    default_status=dg.DefaultSensorStatus.STOPPED,
    description="Registers new raw shards (<raw>/*.parquet) as partitions of 'shards' and "
    "records the data version (size:mtime) of every rewritten shard; the "
    "datamask_automation sensor launches the work.",
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
    rewritten = [k for k, sig in signatures.items() if k in seen and seen[k] != sig]
    if new:
        context.log.info(f"registering {len(new)} new shard(s): {new[:20]}")
    if rewritten:
        context.log.info(f"{len(rewritten)} rewritten shard(s): {rewritten[:20]}")
    return dg.SensorResult(
        asset_events=raw_observations(scan, rewritten),
        dynamic_partitions_requests=[shards.build_add_request(new)] if new else [],
        cursor=json.dumps(signatures, sort_keys=True),
        skip_reason=None if new or rewritten else "no new or rewritten shards",
    )
