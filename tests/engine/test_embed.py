"""Text-only shards: the default embedding model (offline), embed_shard (chunks, resume, data
version), the text rules of the contract, and train_mask on a text-only shard (subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.ingest import write_features
from datamask_pipeline.engine import contract as C
from datamask_pipeline.engine import embed
from datamask_pipeline.engine.data import Columns, DataContractError, read_shard

from .text_corpus import text_shard

REPO = Path(__file__).resolve().parents[2]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def model() -> embed.Embedder:
    return embed.load_embedder()


@pytest.fixture
def shard(tmp_path) -> str:
    path = str(tmp_path / "text_only.parquet")
    pq.write_table(text_shard(), path, row_group_size=70)  # row groups unlike the chunks
    return path


class Counting(embed.Embedder):
    """A real embedder that counts the texts it embedded (to see what a rerun recomputes)."""

    def __init__(self, inner: embed.Embedder):
        self.inner, self.texts = inner, 0
        self.name, self.version, self.dim = inner.name, inner.version, inner.dim
        self.max_tokens, self.pooling = inner.max_tokens, inner.pooling

    def encode(self, texts):
        self.texts += len(texts)
        return self.inner.encode(texts)


# ------------------------------------------------------------------ the default model
def test_default_model_runs_offline_without_any_network():
    """A fresh process with the hub variables set offline and every socket connection
    refused loads wordllama from its package and embeds."""
    code = textwrap.dedent("""
        import socket
        def refuse(*a, **k):
            raise OSError("network disabled by the test")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        from datamask_pipeline.engine.embed import load_embedder
        m = load_embedder()
        v = m.embed(["Bake the bread.", "A quasar is bright."])
        print(m.name, m.dim, m.max_tokens, v.shape, v.dtype)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, **OFFLINE}, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["wordllama/l2_supercat", "256", "512", "(2,", "256)", "float32"]


def test_default_model_matches_wordllamas_own_loop(model):
    """Same vectors as WordLlama's reference inference (normalised), for short texts."""
    from wordllama import WordLlama

    pkg = Path(embed._import_wordllama().__file__).parent
    ref = WordLlama.load(cache_dir=pkg, disable_download=True)
    texts = text_shard().column("text").to_pylist()
    np.testing.assert_allclose(model.embed(texts), ref.embed(texts, norm=True), atol=1e-6)
    norms = np.linalg.norm(model.embed(texts), axis=1)
    np.testing.assert_allclose(norms, 1.0, atol=1e-5)


def test_default_model_is_mit_and_ships_in_the_wheel():
    from importlib.metadata import metadata

    assert metadata("wordllama")["License"].startswith("MIT License")
    pkg = Path(embed._import_wordllama().__file__).parent
    weights = pkg / "weights" / "l2_supercat_256.safetensors"
    assert weights.stat().st_size < 17_000_000
    assert (pkg / "tokenizers" / "l2_supercat_tokenizer_config.json").exists()


