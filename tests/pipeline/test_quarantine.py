"""Row-level quarantine of text (issue 26, point 11): a few rows that break a row rule of the
text (blank, null, not UTF-8) go to ``rejects/<key>.parquet`` and the rest of the shard
proceeds; past the contract's ``quarantine_share`` the shard fails as before, naming the file,
column, rule, count and ids; structural breaches (ids) still reject the shard."""

import os
import re

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.ingest import write_features
from assets.learn import MaskConfig
from assets.partitions import register_shards
from assets.validate import CHECKS
from datamask_pipeline.engine import contract as C
from datamask_pipeline.engine.data import (
    RAW_ROW,
    Columns,
    DataContractError,
    quarantined_rows,
    raw_row_numbers,
    text_rejects,
)
from resources.contract import DataContract
from tests.engine.text_corpus import python_sentences

from .helpers import ALL_ASSETS, CHAIN, TINY

KEY = "text_000"
N = 5000
FEATURES = dg.AssetSelection.assets("features")


def _texts(n: int = N) -> list:
    """n distinct real documents (CPython's reference manual sentences, numbered)."""
    pool = python_sentences(200)
    return [f"{pool[i % len(pool)]} (section {i})" for i in range(n)]


def _shard(blank=(), texts=None, ids=None) -> pa.Table:
    texts = list(_texts() if texts is None else texts)
    for i in blank:
        texts[i] = " \t " if i % 2 else ""
    ids = np.arange(1000, 1000 + len(texts), dtype=np.int64) if ids is None else ids
    return pa.table({"chunk_id": pa.array(ids), "text": pa.array(texts, pa.string())})


