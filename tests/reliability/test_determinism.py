"""Issue 5, item 5: determinism, and data versions that are content hashes.

Same inputs, config, seed and device -> the same selection: the in-process chain and
``dagster asset materialize`` in a separate process (another data root, another instance)
write byte-identical features, mask and selected parquet files with identical data versions.
Every data version is the SHA-256 of the file it describes, so an unchanged rerun records the
same versions and leaves downstream assets fresh, while a changed raw shard makes them stale.
(Identical selections across a resume: tests/reliability/test_killed_runs.py; across two
engine CLI processes: tests/engine/test_cli.py.)
"""

import json
import os
import shutil
import subprocess

import dagster as dg
from dagster._core.definitions.data_version import StaleStatus

from assets.ingest import features, raw_shard
from assets.partitions import register_shards
from assets.learn import mask
from assets.select import selected_subset
from tests.pipeline.helpers import TINY

from .helpers import BIN, REPO, SECRET_SENTINEL, dagster_env, init_home, read_bytes, sha

CHAIN_KEYS = ("features", "mask", "selected_subset")


def _files(root, key) -> dict:
    return {"features": root.features(key), "mask": root.mask(key),
            "selected_subset": root.selected(key)}


def _versions(instance, key) -> dict:
    out = {}
    for asset in CHAIN_KEYS:
        recs = instance.fetch_materializations(dg.AssetRecordsFilter(
            asset_key=dg.AssetKey(asset), asset_partitions=[key]), limit=1).records
        out[asset] = recs[0].asset_materialization.tags["dagster/data_version"]
    return out


def _status(instance, key) -> dict:
    # Dagster's own helper: the resolver the UI uses, over the chain's assets and their source
    from dagster._utils.test.data_versions import get_stale_status_resolver

    resolver = get_stale_status_resolver(instance, [raw_shard, features, mask, selected_subset])
    return {a.key.to_user_string(): resolver.get_status(a.key, key) for a in (mask, selected_subset)}


def test_same_inputs_same_outputs_across_processes_and_content_hash_versions(
        registered, run_chain, data_root, instance, fast_dir):
    key = registered[0]
    assert run_chain(key).success
    files = _files(data_root, key)
    versions = _versions(instance, key)
    # the data version of each output is the SHA-256 of its bytes
    assert versions == {a: sha(p) for a, p in files.items()}

    # ---- a separate process, another data root and Dagster home, the same raw shard
    other_root = os.path.join(fast_dir, "other", "data")
    os.makedirs(os.path.join(other_root, "raw"))
    shutil.copyfile(data_root.raw_shard(key), os.path.join(other_root, "raw", f"{key}.parquet"))
    home = init_home(os.path.join(fast_dir, "other", "home"))
    env = dagster_env(home, other_root)
    with dg.DagsterInstance.from_config(home) as other:
        assert register_shards(other, os.path.join(other_root, "raw"))["added"] == [key]
    config = {"ops": {"mask": {"config": TINY}},
              "resources": {"learner": {"config": {"shard_report": False}}}}
    r = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-m",
                        "datamask_pipeline.definitions", "--select", ",".join(CHAIN_KEYS),
                        "--partition", key, "--config-json", json.dumps(config)],
                       cwd=str(REPO), env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert SECRET_SENTINEL not in r.stdout + r.stderr
    from resources.storage import DataRoot

    other_files = _files(DataRoot(root=other_root), key)
    for asset in CHAIN_KEYS:
        assert read_bytes(other_files[asset]) == read_bytes(files[asset]), asset
    with dg.DagsterInstance.from_config(home) as other:
        assert _versions(other, key) == versions

    # ---- an unchanged rerun: same versions, downstream stays fresh
    assert _status(instance, key) == {"mask": StaleStatus.FRESH, "selected_subset": StaleStatus.FRESH}
    assert run_chain(key).success
    assert _versions(instance, key) == versions
    assert run_chain(key, selection=dg.AssetSelection.assets(features)).success
    assert _status(instance, key) == {"mask": StaleStatus.FRESH, "selected_subset": StaleStatus.FRESH}

    # ---- a changed raw shard: new features version, mask and subset become stale
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(data_root.raw_shard(key))
    t = t.set_column(1, "quality_score", pa.array(t.column("quality_score").to_numpy()[::-1].copy()))
    pq.write_table(t, data_root.raw_shard(key))
    assert run_chain(key, selection=dg.AssetSelection.assets(features)).success
    assert _versions(instance, key)["features"] != versions["features"]
    assert _status(instance, key) == {"mask": StaleStatus.STALE, "selected_subset": StaleStatus.STALE}
