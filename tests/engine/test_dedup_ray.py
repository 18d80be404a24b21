"""The corpus dedup on Ray Data (``engine.corpus.dedup_ray``) against the embedded one
(``engine.corpus.dedup.deduplicate``): a corpus of 4 parquet shards with planted exact copies
(other case and spaces), copies with a footer line (boilerplate), small text edits (fuzzy) and
near-duplicate embeddings (cosine >= 0.99) in other files than their originals; both paths
must keep and drop the same rows for the same reasons, naming the same originals. Bad inputs
fail before Ray runs, or from inside a Ray task, naming the file and the column.

Ray runs here with one CPU (the machine is shared) and small shuffles."""

import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import ray

from datamask_pipeline.engine.corpus.dedup import deduplicate
from datamask_pipeline.engine.corpus.dedup_ray import ShardSource, deduplicate_ray
from datamask_pipeline.engine.errors import DataContractError
from datamask_pipeline.engine.sample import make_table
from tests.engine.text_corpus import python_sentences

DIM, BASE, NEAR, EXACT, FOOTER, FUZZY = 16, 240, 12, 10, 8, 8
KNOBS = dict(threshold=0.98, containment=0.8, rows_per_cluster=40, probes=2, seed=0)
FOOTER_LINE = "Shared from our weekly newsletter, subscribe today."


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    yield
    ray.shutdown()