@pytest.fixture
def text_contract(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return DataContract(quality_min=0.0, quality_max=1.0)


def _write(data_root, table) -> str:
    os.makedirs(data_root.raw_root, exist_ok=True)
    pq.write_table(table, data_root.raw_shard(KEY), row_group_size=1500)
    return data_root.raw_shard(KEY)


def _materialize(instance, resources, selection=FEATURES, **kw):
    cfg = dg.RunConfig({"mask": MaskConfig(**{**TINY, "algorithm": "Facility", "n_epochs": 30})}
                       ) if selection is CHAIN else None
    return dg.materialize(ALL_ASSETS, partition_key=KEY, instance=instance, resources=resources,
                          selection=selection, run_config=cfg, **kw)


def _failure(result) -> str:
    return [e for e in result.all_events if e.is_step_failure][0].step_failure_data.error.message


def test_a_few_blank_texts_are_quarantined_and_the_rest_proceed(instance, data_root, resources,
                                                                 text_contract):
    """40 blank texts among 5,000 documents (0.8%, under the default 1%): the shard is not
    rejected. The 40 rows are in the rejects file with id, rule and raw row number; the other
    4,960 are the features, each with its raw row; the checks pass and report the count; the
    mask and the selected subset run on the good rows."""
    blank = sorted(set(range(3, N, 125)))  # 40 rows, spread over several row groups
    assert len(blank) == 40
    raw = _shard(blank)
    _write(data_root, raw)
    register_shards(instance, data_root.raw_root)
    resources = {**resources, "contract": text_contract}
    result = _materialize(instance, resources, CHAIN)
    assert result.success

    rejects = pq.read_table(data_root.rejects(KEY))
    assert rejects.column("row").to_pylist() == blank
    assert rejects.column("rule").to_pylist() == ["non-blank text"] * 40
    assert rejects.column("id").to_pylist() == [str(1000 + i) for i in blank]
    assert set(rejects.column("column").to_pylist()) == {"text"}

    feats = pq.read_table(data_root.features(KEY))
    kept = np.setdiff1d(np.arange(N), blank)
    assert feats.num_rows == N - 40
    assert feats.column(RAW_ROW).to_numpy().tolist() == kept.tolist()
    raw_ids = raw.column("chunk_id").to_numpy()
    # every features row maps back to its raw row: same id
    assert np.array_equal(feats.column("id").to_numpy(), raw_ids[feats.column(RAW_ROW).to_numpy()])
    assert np.array_equal(raw_row_numbers(data_root.features(KEY), [0, 3, 4]), kept[[0, 3, 4]])
    assert quarantined_rows(data_root.features(KEY)) == (40, N)
    from assets.learn import read_features
    from datamask_pipeline.engine.embed import (language_centering, load_embedder,
                                                read_language_sums)

    emb = np.stack(feats.column("embedding").to_numpy(zero_copy_only=False))
    texts = raw.column("text").to_pylist()
    # the features carry the kept rows' model vectors and, in their footer, each language's
    # sums over the kept rows (the default embedding_language_geometry, center); the shard's
    # steps read each vector less its language's mean over the kept rows
    x = load_embedder().embed([texts[i] for i in kept])
    np.testing.assert_allclose(emb[:300], x[:300], atol=1e-6)
    langs = feats.column("language").to_pylist()
    assert read_language_sums(data_root.features(KEY)).rows == N - 40
    lc = language_centering([x], langs)
    shard = read_features(data_root.features(KEY), text_contract)
    np.testing.assert_allclose(shard.embeddings[:300], lc.apply(x[:300], 0), atol=1e-6)

    mats = {e.asset_key.to_user_string(): e.materialization
            for e in result.get_asset_materialization_events()}
    meta = mats["features"].metadata
    assert meta["rows_quarantined"].value == 40
    assert meta["rows_quarantined_by_rule"].value == {"non-blank text": 40}
    assert meta["rejects_uri"].value == data_root.rejects(KEY)
    assert meta["dagster/row_count"].value == N - 40
    evals = result.get_asset_check_evaluations()
    assert {e.check_name for e in evals} == set(CHECKS) and all(e.passed for e in evals)
    for e in evals:
        assert e.metadata["rows_quarantined"].value == 40
        assert "40 rows quarantined at ingestion" in e.description

    # the good rows went on: the selected subset holds raw rows, none of them blank
    sel = pq.read_table(data_root.selected(KEY))
    assert sel.num_rows == round(TINY["select_ratio"] * (N - 40))
    assert all(t.strip() for t in sel.column("text").to_pylist())
    assert not set(sel.column("chunk_id").to_pylist()) & {1000 + i for i in blank}


def test_past_the_share_the_shard_fails_naming_file_column_rule_count_ids(
        instance, data_root, resources, text_contract):
    """150 blank texts among 5,000 (3%, the issue's case): more than the default 1%, so the
    shard fails as before, with the file, column, rule, count and first ids, and nothing is
    written. With the share raised to 5% the same shard passes with 150 rows quarantined."""
    blank = list(range(7, N, 33))[:150]
    raw_uri = _write(data_root, _shard(blank))
    register_shards(instance, data_root.raw_root)
    result = _materialize(instance, {**resources, "contract": text_contract},
                          raise_on_error=False)
    assert not result.success
    msg = _failure(result)
    first = [1000 + i for i in blank[:10]]
    assert (f"partition '{KEY}': ingestion failed: {raw_uri}: column 'text': rule 'non-blank "
            f"text' broken by 150 rows; ids: {first}; 150 of 5000 rows (3.00%) break the row "
            f"rules of the text ('non-blank text': 150), more than the quarantine share 1.00% "
            f"(50 rows)") in msg
    assert not os.path.exists(data_root.features(KEY))
    assert not os.path.exists(data_root.rejects(KEY))

    loose = DataContract(quality_min=0.0, quality_max=1.0, quarantine_share=0.05)
    result = _materialize(instance, {**resources, "contract": loose})
    assert result.success
    assert pq.read_metadata(data_root.features(KEY)).num_rows == N - 150
    assert pq.read_metadata(data_root.rejects(KEY)).num_rows == 150


def test_quarantine_share_zero_rejects_any_bad_row(data_root, tmp_path):
    raw_uri = _write(data_root, _shard([12]))
    with pytest.raises(DataContractError, match=r"column 'text': rule 'non-blank text' broken "
                                                r"by 1 row; ids: \[1012\]"):
        text_rejects(raw_uri, Columns(), share=0.0)


def test_null_and_non_utf8_texts_are_quarantined_under_their_rules(data_root, tmp_path):
    """Null text and bytes that are not UTF-8 in a *string* column (a writer can store them:
    pyarrow reads them back unvalidated) are row rules too, each row under the first rule it
    breaks; a run without quarantine (the engine's reader) still rejects the shard."""
    texts = pa.array([t.encode() for t in _texts(400)], pa.binary())
    py = texts.to_pylist()
    py[5], py[17], py[200] = None, b"caf\xe9 au lait", b"   "
    column = pa.array(py, pa.binary()).view(pa.string())  # invalid UTF-8 inside a string column
    table = pa.table({"chunk_id": pa.array(np.arange(400, dtype=np.int64)), "text": column})
    raw_uri = str(tmp_path / "raw.parquet")
    pq.write_table(table, raw_uri)
    assert pq.read_table(raw_uri).schema.field("text").type == pa.string()
    rej = text_rejects(raw_uri, Columns(), share=0.01)
    assert rej.rows.tolist() == [5, 17, 200]
    assert list(rej.rules) == ["non-null text", "text is valid UTF-8", "non-blank text"]
    assert list(rej.ids) == [5, 17, 200]

    out = str(tmp_path / "features.parquet")
    from datamask_pipeline.engine.embed import load_embedder

    info = write_features(raw_uri, out, Columns(), embedder=load_embedder(),
                          checkpoint_dir=str(tmp_path / "ck"),
                          quality_checkpoint_dir=str(tmp_path / "q"), quarantine_share=0.01)
    assert info["rows"] == 397 and info["rejects"].count == 3
    feats = pq.read_table(out)
    assert 17 not in feats.column("id").to_pylist()
    assert feats.column("id").to_pylist() == feats.column(RAW_ROW).to_pylist()
    with pytest.raises(DataContractError, match="rule 'non-null text' broken by 1 row; ids: \\[5\\]"):
        write_features(raw_uri, str(tmp_path / "f2.parquet"), Columns(),
                       embedder=load_embedder(), checkpoint_dir=str(tmp_path / "ck2"),
                       quality_checkpoint_dir=str(tmp_path / "q2"))


def test_quality_from_text_keeps_raw_embeddings_aligned(tmp_path):
    """A shard with embeddings but no quality: its text is scored, so blank rows are
    quarantined; the kept rows' raw embeddings and their scores stay on the same rows."""
    from datamask_pipeline.engine.quality import load_scorer

    texts = _texts(600)
    blank = [0, 299, 599]
    for i in blank:
        texts[i] = ""
    rng = np.random.default_rng(0)
    emb = rng.normal(size=(600, 8)).astype(np.float32)
    raw_uri = str(tmp_path / "raw.parquet")
    pq.write_table(pa.table({
        "chunk_id": pa.array([f"doc-{i}" for i in range(600)]), "text": texts,
        "feature_arr": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 8)}),
        raw_uri, row_group_size=128)
    out = str(tmp_path / "features.parquet")
    info = write_features(raw_uri, out, Columns(), scorer=load_scorer(),
                          quality_checkpoint_dir=str(tmp_path / "q"), quarantine_share=0.01)
    assert info["rows"] == 597 and info["embedding"] is None
    feats = pq.read_table(out)
    rows = feats.column(RAW_ROW).to_numpy()
    kept = np.setdiff1d(np.arange(600), blank)
    assert rows.tolist() == kept.tolist()
    assert feats.column("id").to_pylist() == [f"doc-{i}" for i in kept]
    np.testing.assert_array_equal(
        np.stack(feats.column("embedding").to_numpy(zero_copy_only=False)), emb[kept])
    np.testing.assert_allclose(feats.column("quality").to_numpy(),
                               load_scorer().score([texts[i] for i in kept]))


