"""The whole pipeline against a real S3 endpoint (moto's server over HTTP): two raw shards in
a bucket, every output written back to it, nothing on local disk; then a rerun of one
partition with a new config changes that partition's objects only."""

import io
import os
import tempfile
import time

import dagster as dg
import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dagster_duckdb import DuckDBResource

from assets.ingest import features, raw_shard
from assets.learn import MaskConfig, mask
from assets.partitions import register_shards
from assets.report import corpus_summary
from assets.select import selected_subset
from assets.shard_report import shard_report
from assets.validate import CHECKS, validate_features
from datamask_pipeline import settings
from datamask_pipeline.engine.sample import make_table
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.storage import DataRoot

from .helpers import bucket_state, list_markers, list_objects, local_files, output_like, read_object

ROWS, DIM = 300, 16
KEYS = ["shard_000", "shard_001"]
TINY = dict(n_epochs=30, n_rollout=16, partial=0.1, select_ratio=0.1)
K = round(TINY["select_ratio"] * ROWS)
ALL_ASSETS = [raw_shard, features, mask, shard_report, selected_subset, corpus_summary,
              validate_features]
CHAIN = dg.AssetSelection.assets(features, mask, shard_report, selected_subset)
# at least these report figures (the optimisation curve only where the route takes learning
# steps; the default route here takes none)
FIGURES = ("quality", "projection", "spectrum")


@pytest.fixture
def instance():
    # Dagster's own run/event storage is local by design (on a cluster: Postgres); tmpfs
    # when there is one, so sqlite commits cost nothing.
    fast = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(dir=fast, prefix="datamask-s3-dagster-") as home:
        with dg.instance_for_test(temp_dir=home) as inst:
            yield inst


@pytest.fixture
def s3_root(s3_env, s3fs, bucket, monkeypatch) -> str:
    """``s3://<bucket>/root`` as the data root, with two raw shards uploaded under raw/."""
    root = f"s3://{bucket}/root"
    monkeypatch.setenv(settings.ENV_DATA_ROOT, root)
    monkeypatch.delenv(settings.ENV_RAW_ROOT, raising=False)
    for i, key in enumerate(KEYS):
        table = make_table(ROWS, dim=DIM, seed=5, id_offset=i * ROWS, row_seed=i)
        with s3fs.open_output_stream(f"{bucket}/root/raw/{key}.parquet") as fh:
            pq.write_table(table, fh, row_group_size=128)
    return root


def _resources(root: str) -> dict:
    return {
        "data_root": DataRoot(root=root),
        "contract": DataContract(expected_dim=DIM, quality_min=0.0, quality_max=1.0),
        # checkpoints every 10 steps: the learner writes (and finally deletes) them in S3 too
        "learner": MaskLearner(device="cpu", cpu_threads=1, checkpoint_every=10,
                               log_interval_s=5.0, shard_report=True),
        "duckdb": DuckDBResource(database=":memory:"),
        "catalog": DuckDBResource(database=DataRoot(root=root).catalog()),
    }


def _chain(instance, resources, key, **cfg):
    result = dg.materialize(
        ALL_ASSETS, partition_key=key, instance=instance, resources=resources,
        run_config=dg.RunConfig({"mask": MaskConfig(**{**TINY, **cfg})}), selection=CHAIN)
    assert result.success
    evals = result.get_asset_check_evaluations()
    assert {e.check_name for e in evals} == set(CHECKS)
    assert all(e.passed for e in evals), [e.description for e in evals if not e.passed]
    return result


def _summary(instance, resources):
    result = dg.materialize(ALL_ASSETS, instance=instance, resources=resources,
                            selection=[dg.AssetKey("corpus_summary")])
    assert result.success
    return result.get_asset_materialization_events()[0].materialization.metadata


def _parquet(fs, bucket, key):
    return pq.read_table(io.BytesIO(read_object(fs, bucket, key)))


