"""Bad shards: the blocking DuckDB checks stop the run before the GPU step, name the rule and
the offending ids, and nothing downstream is written."""

import os

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.partitions import register_shards
from assets.validate import CHECKS
from datamask_pipeline.engine.sample import make_table

from .helpers import DIM, ROWS, temp_leftovers


def _with_embeddings(table: pa.Table, rows: list) -> pa.Table:
    """Replace the embedding column by python lists (lengths may differ)."""
    i = table.schema.get_field_index("feature_arr")
    return table.set_column(i, "feature_arr", pa.array(rows, pa.list_(pa.float32())))


def _emb(table) -> np.ndarray:
    return np.stack(table.column("feature_arr").to_numpy(zero_copy_only=False)).astype(np.float32)


def nan_embedding(t):
    x = _emb(t)
    x[[3, 7], 0] = np.nan
    x[11, 5] = np.inf
    return _with_embeddings(t, [r.tolist() for r in x]), "finite_nonzero_embeddings", \
        "rule 'finite embeddings' broken by 3 rows", [3, 7, 11]


def duplicate_ids(t):
    ids = t.column("chunk_id").to_numpy().copy()
    ids[21], ids[41] = ids[20], ids[40]
    t = t.set_column(0, "chunk_id", pa.array(ids))
    return t, "unique_ids", "rule 'unique ids' broken by 2 rows", [20, 40]


def wrong_dim(t):
    x = _emb(t)
    rows = [r.tolist() for r in x]
    for i in (4, 8, 15):
        rows[i] = rows[i][:12]
    return _with_embeddings(t, rows), "embedding_dim", \
        f"rule 'embedding dimension {DIM}' broken by 3 rows", [4, 8, 15]


def zero_embedding(t):
    x = _emb(t)
    x[[9, 10]] = 0.0
    return _with_embeddings(t, [r.tolist() for r in x]), "finite_nonzero_embeddings", \
        "rule 'non-zero embeddings' broken by 2 rows", [9, 10]


def bad_quality(t):
    q = t.column("quality_score").to_numpy().copy()
    q[5] = np.inf
    q[6] = 1.5  # outside the declared range [0, 1]
    t = t.set_column(1, "quality_score", pa.array(q))
    return t, "finite_quality", "rule 'finite quality' broken by 1 row", [5]


DEFECTS = [nan_embedding, duplicate_ids, wrong_dim, zero_embedding, bad_quality]


@pytest.mark.parametrize("defect", DEFECTS, ids=[d.__name__ for d in DEFECTS])
def test_bad_shard_fails_blocking_check(defect, instance, data_root, run_chain):
    key = f"bad_{defect.__name__}"
    table, check, fragment, ids = defect(make_table(ROWS, dim=DIM, seed=5))
    os.makedirs(data_root.raw_root, exist_ok=True)
    raw_uri = data_root.raw_shard(key)
    pq.write_table(table, raw_uri)
    assert register_shards(instance, data_root.raw_root)["added"] == [key]

    result = run_chain(key, raise_on_error=False)
    assert not result.success
    evals = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(evals) == set(CHECKS)
    failed = evals[check]
    assert not failed.passed
    msg = failed.description
    assert f"partition '{key}'" in msg and raw_uri in msg and fragment in msg, msg
    assert f"ids: {ids}" in msg, msg
    assert failed.metadata["offending_ids"].value[: len(ids)] == ids
    others = [n for n, e in evals.items() if not e.passed and n != check]
    if defect is bad_quality:  # the range rule is part of the same check
        assert "rule 'quality in [0.0, 1.0]' broken by 1 row; ids: [6]" in msg
    assert others == [], [evals[n].description for n in others]

    # blocked: the GPU step and the subset never ran, nothing downstream exists
    mats = {e.asset_key for e in result.get_asset_materialization_events()}
    assert mats == {dg.AssetKey("features")}
    assert not os.path.exists(data_root.mask(key))
    assert not os.path.exists(data_root.selected(key))
    assert not os.path.exists(data_root.report_dir(key))
    assert not os.path.exists(data_root.checkpoint(key))
    assert temp_leftovers(data_root.root) == []


def test_mask_alone_refuses_bad_features(instance, data_root, run_chain):
    """``--select mask`` skips the checks of features; the mask step re-checks the contract
    itself and fails without retrying and without writing anything."""
    key = "bad_alone"
    table, *_ = nan_embedding(make_table(ROWS, dim=DIM, seed=5))
    os.makedirs(data_root.raw_root, exist_ok=True)
    pq.write_table(table, data_root.raw_shard(key))
    register_shards(instance, data_root.raw_root)
    assert run_chain(key, selection=dg.AssetSelection.assets("features").without_checks()).success
    result = run_chain(key, selection=[dg.AssetKey("mask")], raise_on_error=False)
    assert not result.success
    failures = [e for e in result.all_events if e.is_step_failure]
    assert len(failures) == 1
    text = failures[0].step_failure_data.error.message
    assert "features do not satisfy the data contract" in text and "finite embeddings" in text
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert not os.path.exists(data_root.mask(key))


def test_ingestion_rejects_unmappable_shard(instance, data_root, run_chain):
    """A shard without the embedding column and without a text column to embed cannot be
    mapped to the canonical schema: the ingestion step fails naming file, column and rule, and
    writes no features file."""
    key = "no_embedding"
    table = make_table(ROWS, dim=DIM, seed=5).drop_columns(["feature_arr", "text"])
    os.makedirs(data_root.raw_root, exist_ok=True)
    pq.write_table(table, data_root.raw_shard(key))
    register_shards(instance, data_root.raw_root)
    result = run_chain(key, raise_on_error=False)
    assert not result.success
    text = [e for e in result.all_events if e.is_step_failure][0].step_failure_data.error.message
    assert "column 'feature_arr'" in text and "rule 'column present'" in text
    assert f"partition '{key}'" in text and data_root.raw_shard(key) in text
    assert not os.path.exists(data_root.features(key))
    assert not result.get_asset_materialization_events()

