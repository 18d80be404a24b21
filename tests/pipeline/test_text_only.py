"""A text-only shard (a text column, no embedding column) through the pipeline: features
embeds it with the default model, offline; the blocking checks, the mask and the selected
subset run as for any shard."""

import os

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest

from assets.learn import MaskConfig
from assets.partitions import register_shards
from assets.validate import CHECKS
from resources.contract import DataContract
from tests.engine.text_corpus import text_shard

from .helpers import ALL_ASSETS, CHAIN, TINY

KEY = "text_000"


@pytest.fixture
def text_resources(data_root, resources, monkeypatch):
    """The text-only shard under the raw location, and the tests' resources with a contract
    that declares no embedding dimension (the model's own applies)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    table = text_shard()
    os.makedirs(data_root.raw_root, exist_ok=True)
    pq.write_table(table, data_root.raw_shard(KEY))
    return table, {**resources, "contract": DataContract(quality_min=0.0, quality_max=1.0)}


def _run(instance, resources, selection=CHAIN, **mask):
    return dg.materialize(
        ALL_ASSETS, partition_key=KEY, instance=instance, resources=resources,
        run_config=dg.RunConfig({"mask": MaskConfig(**{**TINY, **mask})}
                                if selection is CHAIN else {}),
        selection=selection)


def _mats(result) -> dict:
    return {e.asset_key.to_user_string(): e.materialization
            for e in result.get_asset_materialization_events()}


def test_text_only_shard_through_the_chain(instance, data_root, text_resources):
    raw, resources = text_resources
    register_shards(instance, data_root.raw_root)
    result = _run(instance, resources, algorithm="Facility", n_epochs=60)
    assert result.success
    evals = result.get_asset_check_evaluations()
    assert {e.check_name for e in evals} == set(CHECKS) and all(e.passed for e in evals)
    mats = _mats(result)

    feats = pq.read_table(data_root.features(KEY))
    assert feats.schema.names == ["id", "quality", "embedding"]
    assert feats.column("id").to_pylist() == raw.column("chunk_id").to_pylist()
    emb = np.stack(feats.column("embedding").to_numpy(zero_copy_only=False))
    assert emb.shape == (raw.num_rows, 256)
    from datamask_pipeline.engine.embed import load_embedder

    np.testing.assert_allclose(emb, load_embedder().embed(raw.column("text").to_pylist()),
                               atol=1e-6)
    meta = mats["features"].metadata
    assert meta["embedding_model"].value == "wordllama/l2_supercat"
    assert meta["embedding_dim"].value == 256
    assert "computed from raw column 'text'" in meta["dagster/column_schema"].schema.columns[2].description
    # the embedding chunks lived under the checkpoint location and are gone once published
    assert not os.path.exists(os.path.join(data_root.root, "checkpoints", f"{KEY}.embeddings"))
    assert not [f for f in os.listdir(os.path.dirname(data_root.features(KEY))) if f != f"{KEY}.parquet"]

    # the selection: k rows with every raw column; more diverse than quality top-k
    sel = pq.read_table(data_root.selected(KEY))
    k = round(TINY["select_ratio"] * raw.num_rows)
    assert sel.num_rows == k and sel.schema == raw.schema
    m = mats["mask"].metadata
    assert m["f_div_datamask"].value > m["f_div_quality_topk"].value + 0.05
    assert len(set(sel.column("topic").to_pylist())) >= 2


def test_changing_the_model_changes_the_data_version(instance, data_root, text_resources):
    _, resources = text_resources
    register_shards(instance, data_root.raw_root)
    features_only = dg.AssetSelection.assets("features")
    first = _mats(_run(instance, resources, features_only))["features"]
    again = _mats(_run(instance, resources, features_only))["features"]
    resources = {**resources, "contract": DataContract(embedding_model="wordllama:64")}
    other = _mats(_run(instance, resources, features_only))["features"]
    version = lambda m: m.tags["dagster/data_version"]  # noqa: E731
    assert version(first) == version(again) != version(other)
    assert other.metadata["embedding_dim"].value == 64
    assert (first.metadata["embedding_data_version"].value
            != other.metadata["embedding_data_version"].value)


def test_declared_dimension_must_match_the_model(instance, data_root, text_resources):
    _, resources = text_resources
    register_shards(instance, data_root.raw_root)
    resources = {**resources, "contract": DataContract(expected_dim=768)}
    result = dg.materialize(ALL_ASSETS, partition_key=KEY, instance=instance,
                            resources=resources, selection=dg.AssetSelection.assets("features"),
                            raise_on_error=False)
    assert not result.success
    text = [e for e in result.all_events if e.is_step_failure][0].step_failure_data.error.message
    assert (f"partition '{KEY}': ingestion failed: {data_root.raw_shard(KEY)}: column 'text': "
            "rule 'embedding dimension 768' broken; the embedding model wordllama/l2_supercat "
            "gives 256-d vectors") in text


def test_features_reuses_chunks_under_its_checkpoint_location(instance, data_root,
                                                              text_resources):
    """Chunks already under ``checkpoints/<key>.embeddings`` (a killed earlier attempt) are
    reused by the step, not recomputed."""
    from datamask_pipeline.engine.embed import embed_shard, load_embedder

    _, resources = text_resources
    register_shards(instance, data_root.raw_root)
    ck = os.path.join(data_root.root, "checkpoints", f"{KEY}.embeddings")
    embed_shard(data_root.raw_shard(KEY), ck, embedder=load_embedder())
    meta = _mats(_run(instance, resources, dg.AssetSelection.assets("features")))["features"].metadata
    assert (meta["embedding_chunks_reused"].value, meta["embedding_chunks_computed"].value) == (1, 0)
    assert not os.path.exists(ck)