def test_a_shard_whose_text_is_not_read_is_not_quarantined(tmp_path):
    """Embeddings and quality given: the text is never read, so a blank text is nobody's
    concern; the features are the raw file row for row, with no raw_row column."""
    raw_uri = str(tmp_path / "raw.parquet")
    texts = _texts(50)
    texts[3] = ""
    emb = np.random.default_rng(1).normal(size=(50, 4)).astype(np.float32)
    pq.write_table(pa.table({"chunk_id": np.arange(50), "quality_score": np.linspace(0, 1, 50),
                             "text": texts,
                             "feature_arr": pa.FixedSizeListArray.from_arrays(
                                 pa.array(emb.reshape(-1)), 4)}), raw_uri)
    out = str(tmp_path / "features.parquet")
    info = write_features(raw_uri, out, Columns(), quarantine_share=0.01)
    assert info["rows"] == 50 and info["rejects"] is None
    assert pq.read_schema(out).names == ["id", "quality", "embedding"]
    assert raw_row_numbers(out) is None and quarantined_rows(out) == (0, None)


def test_structural_breaches_still_reject_the_shard(instance, data_root, resources,
                                                    text_contract):
    """Two blank rows would be quarantined, but a duplicate id among the good rows rejects
    the shard: the ids are the shard's structure, not a row's. Nothing is written."""
    ids = np.arange(1000, 1000 + N, dtype=np.int64)
    ids[10] = ids[11]
    raw_uri = _write(data_root, _shard([20, 30], ids=ids))
    register_shards(instance, data_root.raw_root)
    result = _materialize(instance, {**resources, "contract": text_contract},
                          raise_on_error=False)
    assert not result.success
    assert (f"ingestion failed: {raw_uri}: column 'chunk_id': rule 'unique ids' broken by 1 "
            f"row; ids: [1011]") in _failure(result)
    assert not os.path.exists(data_root.features(KEY))
    assert not os.path.exists(data_root.rejects(KEY))


