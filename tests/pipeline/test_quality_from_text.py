"""A bare parquet of id and text through the pipeline (issue 21 items 1 and 4): the features step
scores the quality from the text (the contract's scorer) and embeds it; the checks, the mask and
the subset run; the scorer is in the data version; a retried step reuses the score chunks."""

import os

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.learn import MaskConfig
from assets.partitions import register_shards
from resources.contract import DataContract
from tests.engine.test_quality import damaged, good_docs

from .helpers import ALL_ASSETS, CHAIN, TINY

KEY = "idtext_000"


@pytest.fixture
def id_text(data_root, resources):
    texts = good_docs(40) + damaged(good_docs(80)[40:])
    table = pa.table({"chunk_id": pa.array(np.arange(80, dtype=np.int64)),
                      "text": pa.array(texts)})
    os.makedirs(data_root.raw_root, exist_ok=True)
    pq.write_table(table, data_root.raw_shard(KEY))
    return table, {**resources, "contract": DataContract(quality_min=0.0, quality_max=1.0)}


def _run(instance, resources, selection=CHAIN, **mask):
    return dg.materialize(
        ALL_ASSETS, partition_key=KEY, instance=instance, resources=resources,
        run_config=dg.RunConfig({"mask": MaskConfig(**{**TINY, **mask})}
                                if selection is CHAIN else {}),
        selection=selection, raise_on_error=False)


def _mats(result) -> dict:
    return {e.asset_key.to_user_string(): e.materialization
            for e in result.get_asset_materialization_events()}


def test_id_and_text_shard_through_the_chain(instance, data_root, id_text):
    from datamask_pipeline.engine.quality import HeuristicScorer

    raw, resources = id_text
    register_shards(instance, data_root.raw_root)
    result = _run(instance, resources, lamb=0.9)
    assert result.success
    assert all(e.passed for e in result.get_asset_check_evaluations())
    feats = pq.read_table(data_root.features(KEY))
    np.testing.assert_array_equal(feats.column("quality").to_numpy(),
                                  HeuristicScorer().score(raw.column("text")))
    # each row's language, as the scorer detected it, is a column of the features
    _, langs = HeuristicScorer().score_languages(raw.column("text"))
    assert feats.column("language").to_pylist() == list(langs)
    assert feats.schema.names == ["id", "quality", "embedding", "language"]
    meta = _mats(result)["features"].metadata
    assert meta["quality_scorer"].value == "heuristic"
    assert "computed from raw column 'text' by heuristic" in \
        meta["dagster/column_schema"].schema.columns[1].description
    assert not os.path.exists(os.path.join(data_root.root, "checkpoints", f"{KEY}.quality"))
    sel = pq.read_table(data_root.selected(KEY))
    assert sel.num_rows == round(TINY["select_ratio"] * 80) and sel.schema == raw.schema
    # quality-led selection keeps mostly the real documents (ids < 40)
    assert np.mean(np.array(sel.column("chunk_id").to_pylist()) < 40) >= 0.75


def test_scorer_in_data_version_and_retry_reuses_chunks(instance, data_root, id_text):
    from datamask_pipeline.engine.quality import load_scorer, score_shard

    _, resources = id_text
    register_shards(instance, data_root.raw_root)
    features = dg.AssetSelection.assets("features")
    ck = os.path.join(data_root.root, "checkpoints", f"{KEY}.quality")
    # a killed earlier attempt left its chunks: the step reuses them
    score_shard(data_root.raw_shard(KEY), ck, scorer=load_scorer(), id_column="chunk_id")
    first = _mats(_run(instance, resources, features))["features"]
    assert (first.metadata["quality_chunks_reused"].value,
            first.metadata["quality_chunks_computed"].value) == (1, 0)
    again = _mats(_run(instance, resources, features))["features"]
    other_res = {**resources, "contract": DataContract(quality_scorer="heuristic=0.5")}
    other = _mats(_run(instance, other_res, features))["features"]
    version = lambda m: m.tags["dagster/data_version"]  # noqa: E731
    assert version(first) == version(again) != version(other)
    assert version(first) != first.metadata["sha256"].value  # the scorer is in it
    assert other.metadata["quality_scorer"].value == "0.5*heuristic"


def test_scorer_that_cannot_load_fails_the_features_step(instance, data_root, id_text):
    _, resources = id_text
    register_shards(instance, data_root.raw_root)
    resources = {**resources, "contract": DataContract(quality_scorer="hf:HuggingFaceFW/x")}
    result = _run(instance, resources, dg.AssetSelection.assets("features"))
    assert not result.success
    text = [e for e in result.all_events if e.is_step_failure][0].step_failure_data.error.message
    assert "ingestion failed" in text and ("pip install transformers" in text
                                           or "cannot be loaded offline" in text)