def test_whole_chain_in_s3_then_rerun_one_partition(s3_root, s3fs, bucket, instance, tmp_path,
                                                    monkeypatch):
    repo = str(settings.repo_root())
    repo_before = {p: os.stat(os.path.join(repo, p)).st_mtime_ns
                   for p in output_like(local_files(repo))}
    # Every relative path, and every temp file the code makes, lands in these two folders.
    cwd, scratch = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir(), scratch.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    resources = _resources(s3_root)
    added = register_shards(instance, resources["data_root"].raw_root)
    assert added["added"] == KEYS and added["invalid"] == []

    for key in KEYS:
        mats = {e.asset_key.to_user_string(): e.materialization
                for e in _chain(instance, resources, key).get_asset_materialization_events()}
        assert mats["features"].metadata["features_uri"].value == f"{s3_root}/features/{key}.parquet"
        assert mats["shard_report"].metadata["report_html"].value == f"{s3_root}/reports/{key}/report.html"
        assert mats["selected_subset"].metadata["dagster/row_count"].value == K
    meta = _summary(instance, resources)
    assert meta["shards_in_catalog"].value == 2 and meta["rows_selected"].value == 2 * K
    assert meta["catalog_uri"].value == f"{s3_root}/catalog.duckdb"

    # ---- every output is in the bucket; no temp object is left
    objects = list_objects(s3fs, bucket)
    keys = set(objects)
    for key in KEYS:
        for k in (f"raw/{key}.parquet", f"features/{key}.parquet", f"masks/{key}.parquet",
                  f"selected_per_shard/{key}.parquet", f"reports/{key}/report.html",
                  f"reports/{key}/report.md", f"reports/{key}/report_metrics.json",
                  *(f"reports/{key}/report_{f}.png" for f in FIGURES)):
            assert f"root/{k}" in keys, k
    for k in ("catalog.duckdb", "corpus_report/corpus_report.html",
              "corpus_report/corpus_report.md", "corpus_report/corpus_metrics.json"):
        assert f"root/{k}" in keys, k
    assert not [k for k in keys if ".tmp-" in k or k.endswith(".wal")]
    assert not [k for k in keys if k.startswith("root/checkpoints/")]  # deleted once published
    assert all(objects[k].size > 0 for k in keys)
    # the only other objects are pyarrow's zero-byte directory markers of emptied prefixes
    assert set(list_markers(s3fs, bucket)) - {
        os.path.dirname(k) for k in keys} - {"root", "root/reports"} <= {"root/checkpoints"}

    # ---- nothing on local disk: working directory and temp folder empty, repo untouched
    assert list(cwd.iterdir()) == []
    assert list(scratch.iterdir()) == []  # the catalog's local build folder was removed
    repo_after = {p: os.stat(os.path.join(repo, p)).st_mtime_ns
                  for p in output_like(local_files(repo))}
    assert repo_after == repo_before

    # ---- contents: the selected parquet is exactly the raw rows the mask selected
    for key in KEYS:
        raw = _parquet(s3fs, bucket, f"root/raw/{key}.parquet")
        m = _parquet(s3fs, bucket, f"root/masks/{key}.parquet")
        sel_ids = m.column("id").filter(m.column("selected"))
        assert len(sel_ids) == K
        expected = raw.filter(pc.is_in(raw.column("chunk_id"), value_set=sel_ids))
        got = _parquet(s3fs, bucket, f"root/selected_per_shard/{key}.parquet")
        assert got.schema == raw.schema and got.equals(expected)
        feats = _parquet(s3fs, bucket, f"root/features/{key}.parquet")
        assert feats.column("id").to_pylist() == raw.column("chunk_id").to_pylist()

    # the catalog (a DuckDB file, built locally and uploaded) opens and holds both shards
    local_catalog = tmp_path / "catalog-copy.duckdb"
    local_catalog.write_bytes(read_object(s3fs, bucket, "root/catalog.duckdb"))
    with duckdb.connect(str(local_catalog), read_only=True) as con:
        rows = con.execute("SELECT partition_key, rows_raw, rows_selected, selected_uri, report_uri "
                           "FROM shards ORDER BY 1").fetchall()
        assert rows == [(k, ROWS, K, f"{s3_root}/selected_per_shard/{k}.parquet",
                         f"{s3_root}/reports/{k}/report.html") for k in KEYS]
        assert con.execute("SELECT data_root FROM catalog_info").fetchall() == [(s3_root,)]
    local_catalog.unlink()

    # ---- rerun one partition with a new config: only its objects change
    before = bucket_state(s3fs, bucket)
    time.sleep(1.1)  # S3 Last-Modified has one-second resolution
    a, b = KEYS
    _chain(instance, resources, b, seed=11, lamb=0.3)
    after = bucket_state(s3fs, bucket)
    assert set(after) == set(before)  # no temp object, no checkpoint, nothing removed
    changed = sorted(k for k in before if after[k] != before[k])
    assert all(f"/{b}" in k for k in changed), changed  # partition a, catalog, corpus report
    for k in (f"masks/{b}.parquet", f"selected_per_shard/{b}.parquet", f"reports/{b}/report.html"):
        assert after[f"root/{k}"][2] != before[f"root/{k}"][2], k  # new bytes
    assert after[f"root/features/{b}.parquet"][2] == before[f"root/features/{b}.parquet"][2]
    assert after[f"root/raw/{b}.parquet"] == before[f"root/raw/{b}.parquet"]
    m = _parquet(s3fs, bucket, f"root/masks/{b}.parquet")
    raw = _parquet(s3fs, bucket, f"root/raw/{b}.parquet")
    expected = raw.filter(pc.is_in(raw.column("chunk_id"),
                                   value_set=m.column("id").filter(m.column("selected"))))
    assert _parquet(s3fs, bucket, f"root/selected_per_shard/{b}.parquet").equals(expected)
    assert list(cwd.iterdir()) == [] and list(scratch.iterdir()) == []