def test_the_share_is_a_described_contract_knob():
    field = DataContract.model_fields["quarantine_share"]
    assert field.default == C.DEFAULT_QUARANTINE_SHARE == 0.01
    assert "rejects/<shard>.parquet" in field.description
    with pytest.raises(Exception, match="less than or equal to 1"):
        DataContract(quarantine_share=1.5)


def test_shard_report_sources_follow_the_raw_rows(tmp_path):
    """The shard report's per-source retention reads the raw source column at the features'
    raw rows (it was dropped, lengths differing, once rows were quarantined)."""
    from assets.shard_report import read_sources

    raw_uri = str(tmp_path / "raw.parquet")
    pq.write_table(pa.table({"source": ["a", "b", "c", "d", "e"]}), raw_uri)
    assert read_sources(raw_uri, "source", 5).tolist() == ["a", "b", "c", "d", "e"]
    assert read_sources(raw_uri, "source", 3, np.array([0, 2, 4])).tolist() == ["a", "c", "e"]


@pytest.mark.parametrize("ids, rule", [
    # the null id is on a blank row: quarantining it must not hide it
    (pa.array([None] + list(range(1, 400)), pa.int64()), "rule 'non-null ids' broken by 1 row; "
                                                         "row numbers: [0]"),
    # a blank row repeats a good row's id
    (pa.array([7] + list(range(1, 400)), pa.int64()), "rule 'unique ids' broken by 1 row; ids: [7]"),
])
def test_a_quarantined_row_does_not_hide_an_id_breach(tmp_path, ids, rule):
    raw_uri = str(tmp_path / "raw.parquet")
    texts = _texts(400)
    texts[0] = "  "
    pq.write_table(pa.table({"chunk_id": ids, "text": texts}), raw_uri)
    with pytest.raises(DataContractError, match=re.escape(rule)):
        text_rejects(raw_uri, Columns(), share=0.01)


