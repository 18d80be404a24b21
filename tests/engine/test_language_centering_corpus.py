"""Language centering that does not depend on how the corpus is cut into files: the features
keep the model's vectors and record each language's sums in their footer
(``engine.embed.LanguageSums``); a shard's own steps center by the shard's means, the corpus
stage (``engine.corpus.shards.open_shards``, the Ray dedup's reader) by the corpus's, summed
from the footers. A features file written before the sums were is read as stored."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.ingest import write_features
from datamask_pipeline.engine import embed
from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.corpus import CorpusBudget, select_corpus
from datamask_pipeline.engine.corpus.dedup_ray import ShardSource, _Cols, _plan, _read_features
from datamask_pipeline.engine.corpus.shards import open_shard, open_shards
from datamask_pipeline.engine.data import Columns, DataContractError, read_shard
from datamask_pipeline.engine.quality import HeuristicScorer
from datamask_pipeline.engine.storage import DataLayout

D = 16
# rows per language: fr and la are rare in some files of the by-language cut or the corpus
ROWS = {"en": 70, "de": 36, "fr": 20, "es": 12, "la": 5, "zz": 3}
FEATURES = Columns(id="id", quality=("quality",), embedding="embedding")
_OFFSETS = {lg: np.random.default_rng(i).normal(size=D) * 2.5 for i, lg in enumerate(ROWS)}


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


class OffsetEmbedder(embed.Embedder):
    """A model that puts each language in its own region, as an English-centric one does:
    the language's offset plus the text's own direction (a text ``"<lang>|..."``)."""

    name, version, dim, max_tokens = "test/offset", "1", D, 512

    def encode(self, texts: list) -> embed.Encoded:
        x = np.stack([_OFFSETS[t.split("|")[0]] + np.random.default_rng(_seed(t)).normal(size=D)
                      for t in texts])
        x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
        n = len(texts)
        return embed.Encoded(x, np.full(n, 8, np.int64), np.zeros(n, bool))


class TaggedScorer(HeuristicScorer):
    """The heuristic's interface, each text's language read from its tag."""

    def score_languages(self, texts):
        texts = texts.to_pylist() if hasattr(texts, "to_pylist") else list(texts)
        q = np.array([0.1 + 0.9 * (_seed(t) % 1000) / 1000 for t in texts])
        return q, np.array([t.split("|")[0] for t in texts], dtype=object)


def _corpus():
    """(ids, texts, languages) in id order."""
    langs = [lg for lg, n in ROWS.items() for _ in range(n)]
    texts = [f"{lg}|document {i}" for i, lg in enumerate(langs)]
    return np.arange(len(texts), dtype=np.int64), texts, np.array(langs, dtype=object)


CUTS = {
    "by_language": lambda langs: {f"lang_{lg}": np.flatnonzero(langs == lg) for lg in ROWS},
    "random": lambda langs: {f"part_{f}": np.flatnonzero(
        np.random.default_rng(7).integers(0, 3, size=langs.size) == f) for f in range(3)},
}


def _ingest(root, files: dict, geometry=None) -> DataLayout:
    """Each file (key: rows of the corpus) a raw shard of id and text, through the features
    step."""
    ids, texts, _ = _corpus()
    layout = DataLayout(str(root))
    model, scorer = OffsetEmbedder(), TaggedScorer()
    for key, rows in files.items():
        raw = layout.raw_shard(key)
        os.makedirs(os.path.dirname(raw), exist_ok=True)
        pq.write_table(pa.table({"chunk_id": ids[rows], "text": [texts[i] for i in rows]}), raw)
        write_features(raw, layout.features(key), Columns(), embedder=model, scorer=scorer,
                       checkpoint_dir=str(root / "ck" / key),
                       quality_checkpoint_dir=str(root / "q" / key), language_geometry=geometry)
    return layout


def _by_id(shards) -> np.ndarray:
    """The loaded vectors of every shard, in id order."""
    parts = [s.load() for s in shards]
    ids = np.concatenate([p.ids for p in parts])
    return np.concatenate([p.embeddings for p in parts])[np.argsort(ids)]


def _model_vectors():
    _, texts, langs = _corpus()
    return OffsetEmbedder().embed(texts), langs


def test_the_corpus_stage_reads_the_same_vectors_and_selects_the_same_rows_on_every_cut(
        tmp_path):
    """One corpus in six languages cut by language (one file each) and at random (3 files):
    the corpus stage's loaders give the same vectors on both cuts (each less its language's
    mean over the whole corpus, la and zz pooled), and gather selects the same rows. A shard's
    own steps center by the shard's means, as the features step did before: those differ by
    cut, which is why the corpus stage does not use them."""
    x, langs = _model_vectors()
    want = embed.LanguageSums.of([x], langs).centering(langs).apply(x)
    cfg = LearnerConfig.profile("pipeline", algorithm="Pair_simi", lamb=0.5)
    vectors, own, selected = {}, {}, {}
    for cut, files_of in CUTS.items():
        files = files_of(langs)
        layout = _ingest(tmp_path / cut, files)
        shards = open_shards(layout, sorted(files))
        assert sorted(shards) == sorted(files) and all(shards.values())
        vectors[cut] = _by_id(shards.values())
        np.testing.assert_allclose(vectors[cut], want, atol=1e-6)
        # a shard's own steps (read_shard without sums): the shard's means, as before
        for key, rows in files.items():
            y = read_shard(layout.features(key), FEATURES).embeddings
            before = embed.language_centering([x[rows]], langs[rows]).apply(x[rows])
            np.testing.assert_allclose(y, before, atol=1e-6)
        own[cut] = _by_id([open_shard(layout, k) for k in sorted(files)])
        res = select_corpus(list(shards.values()), cfg, CorpusBudget.of(select_rows=25),
                            mode="gather")
        assert res.mode == "gather"
        selected[cut] = np.sort(np.concatenate([
            pq.read_table(layout.features(k), columns=["id"]).column("id").to_numpy()[r]
            for k, r in res.selected.items()]))
    np.testing.assert_allclose(vectors["by_language"], vectors["random"], atol=1e-6)
    assert np.array_equal(selected["by_language"], selected["random"]) and selected["random"].size == 25
    # the per-shard means depend on the cut (by language, each file is one language, whose
    # mean is the whole file's)
    assert np.abs(own["by_language"] - own["random"]).max() > 0.1


def test_language_sums_add_up_over_files_and_survive_the_footer():
    """The sums of a corpus's files add up to the corpus's; the footer keeps them exactly; a
    language rare in a file but common in the corpus is its own group in the corpus scope."""
    x, langs = _model_vectors()
    whole = embed.LanguageSums.of([x[:50], x[50:]], langs)
    rows = CUTS["random"](langs)
    parts = [embed.LanguageSums.of([x[r]], langs[r]) for r in rows.values()]
    total = embed.LanguageSums.total([None, *parts])
    assert total.counts == whole.counts == ROWS and total.rows == x.shape[0] and total.dim == D
    for lg in ROWS:
        np.testing.assert_allclose(total.sums[lg], whole.sums[lg], rtol=1e-12, atol=1e-12)
    back = embed.LanguageSums.from_footer(total.footer())
    assert back.counts == total.counts and back.digest() == total.digest()
    assert all(np.array_equal(back.sums[k], total.sums[k]) for k in total.sums)
    assert embed.LanguageSums.total([None]) is None and embed.LanguageSums.from_footer(None) is None
    # es: 12 rows in the corpus, 3 to 5 in each random file
    r = next(iter(rows.values()))
    assert 0 < (langs[r] == "es").sum() < embed.LANGUAGE_MIN_ROWS
    assert set(total.centering(langs[r]).groups.tolist()) == {"en", "de", "fr", "es", embed.RARE}
    assert "es" not in set(parts[0].centering(langs[r]).groups.tolist())
    # pooled: la (5) and zz (3) are rare in the corpus, 8 rows together: their own mean
    c = total.centering(langs)
    pooled = np.isin(langs, ["la", "zz"])
    np.testing.assert_allclose(c.centroids[embed.RARE], x[pooled].mean(0), atol=1e-6)
    assert c.counts[embed.RARE] == 8


def test_geometry_off_and_old_features_are_read_as_stored(tmp_path):
    """``off``: every reader keeps the model's vectors. A features file written before the
    sums were (vectors already centered by the shard's means, no sums in the footer) is read
    as stored, never centered twice, also beside new files in one corpus, whose sums alone
    make the corpus's means."""
    x, langs = _model_vectors()
    files = CUTS["random"](langs)
    off = _ingest(tmp_path / "off", files, geometry="off")
    for key, rows in files.items():
        assert embed.read_language_sums(off.features(key)) is None
        np.testing.assert_array_equal(read_shard(off.features(key), FEATURES).embeddings, x[rows])
    np.testing.assert_array_equal(_by_id(open_shards(off, sorted(files)).values()), x)

    layout = _ingest(tmp_path / "mixed", files)
    old_key = "part_0"
    path = layout.features(old_key)
    t = pq.read_table(path)
    rows = files[old_key]
    centered = embed.language_centering([x[rows]], langs[rows]).apply(x[rows])
    emb = pa.array(list(centered), pa.list_(pa.float32()))
    old = t.set_column(t.schema.get_field_index("embedding"), "embedding", emb)
    pq.write_table(old.replace_schema_metadata(None), path)  # as features-1 wrote it
    assert embed.read_language_sums(path) is None
    np.testing.assert_array_equal(read_shard(path, FEATURES).embeddings, centered)
    shards = open_shards(layout, sorted(files))
    got = {k: s.load().embeddings for k, s in shards.items()}
    np.testing.assert_array_equal(got[old_key], centered)
    new = np.concatenate([r for k, r in files.items() if k != old_key])
    sums = embed.LanguageSums.of([x[new]], langs[new])
    for key in ("part_1", "part_2"):
        r = files[key]
        np.testing.assert_allclose(got[key], sums.centering(langs[r]).apply(x[r]), atol=1e-6)
    # the versions of the centered shards carry the corpus's sums (their vectors change with
    # them); the old one's is its file's
    assert shards["part_1"].version.endswith(f":lang-{sums.digest()}")
    assert ":lang-" not in shards[old_key].version


def test_the_ray_dedup_reads_the_corpus_centered_vectors(tmp_path):
    """The Ray dedup's row-group reader (its plan reads the footers) gives each row the
    vector the corpus stage's loader gives it (no Ray needed to call it)."""
    x, langs = _model_vectors()
    files = CUTS["random"](langs)
    layout = _ingest(tmp_path, files)
    want = {k: s.load().embeddings for k, s in open_shards(layout, sorted(files)).items()}
    sources = [ShardSource(features=layout.features(k)) for k in sorted(files)]
    offsets, items, _, sums = _plan(sources, _Cols(), texts_wanted=False)
    assert sums.counts == ROWS
    got = np.zeros((int(offsets[-1]), D), np.float32)
    for it in items:
        out = _read_features({k: np.array([v]) for k, v in it.items()}, _Cols(), None,
                             language_sums=sums)
        got[out["gid"]] = out["emb"]
    np.testing.assert_allclose(got, np.concatenate([want[k] for k in sorted(files)]), atol=1e-6)


def test_sums_without_the_language_column_are_refused(tmp_path):
    """A footer that records sums needs the rows' languages."""
    _, langs = _model_vectors()
    layout = _ingest(tmp_path, {"a": np.arange(langs.size)})
    t = pq.read_table(layout.features("a"))
    pq.write_table(t.drop_columns(["language"]).replace_schema_metadata(t.schema.metadata),
                   layout.features("a"))
    with pytest.raises(DataContractError, match="language"):
        read_shard(layout.features("a"), FEATURES)