def test_import_leaves_the_root_logger_alone():
    code = ("import logging; h = list(logging.getLogger().handlers); "
            "from datamask_pipeline.engine.embed import load_embedder; load_embedder(); "
            "print(logging.getLogger().handlers == h, logging.getLogger().level)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, **OFFLINE}, timeout=120)
    assert out.stdout.split() == ["True", "30"], out.stderr


def test_long_texts_are_truncated_at_max_tokens_or_pooled_by_windows(model):
    head = "The telescope points at the Andromeda galaxy tonight. " * 60
    tail = "Knead the dough and bake the bread in a hot oven. " * 400
    long_text = head + tail
    n_head = len(model._tok.encode(head, add_special_tokens=False).ids)
    assert n_head >= model.max_tokens  # the first 512 tokens are all astronomy
    enc = model.encode([long_text, "A short sentence."])
    assert enc.truncated.tolist() == [True, False]
    assert enc.tokens[0] > model.max_tokens
    # truncate: exactly the embedding of the first max_tokens tokens
    ids = model._tok.encode(long_text, add_special_tokens=False).ids[:model.max_tokens]
    first = model._table[ids].mean(axis=0)
    np.testing.assert_allclose(enc.vectors[0], first / np.linalg.norm(first), atol=1e-5)
    # chunks: the bread part counts too, so the vector moves towards a bread sentence
    chunks = embed.load_embedder(pooling="chunks")
    assert chunks.key != model.key
    bread = model.embed(["Knead the dough and bake the bread in a hot oven."])[0]
    v_chunks = chunks.embed([long_text])[0]
    assert float(v_chunks @ bread) > float(enc.vectors[0] @ bread) + 0.2


def test_matryoshka_dims_and_bad_names():
    small = embed.load_embedder("wordllama:64")
    assert small.dim == 64 and small.embed(["A comet has a tail."]).shape == (1, 64)
    with pytest.raises(embed.EmbedderError, match="wordllama dim must be one of"):
        embed.load_embedder("wordllama:100")
    with pytest.raises(embed.EmbedderError, match="pooling must be one of"):
        embed.load_embedder(pooling="max")


def test_another_model_is_a_sentence_transformers_model():
    """Any other name goes to sentence-transformers: a missing local directory fails with a
    clear message (sentence-transformers itself is untested here: no model can be fetched)."""
    with pytest.raises(embed.EmbedderError, match="sentence-transformers|cannot be loaded"):
        embed.load_embedder("/nonexistent/model-dir")


# ------------------------------------------------------------------ embed_shard
def test_embed_shard_chunks_and_data_version(shard, tmp_path, model):
    seen = []
    r = embed.embed_shard(shard, tmp_path / "ck", embedder=model, id_column="chunk_id",
                          chunk_rows=100, progress=seen.append)
    assert (r.rows, r.dim, r.computed, r.reused, len(r.chunks)) == (320, 256, 4, 0, 4)
    assert [p.rows_done for p in seen] == [100, 200, 300, 320]
    texts = pq.read_table(shard).column("text").to_pylist()
    np.testing.assert_allclose(r.load(), model.embed(texts), atol=1e-6)
    assert r.tokens > 320 and r.truncated_rows == 0
    assert all(str(tmp_path / "ck" / model.key) in c for c in r.chunks)
    # the data version: text content x model; chunk size does not enter it
    again = embed.embed_shard(shard, tmp_path / "ck2", embedder=model, chunk_rows=64)
    assert (again.text_sha256, again.data_version) == (r.text_sha256, r.data_version)
    other = embed.embed_shard(shard, tmp_path / "ck3", embedder=embed.load_embedder("wordllama:64"))
    assert other.text_sha256 == r.text_sha256 and other.data_version != r.data_version
    t = pq.read_table(shard)
    edited = t.set_column(3, "text", pa.array(["Roast the peppers."] + texts[1:]))
    pq.write_table(edited, tmp_path / "edited.parquet")
    e = embed.embed_shard(tmp_path / "edited.parquet", tmp_path / "ck", embedder=model,
                          chunk_rows=100)
    assert e.text_sha256 != r.text_sha256 and (e.computed, e.reused) == (1, 3)


def test_embed_shard_resumes_after_a_kill(shard, tmp_path, model):
    """A run killed after its second chunk: the rerun embeds only the chunks not written."""
    ck = tmp_path / "ck"

    def kill_after_two(p):
        if p.chunks_done == 2:
            raise KeyboardInterrupt("killed")

    first = Counting(model)
    with pytest.raises(KeyboardInterrupt):
        embed.embed_shard(shard, ck, embedder=first, chunk_rows=100, progress=kill_after_two)
    assert first.texts == 200
    assert len(list((ck / model.key).glob("chunk-*.npz"))) == 2
    second = Counting(model)
    r = embed.embed_shard(shard, ck, embedder=second, chunk_rows=100)
    assert second.texts == 120 and (r.computed, r.reused) == (2, 2)
    texts = pq.read_table(shard).column("text").to_pylist()
    np.testing.assert_allclose(r.load(), model.embed(texts), atol=1e-6)
    # no temp file left behind by the interrupted writes
    assert not [p for p in ck.rglob("*") if ".tmp-" in p.name]


# ------------------------------------------------------------------ the contract
def _text_table(text: pa.Array, n=None) -> pa.Table:
    n = len(text)
    return pa.table({"chunk_id": pa.array(np.arange(n) + 10), "quality_score": pa.array(
        np.linspace(0, 1, n)), "text": text})


GOOD = ["Bake the bread.", "Jupiter has many moons.", "Whisk the eggs.", "Mars is red."]
INVALID = pa.Array.from_buffers(pa.string(), 4, pa.array(
    [b"Bake the bread.", b"\xff\xfe bad", b"Whisk the eggs.", b"Mars \xc3"], pa.binary()).buffers())
TEXT_CASES = [
    ("null", pa.array([GOOD[0], None, GOOD[2], None]), C.TEXT_NULL.name, [11, 13]),
    ("empty", pa.array([GOOD[0], "", GOOD[2], GOOD[3]]), C.TEXT_BLANK.name, [11]),
    ("whitespace", pa.array([" \n\t", GOOD[1], GOOD[2], "   "]), C.TEXT_BLANK.name, [10, 13]),
    ("binary_invalid_utf8", pa.array([g.encode() for g in GOOD[:3]] + [b"\x80abc"], pa.binary()),
     C.TEXT_UTF8.name, [13]),
    ("string_invalid_utf8", INVALID, C.TEXT_UTF8.name, [11, 13]),
    ("integer_text", pa.array([1, 2, 3, 4]), C.TEXT_TYPE.name, []),
]


@pytest.mark.parametrize("name, text, rule, ids", TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_text_rules_name_the_rows(tmp_path, model, name, text, rule, ids):
    """The engine's reader and the pipeline's ingestion reject the shard under the same rule,
    naming the text column and the offending ids; no zero vector is ever produced."""
    raw = str(tmp_path / "raw.parquet")
    pq.write_table(_text_table(text), raw)
    with pytest.raises(DataContractError) as ei:
        read_shard(raw, embedder=model)
    assert (ei.value.rule, ei.value.column, ei.value.ids) == (rule, "text", ids), str(ei.value)
    with pytest.raises(DataContractError) as ei2:
        write_features(raw, str(tmp_path / "f.parquet"), Columns(), embedder=model,
                       checkpoint_dir=str(tmp_path / "ck"))
    assert str(ei2.value) == str(ei.value)
    assert not (tmp_path / "f.parquet").exists()


def test_valid_binary_text_is_decoded(tmp_path, model):
    raw = str(tmp_path / "raw.parquet")
    pq.write_table(_text_table(pa.array([g.encode() for g in GOOD], pa.binary())), raw)
    s = read_shard(raw, embedder=model)
    np.testing.assert_allclose(s.embeddings, model.embed(GOOD), atol=1e-6)


def test_neither_embeddings_nor_text_fails_once_naming_both(tmp_path):
    raw = str(tmp_path / "raw.parquet")
    pq.write_table(_text_table(pa.array(GOOD)).rename_columns(["chunk_id", "quality_score", "body"]), raw)
    expected = ("column 'feature_arr': rule 'column present' broken; neither the embedding column "
                "'feature_arr' nor a text column 'text' to compute embeddings from exists; "
                "available columns: ['chunk_id', 'quality_score', 'body']")
    with pytest.raises(DataContractError) as ei:
        read_shard(raw)
    assert str(ei.value) == f"{raw}: {expected}"
    with pytest.raises(DataContractError) as ei2:
        write_features(raw, str(tmp_path / "f.parquet"), Columns())
    assert str(ei2.value) == f"{raw}: {expected}"
    # and the named text column is used when it exists
    s = read_shard(raw, columns=Columns(text="body"))
    assert s.embedded.rows == 4 and s.d == 256


def test_shard_with_embeddings_never_reads_its_text(tmp_path):
    """The embedding column wins: a shard carrying embeddings is read as before, its text
    (here invalid) untouched."""
    raw = str(tmp_path / "raw.parquet")
    t = _text_table(INVALID).append_column(
        "feature_arr", pa.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 1.0]]))
    pq.write_table(t, raw)
    s = read_shard(raw)
    assert s.embedded is None and s.d == 2