def test_the_corpus_maps_selected_rows_back_to_their_raw_rows(instance, data_root, resources,
                                                              text_contract):
    """The corpus stage over a shard with quarantined rows (the first raw row among them):
    corpus_dedup compares each features row's own text (a planted exact copy is found, by the
    right ids), and corpus_subset writes the raw rows the selection names, none blank."""
    from assets.corpus import CorpusConfig, corpus_dedup, corpus_selection, corpus_subset

    assets = ALL_ASSETS + [corpus_dedup, corpus_selection, corpus_subset]
    texts = python_sentences(1200)
    texts[750] = texts[650]  # a planted exact copy, after quarantined rows
    blank = list(range(0, 1200, 100))  # 12 rows, 1%
    raw = _shard(blank, texts=texts)
    _write(data_root, raw)
    register_shards(instance, data_root.raw_root)
    resources = {**resources, "contract": text_contract}
    assert dg.materialize(assets, partition_key=KEY, instance=instance, resources=resources,
                          selection=FEATURES).success
    result = dg.materialize(
        assets, instance=instance, resources=resources,
        selection=dg.AssetSelection.assets("corpus_dedup", "corpus_selection", "corpus_subset"),
        run_config=dg.RunConfig({"corpus_selection": CorpusConfig(algorithm="Pair_simi",
                                                                  select_rows=100)}))
    assert result.success
    text_of = dict(zip(raw.column("chunk_id").to_pylist(), raw.column("text").to_pylist()))
    dups = pq.read_table(os.path.join(data_root.corpus_dir(), "duplicates.parquet")).to_pylist()
    exact = [d for d in dups if d["reason"] == "exact"]
    assert {frozenset((int(d["id"]), int(d["dup_of_id"]))) for d in exact} == {
        frozenset((1650, 1750))}
    for d in exact:
        assert text_of[int(d["id"])] == text_of[int(d["dup_of_id"])]

    from datamask_pipeline.engine.corpus.outputs import read_selection

    sel = read_selection(data_root)[0]
    out = pq.read_table(data_root.corpus_selected(KEY))
    assert out.num_rows == sel.num_rows == 100
    assert sorted(out.column("chunk_id").to_pylist()) == sorted(
        int(i) for i in sel.column("id").to_pylist())
    assert all(t.strip() for t in out.column("text").to_pylist())
    # the selection's row is the features' row
    feats = pq.read_table(data_root.features(KEY))
    rows = sel.column("row").to_numpy()
    assert sel.column("id").to_pylist() == [str(i) for i in feats.column("id").to_numpy()[rows]]


def test_the_ray_dedup_reads_each_features_rows_own_text(instance, data_root, resources,
                                                          text_contract):
    """corpus_dedup on Ray over a shard with quarantined rows: the texts are read at the
    features' raw rows, so the duplicates are the local engine's."""
    import ray

    from assets.corpus import corpus_dedup

    assets = ALL_ASSETS + [corpus_dedup]
    texts = python_sentences(1200)
    texts[750] = texts[650]
    _write(data_root, _shard(list(range(0, 1200, 100)), texts=texts))
    register_shards(instance, data_root.raw_root)
    resources = {**resources, "contract": text_contract}
    assert dg.materialize(assets, partition_key=KEY, instance=instance, resources=resources,
                          selection=FEATURES).success

    def dedup(**config):
        assert dg.materialize(assets, instance=instance, resources=resources,
                              selection=dg.AssetSelection.assets("corpus_dedup"),
                              run_config=dg.RunConfig({"corpus_dedup": {"config": config}})).success
        t = pq.read_table(os.path.join(data_root.corpus_dir(), "duplicates.parquet"))
        return t.sort_by([("row", "ascending")]).drop_columns(["cosine", "containment"]).to_pylist()

    local = dedup()
    on_ray = dedup(engine="ray", ray_partitions=2)
    assert not ray.is_initialized()
    assert on_ray == local
    assert {frozenset((d["id"], d["dup_of_id"])) for d in local if d["reason"] == "exact"} == {
        frozenset(("1650", "1750"))}
