"""sample: the synthetic corpus has the schema, determinism and structure the method needs."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.data import read_shard
from datamask_pipeline.engine.sample import SOURCES, TOPICS, generate_corpus, make_table


@pytest.fixture(scope="module")
def big():
    table, labels = make_table(5000, dim=64, seed=11, return_labels=True)
    x = np.stack(table.column("feature_arr").combine_chunks().flatten().to_numpy()
                 .reshape(5000, 64))
    q = table.column("quality_score").to_numpy()
    return table, labels, x, q


def test_schema_types_and_ids():
    t = make_table(200, dim=16, seed=1, id_offset=1000)
    assert t.schema.names == ["chunk_id", "quality_score", "feature_arr", "text", "source"]
    assert t.schema.field("chunk_id").type == pa.int64()
    assert t.schema.field("quality_score").type == pa.float64()
    assert t.schema.field("feature_arr").type == pa.list_(pa.float32(), 16)
    assert t.schema.field("text").type == pa.string()
    assert t.schema.field("source").type == pa.string()
    assert t.column("chunk_id").to_pylist() == list(range(1000, 1200))
    assert all(t.column(c).null_count == 0 for c in t.schema.names)
    assert make_table(0, dim=4).num_rows == 0
    with pytest.raises(ValueError):
        make_table(-1)
    with pytest.raises(ValueError):
        make_table(10, dim=0)


def test_values_are_valid(big):
    table, labels, x, q = big
    assert ((q >= 0) & (q <= 1)).all() and q.std() > 0.1
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    assert set(table.column("source").unique().to_pylist()) == set(SOURCES)
    text = table.column("text")
    assert pc.all(pc.greater(pc.utf8_length(text), 20)).as_py()
    has_topic = np.zeros(len(text), dtype=bool)
    for topic, _ in TOPICS:
        has_topic |= pc.match_substring(text, topic).to_numpy(zero_copy_only=False)
    assert has_topic.all()
    # each row's text names the topic of its cluster: one topic per cluster
    for k in np.unique(labels[labels >= 0])[:10]:
        rows = text.take(pa.array(np.flatnonzero(labels == k))).to_pylist()
        shared = [t for t, _ in TOPICS if all(t in r for r in rows)]
        assert shared, k


def test_passes_the_data_contract(tmp_path):
    p = str(tmp_path / "s.parquet")
    pq.write_table(make_table(1000, dim=48, seed=4, id_offset=7), p)
    shard = read_shard(p, expected_dim=48, quality_range=(0, 1))
    assert shard.n == 1000 and shard.d == 48 and shard.ids[0] == 7


def test_deterministic_and_seed_dependent():
    a = make_table(500, dim=16, seed=3)
    assert a.equals(make_table(500, dim=16, seed=3))
    b = make_table(500, dim=16, seed=4)
    assert not a.column("feature_arr").equals(b.column("feature_arr"))
    assert not a.column("quality_score").equals(b.column("quality_score"))
    c = make_table(500, dim=16, seed=3, row_seed=1)
    assert not a.column("feature_arr").equals(c.column("feature_arr"))


def _cluster_stats(labels, x, q):
    ks = np.unique(labels[labels >= 0])
    sizes, tight, qual = [], [], []
    for k in ks:
        xk = x[labels == k]
        c = xk.mean(0)
        c /= np.linalg.norm(c)
        sizes.append(len(xk))
        tight.append(float((xk @ c).mean()))
        qual.append(float(q[labels == k].mean()))
    return np.array(sizes), np.array(tight), np.array(qual)


def test_cluster_structure(big):
    _, labels, x, q = big
    sizes, tight, qual = _cluster_stats(labels, x, q)
    assert len(sizes) >= 20
    assert sizes.max() >= 8 * sizes.min()  # uneven sizes
    assert (tight > 0.99).sum() >= 3  # near-duplicate clusters
    assert (tight < 0.75).sum() >= 3  # diffuse clusters
    # quality follows tightness: tight clusters are the high-quality ones
    assert np.corrcoef(tight, qual)[0, 1] > 0.7
    noise = labels == -1
    assert 0.02 < noise.mean() < 0.08
    assert q[noise].mean() < q[~noise].mean() - 0.2


def test_quality_topk_picks_near_duplicates(big):
    """The case joint selection exists for: quality-only top-k is far more redundant."""
    _, labels, x, q = big
    k = 500
    top = np.argsort(-q)[:k]
    rnd = np.random.default_rng(0).choice(len(q), k, replace=False)

    def mean_cos(idx):
        s = x[idx] @ x[idx].T
        return float((s.sum() - k) / (k * (k - 1)))

    assert mean_cos(top) > mean_cos(rnd) + 0.1
    assert len(np.unique(labels[top])) < 0.6 * len(np.unique(labels[rnd]))


def test_shards_share_topics():
    t0, l0 = make_table(2000, dim=32, seed=9, row_seed=0, return_labels=True)
    t1, l1 = make_table(2000, dim=32, seed=9, row_seed=1, return_labels=True)
    x0 = t0.column("feature_arr").combine_chunks().flatten().to_numpy().reshape(-1, 32)
    x1 = t1.column("feature_arr").combine_chunks().flatten().to_numpy().reshape(-1, 32)
    common = [k for k in np.unique(l0[l0 >= 0]) if (l0 == k).sum() > 20 and (l1 == k).sum() > 20]
    assert len(common) >= 5
    for k in common:
        c0, c1 = x0[l0 == k].mean(0), x1[l1 == k].mean(0)
        assert c0 @ c1 / np.linalg.norm(c0) / np.linalg.norm(c1) > 0.9


def test_n_clusters_is_honoured():
    _, labels = make_table(600, dim=8, seed=0, n_clusters=3, return_labels=True)
    assert set(np.unique(labels)) <= {-1, 0, 1, 2}


def test_generate_corpus_deterministic_bytes_and_distinct_ids(tmp_path):
    a = generate_corpus(str(tmp_path / "a"), n_shards=3, rows_per_shard=400, dim=16, seed=5)
    b = generate_corpus((tmp_path / "b").as_uri(), n_shards=3, rows_per_shard=400, dim=16, seed=5)
    assert [os.path.basename(u) for u in a] == ["shard_000.parquet", "shard_001.parquet",
                                                 "shard_002.parquet"]
    assert storage.list_files(str(tmp_path / "a")) == a
    assert [storage.sha256(u) for u in a] == [storage.sha256(u) for u in b]
    ids = np.concatenate([pq.read_table(u, columns=["chunk_id"]).column(0).to_numpy() for u in a])
    assert len(ids) == 1200 and len(np.unique(ids)) == 1200
    assert storage.sha256(a[0]) != storage.sha256(a[1])
    assert not any(".tmp-" in n for n in os.listdir(tmp_path / "a"))
    c = generate_corpus(str(tmp_path / "c"), n_shards=1, rows_per_shard=400, dim=16, seed=6)
    assert storage.sha256(c[0]) != storage.sha256(a[0])
    for u in a:
        read_shard(u, expected_dim=16, quality_range=(0, 1))