def _unit(v):
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _corpus(tmp_path, shards=4):
    """(ShardSource list, planted {kind: [(copy id, original id)]}): the rows shuffled over
    ``shards`` files of uneven size; features (id, quality, embedding) and raw (id, text)."""
    rng = np.random.default_rng(7)
    # half the rows from the sample generator (tight topic clusters: near-duplicates of each
    # other at 0.98 too), half spread out
    t = make_table(BASE // 2, dim=DIM, seed=5)
    x = np.vstack([np.asarray(t.column("feature_arr").to_pylist(), dtype=np.float32),
                   rng.standard_normal((BASE - BASE // 2, DIM)).astype(np.float32)])
    q = np.r_[t.column("quality_score").to_numpy(), rng.uniform(0, 1, BASE - BASE // 2)]
    sent = python_sentences(BASE + NEAR)
    texts = sent[:BASE]
    ids = list(range(BASE))
    planted = {"near": [], "exact": [], "footer": [], "fuzzy": []}
    # near copies of the spread-out rows: the text guard checks a row's most similar
    # better-ranked row, which in a tight topic cluster may be another row than its original
    # (sentences of 8 to 30 words: 3-gram containment under 0.8 and over the guard)
    fit = [i for i in range(BASE // 2, BASE) if 8 <= len(texts[i].split()) <= 30]
    near_src = rng.choice(fit, NEAR, replace=False)
    rest = np.setdiff1d(np.arange(BASE), near_src)
    src = np.r_[near_src, rng.choice(rest, EXACT + FOOTER + FUZZY, replace=False)]
    nid = 10_000
    X, Q, T = [x], [q], list(texts)
    for j, o in enumerate(src):
        if j < NEAR:  # the same embedding up to noise (cosine >= 0.99), the same words with
            # one or two pairs of neighbours swapped
            kind = "near"
            v = x[o] + 0.02 * np.linalg.norm(x[o]) * _unit(rng.standard_normal(DIM)) / 2
            w = texts[o].split()
            for a in ((len(w) // 2,) if len(w) < 16 else (1, len(w) - 3)):
                w[a], w[a + 1] = w[a + 1], w[a]
            text = " ".join(w)
        else:  # the text (changed), an unrelated embedding
            v = rng.standard_normal(DIM).astype(np.float32)
            if j < NEAR + EXACT:
                kind, text = "exact", "  " + texts[o].upper().replace(" ", "   ") + " "
            elif j < NEAR + EXACT + FOOTER:
                kind, text = "footer", texts[o] + "\n" + FOOTER_LINE
            else:
                kind, text = "fuzzy", texts[o] + f" See also note {j} of the manual."
        X.append(v[None, :].astype(np.float32))
        Q.append(np.array([q[o] - 1e-3]))
        T.append(text)
        ids.append(nid)
        planted[kind].append((nid, int(o)))
        nid += 1
    X, Q, ids = np.vstack(X), np.concatenate(Q), np.asarray(ids)
    cos = [float(_unit(X[BASE + j]) @ _unit(x[o])) for j, (_, o) in enumerate(planted["near"])]
    assert min(cos) >= 0.99
    perm = rng.permutation(ids.size)
    cuts = np.r_[0, np.sort(rng.choice(np.arange(40, ids.size - 40), shards - 1, replace=False)),
                 ids.size]
    out = []
    for s in range(shards):
        r = perm[cuts[s]:cuts[s + 1]]
        feat, raw = str(tmp_path / f"features_{s}.parquet"), str(tmp_path / f"raw_{s}.parquet")
        emb = pa.array([row.tolist() for row in X[r]], pa.list_(pa.float32()))
        pq.write_table(pa.table({"id": pa.array(ids[r]), "quality": pa.array(Q[r]),
                                 "embedding": emb}), feat, row_group_size=37)
        pq.write_table(pa.table({"chunk_id": pa.array(ids[r]),
                                 "text": pa.array([T[i] for i in r], pa.string())}), raw,
                       row_group_size=50)
        out.append(ShardSource(features=feat, raw=raw, text_column="text"))
    return out, planted


def _embedded(shards, **kw):
    """The embedded path on the concatenated arrays, as ``corpus_dedup`` calls it (ids as
    text)."""
    feats = [pq.read_table(s.features) for s in shards]
    x = np.concatenate([np.asarray(f.column("embedding").to_pylist(), dtype=np.float32)
                        for f in feats])
    q = np.concatenate([f.column("quality").to_numpy().astype(np.float64) for f in feats])
    ids = np.concatenate([pc.cast(f.column("id"), pa.string()).to_numpy(zero_copy_only=False)
                          for f in feats])
    shard_of = np.concatenate([np.full(f.num_rows, i) for i, f in enumerate(feats)])
    row_of = np.concatenate([np.arange(f.num_rows) for f in feats])
    texts = pa.chunked_array([pq.read_table(s.raw).column(s.text_column) for s in shards])
    return deduplicate(x, q, ids, shard_of, row_of, texts.combine_chunks(), **kw), ids, shard_of, row_of


def _lineage(res):
    return sorted((d["shard"], d["row"], d["dup_of_shard"], d["dup_of_row"], d["reason"])
                  for d in res.dropped)


def test_ray_dedup_equals_the_embedded_one_and_finds_the_planted_duplicates(tmp_path, ray_local):
    shards, planted = _corpus(tmp_path)
    t0 = time.perf_counter()
    local, ids, shard_of, row_of = _embedded(shards, **KNOBS)
    t_local = time.perf_counter() - t0
    t0 = time.perf_counter()
    dist = deduplicate_ray(shards, shuffle_partitions=2, **KNOBS)
    t_ray = time.perf_counter() - t0
    reasons = {r: sum(d["reason"] == r for d in local.dropped) for r in ("exact", "fuzzy", "near")}
    print(f"\nembedded {t_local:.2f}s, ray {t_ray:.2f}s, rows {ids.size}, dropped {reasons}")

    assert len(dist.keep) == len(local.keep) == len(shards)
    for a, b in zip(dist.keep, local.keep):
        assert a.dtype == bool and np.array_equal(a, b)
    assert _lineage(dist) == _lineage(local)
    by = {(d["shard"], d["row"]): d for d in dist.dropped}
    for d in local.dropped:
        e = by[(d["shard"], d["row"])]
        assert e["cosine"] == d["cosine"] or (np.isnan(e["cosine"]) and np.isnan(d["cosine"]))
        assert e["containment"] == d["containment"] or (
            np.isnan(e["containment"]) and np.isnan(d["containment"]))
        # the evidence of every kind: both measures, the kind, the row kept for it
        assert not np.isnan(e["cosine"]) and not np.isnan(e["containment"]), e
        assert (e["kind"], e["kept_shard"], e["kept_row"]) == (d["kind"], d["kept_shard"],
                                                               d["kept_row"])
        assert e["kind"] == {"exact": "exact", "fuzzy": "fuzzy", "near": "semantic"}[e["reason"]]
        if e["reason"] == "exact":
            assert e["containment"] == 1.0
    assert local.stats["near_text_vetoed"] == dist.stats["near_text_vetoed"] > 0
    for key in ("rows", "exact_dropped", "fuzzy_dropped", "fuzzy_pairs", "near_dropped",
                "clusters", "dropped", "kept"):
        assert dist.stats[key] == local.stats[key], key
    assert dist.stats["clusters"] > 1 and dist.stats["boilerplate_lines"] == 1

    # the planted pairs: each copy is dropped for the expected reason and names its original
    where = {str(i): (int(s), int(r)) for i, s, r in zip(ids, shard_of, row_of)}
    expect = {"near": "near", "exact": "exact", "footer": "exact", "fuzzy": "fuzzy"}
    for kind, pairs in planted.items():
        for copy, orig in pairs:
            d = by[where[str(copy)]]
            assert d["reason"] == expect[kind], (kind, d)
            assert (d["dup_of_shard"], d["dup_of_row"]) == where[str(orig)], (kind, d)
            if kind == "near":
                assert d["cosine"] >= 0.99 and 0.3 <= d["containment"] < 0.8, d
            if kind == "fuzzy":
                assert d["containment"] == 1.0
    assert {shard_of[ids == str(c)][0] for c, _ in planted["exact"]} != {0}  # across files


def test_bad_inputs_fail_naming_the_file_and_the_column(tmp_path, ray_local):
    shards, _ = _corpus(tmp_path, shards=3)
    # a text column that the raw file does not have: caught from the footers, before Ray runs
    bad = [shards[0], ShardSource(shards[1].features, shards[1].raw, "body"), shards[2]]
    with pytest.raises(DataContractError, match=r"raw_1\.parquet: column 'body': rule "
                                                r"'column present'.*available columns"):
        deduplicate_ray(bad, **KNOBS)
    # a features file that is not there
    gone = [shards[0], ShardSource(str(tmp_path / "nope.parquet"), shards[1].raw, "text")]
    with pytest.raises(DataContractError, match=r"nope\.parquet: rule 'not a readable parquet"):
        deduplicate_ray(gone, **KNOBS)
    # raw and features files of different lengths
    pq.write_table(pq.read_table(shards[2].raw).slice(0, 5), str(tmp_path / "short.parquet"))
    short = shards[:2] + [ShardSource(shards[2].features, str(tmp_path / "short.parquet"), "text")]
    with pytest.raises(DataContractError, match=r"short\.parquet: column 'text': rule 'raw rows "
                                                r"match the features rows'"):
        deduplicate_ray(short, **KNOBS)
    # a null embedding: found by the Ray task that reads the row group, named as such
    t = pq.read_table(shards[1].features)
    emb = t.column("embedding").to_pylist()
    emb[3] = None
    broken = str(tmp_path / "broken.parquet")
    pq.write_table(t.set_column(2, "embedding", pa.array(emb, pa.list_(pa.float32()))), broken)
    with pytest.raises(DataContractError, match=r"broken\.parquet: column 'embedding': rule "
                                                r"'non-null embeddings'.*row numbers: \[3\]"):
        deduplicate_ray([shards[0], ShardSource(broken)], exact=False, fuzzy=False,
                        shuffle_partitions=1, **KNOBS)
    assert os.path.exists(broken)


def test_ray_dedup_on_a_kmeans_sample_with_capped_clusters_equals_the_embedded_one(
        tmp_path, ray_local):
    """The k-means trained on a sample (fewer rows than remain) and clusters over the cap
    compared in pieces: both engines take the same sample and the same pieces."""
    shards, _ = _corpus(tmp_path)
    knobs = dict(KNOBS, kmeans_sample_rows=150, max_cluster_rows=25)
    local, *_ = _embedded(shards, **knobs)
    dist = deduplicate_ray(shards, shuffle_partitions=2, **knobs)
    assert local.stats["kmeans_sample"] == dist.stats["kmeans_sample"] == 150
    assert local.stats["clusters_capped"] > 0 and local.stats["near_dropped"] > 0
    for a, b in zip(dist.keep, local.keep):
        assert np.array_equal(a, b)
    assert _lineage(dist) == _lineage(local)