def test_expected_dim_follows_the_model(tmp_path, model):
    raw = str(tmp_path / "raw.parquet")
    pq.write_table(_text_table(pa.array(GOOD)), raw)
    assert read_shard(raw, expected_dim=256, embedder=model).d == 256
    with pytest.raises(DataContractError, match="rule 'embedding dimension 768' broken; the "
                                                "embedding model wordllama/l2_supercat gives 256-d"):
        read_shard(raw, expected_dim=768, embedder=model)


def test_readme_lists_the_text_rules():
    from tests.doc_pages import page

    assert C.text_contract_table_markdown() in page("text.md")


# ------------------------------------------------------------------ train_mask, subprocess
def _train_mask(tmp_path, raw, *extra):
    out = str(tmp_path / "out.parquet")
    cmd = [sys.executable, "-m", "datamask_pipeline.engine.cli", "--input", raw, "--output", out,
           "--profile", "pipeline", "--device", "cpu", "--select_ratio", "0.1",
           "--n_epochs", "60", "--algorithm", "Facility", "--no-progress", *extra]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, **OFFLINE, "OMP_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), pq.read_table(out)


def test_train_mask_selects_from_a_text_only_shard(tmp_path, shard, model):
    raw = pq.read_table(shard)
    summary, out = _train_mask(tmp_path, shard)
    k = round(0.1 * raw.num_rows)
    assert summary["k"] == k == out.num_rows and summary["d"] == 256
    assert out.schema == raw.schema  # every input column, no embedding column
    assert summary["embedding"]["embedding_model"] == "wordllama/l2_supercat"
    # quality favours cooking: quality top-k is cooking only; the selection is more diverse
    # on the term's own whole-shard measure and reaches the other topics
    obj = summary["objective"]
    assert obj["selection"]["f_div"] > obj["quality_topk"]["f_div"] + 0.05
    assert obj["selection"]["f"] > obj["quality_topk"]["f"]
    q = raw.column("quality_score").to_numpy()
    topics = np.array(raw.column("topic").to_pylist())
    assert set(topics[np.argsort(-q)[:k]]) == {"cooking"}
    assert len(set(out.column("topic").to_pylist())) >= 2

    ck = str(tmp_path / "embed-ck")
    _train_mask(tmp_path, shard, "--embed-checkpoint", ck)
    summary2, out2 = _train_mask(tmp_path, shard, "--write-embeddings", "--embed-checkpoint", ck)
    assert (summary2["embedding"]["embedding_chunks_reused"],
            summary2["embedding"]["embedding_chunks_computed"]) == (1, 0)
    assert out2.schema.names == raw.schema.names + ["feature_arr"]
    assert out2.drop_columns(["feature_arr"]).equals(out)
    emb = np.stack(out2.column("feature_arr").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(emb, model.embed(out.column("text").to_pylist()), atol=1e-6)


def test_train_mask_bad_text_exits_2(tmp_path):
    raw = str(tmp_path / "raw.parquet")
    pq.write_table(_text_table(pa.array([GOOD[0], "", GOOD[2], GOOD[3]])), raw)
    p = subprocess.run([sys.executable, "-m", "datamask_pipeline.engine.cli", "--input", raw,
                        "--output", str(tmp_path / "o.parquet"), "--no-progress"], cwd=REPO,
                       capture_output=True, text=True, timeout=120, env={**os.environ, **OFFLINE})
    assert p.returncode == 2
    assert "column 'text': rule 'non-blank text' broken by 1 row; ids: [11]" in p.stderr


# ------------------------------------------------------------------ language geometry
def test_language_centering_takes_each_language_mean_out():
    """Two languages the model puts in two regions (a shared offset each, plus content): after
    centering, rows of different languages are no further apart than rows of one language, and
    every vector is unit length and finite; a rare language is pooled, a lone row keeps its
    vector (never a zero vector), identical rows stay identical."""
    rng = np.random.default_rng(0)
    d = 32
    off = {"en": rng.normal(size=d) * 3, "de": rng.normal(size=d) * 3}
    langs = ["en"] * 40 + ["de"] * 20 + ["fr"] * 3 + ["xx"]
    x = np.stack([off.get(lg, np.zeros(d)) + rng.normal(size=d) for lg in langs])
    x[1] = x[0]
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    # in pieces, as the checkpoint chunks arrive
    lc = embed.language_centering([x[:25], x[25:50], x[50:]], langs, min_rows=8)
    assert lc.counts == {"en": 40, "de": 20, embed.RARE: 4}
    y = np.concatenate([lc.apply(x[:30], 0), lc.apply(x[30:], 30)])
    assert np.isfinite(y).all()
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), 1, atol=1e-5)
    np.testing.assert_array_equal(y[0], y[1])
    en, de = slice(0, 40), slice(40, 60)
    raw_within, raw_across = (x[en] @ x[en].T).mean(), (x[en] @ x[de].T).mean()
    within, across = (y[en] @ y[en].T).mean(), (y[en] @ y[de].T).mean()
    assert raw_within - raw_across > 0.5  # the model's geometry: the language is the main axis
    assert abs(within - across) < 0.05 and abs(across) < 0.05
    # the pooled rare group (4 < 8 rows) is centered by the whole shard's mean
    np.testing.assert_allclose(lc.centroids[embed.RARE], x.mean(0), atol=1e-6)
    # a group of one row: the centered vector would be zero, the model's vector is kept
    one = embed.language_centering([x[:1]], ["en"], min_rows=1)
    np.testing.assert_array_equal(one.apply(x[:1], 0), x[:1])


