"""The raw-shard sensor watching a raw prefix in S3: new objects become partitions with a
data version each, an object rewritten in place gets a new data version (automation launches
the runs), temp objects of in-flight uploads and names that cannot be partition keys are
ignored."""

import json
import tempfile

import dagster as dg
import pyarrow.parquet as pq
import pytest

from assets.partitions import PARTITIONS_NAME
from datamask_pipeline.engine.sample import make_table
from datamask_pipeline.sensors import raw_shard_sensor
from resources.storage import DataRoot


@pytest.fixture
def instance():
    with tempfile.TemporaryDirectory(prefix="datamask-s3-dagster-") as home:
        with dg.instance_for_test(temp_dir=home) as inst:
            yield inst


def _tick(instance, data_root, cursor=None) -> dg.SensorResult:
    with dg.build_sensor_context(instance=instance, cursor=cursor,
                                 resources={"data_root": data_root}) as ctx:
        out = raw_shard_sensor(ctx)
    return dg.SensorResult(skip_reason=out) if isinstance(out, dg.SkipReason) else out


def _put(fs, bucket, key, n, seed):
    with fs.open_output_stream(f"{bucket}/root/raw/{key}") as fh:
        pq.write_table(make_table(n, dim=8, seed=seed), fh)


def test_sensor_on_an_s3_raw_prefix(s3fs, bucket, instance):
    data_root = DataRoot(root=f"s3://{bucket}/root")
    assert _tick(instance, data_root).skip_reason is not None  # the prefix does not exist yet

    _put(s3fs, bucket, "shard_a.parquet", 100, 1)
    _put(s3fs, bucket, "shard_b.parquet", 100, 2)
    _put(s3fs, bucket, "bad name.parquet", 10, 3)
    _put(s3fs, bucket, ".shard_c.parquet.tmp-0123", 10, 4)  # another writer's upload in flight
    first = _tick(instance, data_root)
    [add] = first.dynamic_partitions_requests
    assert add.partitions_def_name == PARTITIONS_NAME and list(add.partition_keys) == ["shard_a", "shard_b"]
    assert not first.run_requests
    assert not first.asset_events  # new shards: registered, nothing to record
    instance.add_dynamic_partitions(PARTITIONS_NAME, list(add.partition_keys))

    second = _tick(instance, data_root, first.cursor)
    assert not second.asset_events and not second.dynamic_partitions_requests

    _put(s3fs, bucket, "shard_b.parquet", 150, 5)  # rewritten in place (new size and mtime)
    third = _tick(instance, data_root, second.cursor)
    [obs] = third.asset_events
    assert obs.partition == "shard_b"
    assert obs.tags["dagster/data_version"] != json.loads(first.cursor)["shard_b"]
    assert not third.dynamic_partitions_requests