def test_features_keep_the_model_vectors_and_record_language_sums(tmp_path, model):
    """The features step writes the model's vectors for a text-only shard scored by the
    heuristic, whatever the geometry. With ``center`` (default) its footer records each
    language's vector sum and rows over the shard, by which ``read_shard`` centers the vectors
    (the shard's own means: what the shard's steps read); with ``off`` every reader keeps the
    model's vectors. An unknown geometry is refused before any work."""
    from datamask_pipeline.engine.quality import load_scorer

    en = [f"The {w} manual page explains how the command reads its input and writes the "
          f"result to the standard output, with {i} options." for i, w in
          enumerate(["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth",
                     "ninth", "tenth"])]
    de = [f"Die {w} Handbuchseite erklärt, wie der Befehl seine Eingabe liest und das Ergebnis "
          f"auf die Standardausgabe schreibt, mit {i} Optionen." for i, w in
          enumerate(["erste", "zweite", "dritte", "vierte", "fünfte", "sechste", "siebte",
                     "achte", "neunte", "zehnte"])]
    texts = en + de
    langs = ["en"] * 10 + ["de"] * 10
    raw = str(tmp_path / "raw.parquet")
    pq.write_table(pa.table({"chunk_id": list(range(len(texts))), "text": texts}), raw)
    x = model.embed(texts)
    features = Columns(id="id", quality=("quality",), embedding="embedding")
    read = {}
    for geometry in ("center", "off"):
        f = str(tmp_path / f"{geometry}.parquet")
        info = write_features(raw, f, Columns(), embedder=model, scorer=load_scorer(),
                              checkpoint_dir=str(tmp_path / f"ck-{geometry}"),
                              quality_checkpoint_dir=str(tmp_path / f"q-{geometry}"),
                              language_geometry=geometry)
        t = pq.read_table(f)
        assert t.column("language").to_pylist() == langs
        stored = np.stack(t.column("embedding").to_numpy(zero_copy_only=False))
        np.testing.assert_allclose(stored, x, atol=1e-6)  # the model's vectors either way
        sums = embed.read_language_sums(f)
        assert (sums is None) == (info["language_sums"] is None) == (geometry == "off")
        assert t.schema.metadata[embed.META_GEOMETRY] == geometry.encode()
        read[geometry] = read_shard(f, features).embeddings
    assert sums is None and info["centering"] is None
    sums = embed.read_language_sums(str(tmp_path / "center.parquet"))
    assert sums.counts == {"en": 10, "de": 10}
    np.testing.assert_allclose(sums.sums["de"], x[10:].astype(np.float64).sum(0), atol=1e-5)
    np.testing.assert_array_equal(read["off"], x)
    y = read["center"]
    np.testing.assert_allclose(y, embed.language_centering([x], langs).apply(x), atol=1e-6)
    # in the model, English and German pages are two regions (cosine 0.94 within English,
    # 0.17 across); centered, language no longer separates them
    assert (x[:10] @ x[:10].T).mean() - (x[:10] @ x[10:].T).mean() > 0.5
    assert abs((y[:10] @ y[:10].T).mean() - (y[:10] @ y[10:].T).mean()) < 0.1
    with pytest.raises(embed.ConfigError, match="embedding_language_geometry"):
        write_features(raw, str(tmp_path / "bad.parquet"), Columns(), embedder=model,
                       language_geometry="sideways")
    assert not (tmp_path / "bad.parquet").exists()
