"""Quality scored from text (issue 21 items 1 and 4): the default heuristic separates real text
from damaged text, classifiers by local path (a real fastText model trained here, a real tiny
Hugging Face classifier saved here) sum with weights, names that cannot load offline say how to
provide the model, score_shard resumes from its chunks, the text rules apply, and train_mask
selects from a bare parquet of id and text."""

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask_pipeline.engine import quality as Q
from datamask_pipeline.engine.data import Columns, DataContractError, read_shard


def good_docs(n: int) -> list:
    """Real text: paragraphs of the Python reference manual CPython ships, 3 to a document."""
    from pydoc_data.topics import topics

    paras = [p.strip() for k in sorted(topics) for p in re.split(r"\n\s*\n", topics[k])
             if len(p.split()) >= 15 and not p.startswith(" ")]
    return ["\n\n".join(paras[i:i + 3]) for i in range(0, 3 * n, 3)]


def damaged(docs: list, seed: int = 0) -> list:
    """The same kind of text, damaged: shuffled words, repeated lines, navigation boilerplate,
    keyword lists, in turn."""
    rng = np.random.default_rng(seed)
    out = []
    for i, d in enumerate(docs):
        words = d.split()
        kind = i % 4
        if kind == 0:
            out.append(" ".join(rng.permutation(words)))
        elif kind == 1:
            out.append("\n".join([d.splitlines()[0]] * 12))
        elif kind == 2:
            out.append("\n".join(["Home | About | Contact", "Log in", "Share on Facebook",
                                  words[0] + " " + words[1], "Copyright © 2024", "Next »",
                                  "Privacy Policy", "Read more"]))
        else:
            out.append(", ".join(dict.fromkeys(w.strip(".,:;()").lower() for w in words)))
    return out


def auc(good, bad) -> float:
    g, b = np.asarray(good)[:, None], np.asarray(bad)[None, :]
    return float(((g > b).sum() + 0.5 * (g == b).sum()) / (g.size * b.size))


# ------------------------------------------------------------------ the default scorer
def test_heuristic_separates_real_text_from_damaged_text():
    good = good_docs(40)
    bad = damaged(good_docs(80)[40:])
    s = Q.load_scorer("heuristic")
    assert isinstance(s, Q.HeuristicScorer) and s.name == "heuristic"
    g, b = s.score(good), s.score(bad)
    assert ((0 <= g) & (g <= 1)).all() and ((0 <= b) & (b <= 1)).all()
    assert auc(g, b) > 0.95
    # each kind of damage on its own
    for kind in range(4):
        assert auc(g, b[kind::4]) > 0.9, kind


def test_signals_are_per_document_in_a_batch():
    """The vectorised signals of a batch equal those of each text alone (no leak across
    documents: n-grams, lines and words stay inside their row)."""
    texts = good_docs(3) + damaged(good_docs(7)[3:]) + ["", "one", "a b c d e f", "x\n\nx\nx"]
    batch = Q.signals(texts)
    for i, t in enumerate(texts):
        alone = Q.signals([t])
        for name in batch:
            assert batch[name][i] == pytest.approx(alone[name][0], nan_ok=True), (name, i)
    assert set(batch) == {s.name for s in Q.SIGNALS}


def test_known_signal_values():
    sig = Q.signals(["the cat sat on the mat.\nthe cat sat on the mat.\nthe dog ran",
                     "the of the and a to"], ["en", "en"])
    assert list(sig["word_count"]) == [15, 6]
    assert sig["dup_lines"][0] == pytest.approx(1 / 3)
    assert sig["punct_lines"][0] == pytest.approx(2 / 3)
    # Gopher's rule counts distinct stop words: 'the' and 'of', 'and', 'to'
    assert list(sig["stop_words"]) == [1, 4]
    # under 20 words the word-order signal does not apply
    assert np.isnan(sig["word_order"]).all()


def test_terminal_punctuation_is_fineweb_s_and_full_credit_at_0_12():
    """':' and ')' do not end a sentence (C4, FineWeb); FineWeb keeps a page from 12% of its
    lines ending in terminal punctuation on, and the score gives full credit (>= 0.95) there."""
    lines = ["Options:", "see ls(1)", "It ends here.", "Does it?", "„Zitat“", "終わり。"]
    sig = Q.signals(["\n".join(lines)], ["en"])
    assert sig["punct_lines"][0] == pytest.approx(3 / 6)  # . ? 。 (not : ) or “)
    deg = Q.degrees({**sig, "punct_lines": np.array([0.12])}, ["en"])
    assert deg["punct_lines"][0] == pytest.approx(0.95)
    low = Q.degrees({**sig, "punct_lines": np.array([0.0])}, ["en"])["punct_lines"][0]
    assert low == pytest.approx(0.05)
    # more punctuated lines still rank higher (a continuous degree, no step)
    assert Q.degrees({**sig, "punct_lines": np.array([0.3])}, ["en"])["punct_lines"][0] > 0.95


def test_c4_sentences_counts_end_marks_in_the_lines_c4_keeps():
    """C4's page rule: sentences counted by end marks in the lines it keeps, not the lines that
    mention javascript or a policy phrase, a repeated line once, none with lorem ipsum; across
    the lines of hard-wrapped text too (C4's own line rules, 5 words ending in punctuation, keep
    none of a wrapped paragraph's sentences); off for Chinese or Japanese script."""
    texts = ["It ends here. And here! Does it?\nwait... no end\nsee e.g. ls(1)",
             "We use cookies to improve your experience.\nPrivacy Policy | Terms of Use.\n"
             "Enable JavaScript to view this page.\nOne sentence.\nOne sentence.",
             "A paragraph wrapped at a fixed width: its sentence\nends on a short line.\nThe "
             "next one starts here and\nends here.",
             "Lorem ipsum dolor sit amet. Consectetur adipiscing. Sed do eiusmod.",
             "これは日本語の文章です。二つ目の文です。三つ目です。"]
    got = Q.signals(texts, ["en", "en", "en", "la", "ja"])["c4_sentences"]
    assert list(got[:4]) == [4, 1, 2, 0]  # "e.g. " counts (an end mark, as C4 counts them)
    assert np.isnan(got[4])
    # credit 0.95 at C4's minimum of 3 sentences, 0.5 at 2, 0.05 at 1
    deg = Q.degrees({**Q.signals(texts[:3], ["en"] * 3),
                     "c4_sentences": np.array([3.0, 2.0, 1.0])}, ["en"] * 3)["c4_sentences"]
    assert list(np.round(deg, 3)) == [0.95, 0.5, 0.05]


def test_web_boilerplate_around_one_sentence_scores_lower_and_wrapped_text_does_not():
    """Issue 25's Facility selection took web-boilerplate pages (navigation, cookie and
    copyright lines around one real sentence) that scored 0.76 and 0.91: short and repeated
    lines were their only weak signals. C4's sentence rule finds two sentences in such a page
    (the real one and the copyright line): it now scores below 0.9 (0.92 without the rule),
    while no document of the Python reference manual (hard-wrapped, 3 paragraphs) loses more
    than 0.005."""
    good = good_docs(40)
    sentence = re.split(r"(?<=[.!?])\s+", " ".join(good[5].split()))[1]
    nav = ["Privacy Policy | Terms of Use | Sitemap", "Leave a comment", "Back to top",
           "We use cookies to improve your experience. Accept all cookies", "Log in",
           "Share on Twitter", "Copyright © 2024 All rights reserved.", "Posted by admin",
           "We use cookies to improve your experience. Accept all cookies",
           "Click here to subscribe", "Email this page"]
    page = "\n".join(nav[:6] + [sentence] + nav[6:])
    texts = [page] + good
    langs = Q.detect_languages(texts)
    sig = Q.signals(texts, langs)
    assert sig["c4_sentences"][0] == 2
    deg = Q.degrees(sig, langs)
    without = Q.combine(deg, names=[n for n in Q.DEFAULT_SIGNALS if n != "c4_sentences"])
    score = Q.HeuristicScorer().score(texts)
    assert without[0] > 0.9 > score[0]
    assert (sig["c4_sentences"][1:] >= 3).all()
    assert (score[1:] >= without[1:] - 0.005).all()


def test_thresholds_table_cites_a_source_for_every_row():
    rows = Q.THRESHOLDS
    assert {t.signal for t in rows} == set(Q.SIGNAL_BY_NAME)
    for s in Q.SIGNALS:  # a row for any language
        assert any(t.signal == s.name and t.languages == "*" for t in rows), s.name
    for t in rows:
        assert t.source.strip() and (t.source.startswith(("Gopher", "C4", "FineWeb", "ours",
                                                          "no "))), t
    from datamask_pipeline.engine import quality_signals as S

    # FineWeb-2's per-language values are used: German's duplicate-line cap is 0.263
    (de,) = [t for t in rows if t.signal == "dup_lines" and t.languages == "de"]
    assert de.good == 0.263 and "deu_Latn" in de.source
    assert S.STOP_WORDS["en"] == ("the", "be", "to", "of", "and", "that", "have", "with")


def test_a_signal_that_does_not_apply_costs_nothing():
    deg = {"a": np.array([0.9, 0.9]), "b": np.array([np.nan, 0.1])}
    for how in Q.COMBINATIONS:
        s = Q.combine(deg, how, ["a", "b"])
        assert s[0] == pytest.approx(Q.combine({"a": deg["a"]}, how, ["a"])[0])
        assert s[1] < s[0]


def test_language_detection_is_py3langid_s():
    """The batched detector gives py3langid's own labels on the same characters."""
    import py3langid

    from datamask_pipeline.engine import quality_signals as S

    texts = good_docs(20) + ["Der Hund läuft über die Straße, weil die Sonne scheint.",
                             "Le chat dort sur le canapé pendant que la pluie tombe.",
                             "El perro corre por la calle porque hace sol hoy.",
                             "これは日本語の文章です。", "ЭТО ТЕКСТ НА РУССКОМ ЯЗЫКЕ"]
    got = Q.detect_languages(texts)
    ident = S._identifier()
    want = [py3langid.classify(ident.encode(t).decode())[0] for t in texts]
    assert list(got) == want
    assert list(got[-5:]) == ["de", "fr", "es", "ja", "ru"]
    assert Q.detect_languages([""])[0] == "und"  # no feature: no language


def test_scores_spread_and_rarely_tie():
    """A continuous score: no real document at exactly 1.0 (the English-only score gave 44% of
    real documents exactly 1.0), and nearly every score distinct."""
    g = Q.HeuristicScorer().score(good_docs(60))
    assert (g == 1.0).mean() == 0.0
    assert len(np.unique(g)) >= 0.95 * len(g)


def test_shuffled_words_score_low():
    """Word order: the same words shuffled score below every real document they came from."""
    good = good_docs(30)
    rng = np.random.default_rng(3)
    shuffled = [" ".join(rng.permutation(d.split())) for d in good]
    s = Q.HeuristicScorer()
    g, b = s.score(good), s.score(shuffled)
    assert auc(g, b) >= 0.95
    # the word-order signal on its own (the English-only score had no such signal: shuffled
    # words kept every other signal's value)
    w = Q.signals(good + shuffled)["word_order"]
    assert not np.isnan(w).any()
    assert auc(-w[:30], -w[30:]) >= 0.9


def _man_pages(lang: str, n: int) -> list:
    from bench.quality import man_docs

    docs = man_docs(n, 0, lang=lang)
    if len(docs) < n // 2:
        pytest.skip(f"needs man pages in {lang!r} under /usr/share/man (and `man`): found "
                    f"{len(docs)}")
    return docs


@pytest.mark.parametrize("lang", ["de", "fr", "es"])
def test_real_pages_in_other_languages_score_like_english_ones(lang):
    """Issue 25: real man pages in German, French and Spanish scored a median 0.36-0.53 where
    English ones scored 0.98. Now each language's median is within 0.05 of English's, and real
    pages separate from damaged copies of the same language at AUC >= 0.9."""
    from bench.quality import BAD_KINDS, make_bad

    en, other = _man_pages("en", 24), _man_pages(lang, 24)
    s = Q.HeuristicScorer()
    g_en, g = s.score(en), s.score(other)
    assert abs(np.median(g) - np.median(g_en)) <= 0.05, (np.median(g), np.median(g_en))
    rng = np.random.default_rng(0)
    bad = [make_bad(other[(i + 5) % len(other)], BAD_KINDS[i % len(BAD_KINDS)], rng)
           for i in range(len(other))]
    assert auc(g, s.score(bad)) >= 0.9
    # the language is a column of the score's results
    _, langs = s.score_languages(other)
    assert (langs == lang).mean() >= 0.5


# ------------------------------------------------------------------ classifiers
def _fasttext_model(tmp_path):
    fasttext = pytest.importorskip("fasttext")  # pip install fasttext-wheel (the quality extra)
    good, bad = good_docs(60), damaged(good_docs(120)[60:])
    lines = [f"__label__hq {d}" for d in good] + [f"__label__cc {d}" for d in bad]
    train = tmp_path / "train.txt"
    train.write_text("\n".join(x.replace("\n", " ") for x in lines) + "\n")
    model = fasttext.train_supervised(str(train), epoch=25, lr=0.5, wordNgrams=2, seed=1,
                                      thread=1, verbose=0)
    path = tmp_path / "quality.bin"
    model.save_model(str(path))
    return path


def test_fasttext_model_by_path_and_weighted_sum(tmp_path):
    path = _fasttext_model(tmp_path)
    ft = Q.load_scorer(f"fasttext:{path}#__label__hq")
    assert isinstance(ft, Q.FastTextScorer) and ft.label == "__label__hq"
    texts = good_docs(10) + damaged(good_docs(20)[10:])
    p = ft.score(texts)
    assert ((0 <= p) & (p <= 1)).all() and p[:10].mean() > p[10:].mean()
    import fasttext

    ref = fasttext.load_model(str(path))
    # (the list form: fasttext-wheel 0.9.2's single-string predict fails under numpy 2)
    (lab,), (prob,) = ref.predict([texts[0].replace("\n", " ")], k=2)
    assert p[0] == pytest.approx(float(prob[list(lab).index("__label__hq")]), abs=1e-6)

    both = Q.load_scorer(f"heuristic=0.5,fasttext:{path}#__label__hq=2")
    assert isinstance(both, Q.WeightedScorer)
    h = Q.HeuristicScorer().score(texts)
    np.testing.assert_allclose(both.score(texts), 0.5 * h + 2 * p, rtol=1e-12)
    assert both.name == f"0.5*heuristic + 2*fasttext:quality.bin#__label__hq"
    # weights, scorers and their versions are in the key
    assert len({both.key, ft.key, Q.load_scorer(f"heuristic=1,fasttext:{path}=2").key,
                Q.HeuristicScorer().key}) == 4
    with pytest.raises(Q.ScorerError, match="has no label '__label__nope'"):
        Q.load_scorer(f"fasttext:{path}#__label__nope")


def _hf_model(tmp_path, num_labels: int):
    transformers = pytest.importorskip("transformers")  # pip install transformers
    import torch

    words = sorted({w.strip(".,:;()").lower() for d in good_docs(30) for w in d.split()})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [w for w in words if w][:500]
    d = tmp_path / f"hf{num_labels}"
    d.mkdir()
    (d / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = transformers.BertTokenizerFast(vocab_file=str(d / "vocab.txt"))
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32,
                                  num_labels=num_labels,
                                  id2label={i: f"L{i}" for i in range(num_labels)},
                                  label2id={f"L{i}": i for i in range(num_labels)})
    model = transformers.BertForSequenceClassification(cfg).eval()
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return d, model, tok


@pytest.mark.parametrize("num_labels", [1, 3])
def test_hugging_face_classifier_by_local_directory(tmp_path, num_labels):
    import torch

    d, model, tok = _hf_model(tmp_path, num_labels)
    spec = f"hf:{d}" + ("" if num_labels == 1 else "#L1")
    s = Q.load_scorer(spec)
    assert isinstance(s, Q.HFClassifierScorer)
    texts = good_docs(5)
    with torch.inference_mode():
        logits = model(**tok(texts, truncation=True, padding=True, max_length=512,
                             return_tensors="pt")).logits
    want = logits[:, 0] if num_labels == 1 else torch.softmax(logits, 1)[:, 1]
    np.testing.assert_allclose(s.score(texts), want.numpy(), rtol=1e-5, atol=1e-6)
    w = Q.load_scorer(f"{spec}=0.3,heuristic=1")
    np.testing.assert_allclose(w.score(texts), 0.3 * s.score(texts)
                               + Q.HeuristicScorer().score(texts), rtol=1e-9)


def test_names_that_cannot_load_offline_say_how_to_provide_the_model(tmp_path):
    with pytest.raises(Q.ScorerError) as e:
        Q.load_scorer("fasttext:mlfoundations/dclm-fasttext")
    assert "not a local file" in str(e.value) and "fasttext:/path/to/model.bin" in str(e.value)
    pytest.importorskip("transformers")
    with pytest.raises(Q.ScorerError) as e:
        Q.load_scorer("hf:HuggingFaceFW/fineweb-edu-classifier")
    msg = str(e.value)
    assert "cannot be loaded offline" in msg
    assert "huggingface-cli download HuggingFaceFW/fineweb-edu-classifier --local-dir DIR" in msg
    assert "hf:DIR" in msg
    for spec in ("dclm", "fineweb-edu", "fasttext", "heuristic:x"):
        with pytest.raises(Q.ScorerError, match="never downloaded, so a name must be a local"):
            Q.load_scorer(spec)
    with pytest.raises(Q.ScorerError, match="weight after '=' must be a number"):
        Q.load_scorer("heuristic=lots")
    with pytest.raises(Q.ScorerError, match="empty quality scorer spec"):
        Q.load_scorer(" ")
    # a file that is not a fastText model
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"not a model")
    pytest.importorskip("fasttext")
    with pytest.raises(Q.ScorerError, match="cannot be loaded"):
        Q.load_scorer(f"fasttext:{bad}")


# ------------------------------------------------------------------ shards
def _id_text(path, texts, ids=None):
    ids = np.arange(len(texts)) + 100 if ids is None else ids
    pq.write_table(pa.table({"chunk_id": pa.array(ids), "text": pa.array(texts)}), path)
    return path


def test_score_shard_resumes_from_its_chunks(tmp_path):
    texts = good_docs(30) + damaged(good_docs(60)[30:])
    raw = _id_text(tmp_path / "s.parquet", texts)
    ck = tmp_path / "ck"
    first = Q.score_shard(raw, ck, chunk_rows=16, id_column="chunk_id")
    assert (first.computed, first.reused, len(first.chunks)) == (4, 0, 4)
    np.testing.assert_array_equal(first.scores, Q.HeuristicScorer().score(texts))
    # a kill after some chunks: the rerun computes only the missing ones
    import os

    os.remove(first.chunks[2])
    again = Q.score_shard(raw, ck, chunk_rows=16, id_column="chunk_id")
    assert (again.computed, again.reused) == (1, 3)
    np.testing.assert_array_equal(again.scores, first.scores)
    assert again.data_version == first.data_version
    # another scorer: other chunks, another data version
    other = Q.score_shard(raw, ck, scorer=Q.load_scorer("heuristic=2"), chunk_rows=16)
    assert other.computed == 4 and other.data_version != first.data_version
    np.testing.assert_allclose(other.scores, 2 * first.scores)
    md = first.metadata()
    assert md["quality_scorer"] == "heuristic" and md["quality_scorer_version"].startswith(
        Q.HEURISTIC_VERSION + "+")


def test_read_shard_scores_a_bare_id_and_text_parquet(tmp_path):
    texts = good_docs(20) + damaged(good_docs(40)[20:])
    raw = _id_text(tmp_path / "s.parquet", texts)
    shard = read_shard(raw)
    assert shard.n == 40 and shard.d == 256
    np.testing.assert_array_equal(shard.quality, Q.HeuristicScorer().score(texts))
    assert shard.scored.scorer == "heuristic" and shard.embedded is not None
    # a shard with embeddings and text but no quality: scored, embeddings read as they are
    emb = np.random.default_rng(0).normal(size=(40, 8)).astype(np.float32)
    t = pq.read_table(raw).append_column(
        "feature_arr", pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 8))
    pq.write_table(t, tmp_path / "e.parquet")
    shard = read_shard(tmp_path / "e.parquet")
    assert shard.embedded is None and shard.scored is not None and shard.d == 8
    np.testing.assert_array_equal(shard.quality, Q.HeuristicScorer().score(texts))
    # with its quality column the text is never scored
    t = t.append_column("quality_score", pa.array(np.linspace(0, 1, 40)))
    pq.write_table(t, tmp_path / "q.parquet")
    shard = read_shard(tmp_path / "q.parquet")
    assert shard.scored is None and shard.quality[-1] == 1.0
    # quality_from_text off: the quality column is required
    with pytest.raises(DataContractError, match="rule 'column present'") as e:
        read_shard(raw, Columns(quality_from_text=False))
    assert e.value.column == "quality_score"


@pytest.mark.parametrize("value, rule", [
    (None, "non-null text"),
    ("", "non-blank text"),
    ("  \n\t ", "non-blank text"),
    (b"\xff\xfe not utf-8", "text is valid UTF-8"),
])
def test_text_rules_apply_when_quality_is_scored(tmp_path, value, rule):
    """Null, empty, whitespace-only and non-UTF-8 text are refused by their named rule, naming
    the row's id, before any score is computed (the documented policy: rejected, never
    scored 0 and never dropped)."""
    texts = good_docs(4)
    binary = isinstance(value, bytes)
    col = [t.encode() for t in texts] + [value] if binary else texts + [value]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"chunk_id": pa.array([1, 2, 3, 4, 77]),
                             "text": pa.array(col, pa.binary() if binary else pa.string())}),
                   path)
    with pytest.raises(DataContractError) as e:
        Q.score_shard(path, tmp_path / "ck", id_column="chunk_id")
    assert e.value.rule == rule and e.value.ids == [77]
    with pytest.raises(DataContractError) as e:
        read_shard(path)
    assert e.value.rule == rule and e.value.ids == [77]


# ------------------------------------------------------------------ train_mask
def test_train_mask_selects_from_id_and_text(tmp_path, capsys):
    from datamask_pipeline.engine.cli import main

    good, bad = good_docs(40), damaged(good_docs(80)[40:])
    raw = _id_text(tmp_path / "in.parquet", good + bad)
    out = tmp_path / "out.parquet"
    rc = main(["--input", str(raw), "--output", str(out), "--select_ratio", "0.25",
               "--solver", "auto", "--lamb", "1", "--no-progress", "--algorithm", "Pair_simi",
               "--quality-checkpoint", str(tmp_path / "qck")])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    sel = pq.read_table(out)
    assert sel.num_rows == summary["k"] == 20 and sel.schema.names == ["chunk_id", "text"]
    # quality top-k takes only real documents (ids 100..139)
    assert all(i < 140 for i in sel.column("chunk_id").to_pylist())
    assert summary["quality"]["quality_scorer"] == "heuristic"
    assert summary["quality"]["quality_chunks_computed"] == 1
    # a rerun with the same checkpoint reuses the scores
    assert main(["--input", str(raw), "--output", str(out), "--select_ratio", "0.25",
                 "--solver", "auto", "--lamb", "1", "--no-progress",
                 "--quality-checkpoint", str(tmp_path / "qck")]) == 0
    assert json.loads(capsys.readouterr().out)["quality"]["quality_chunks_reused"] == 1
    # a model that cannot load: exit 2, the reason on stderr
    rc = main(["--input", str(raw), "--output", str(out), "--no-progress",
               "--quality-scorer", "fasttext:/models/dclm.bin"])
    assert rc == 2
    assert "fasttext:/path/to/model.bin" in capsys.readouterr().err
    # '' requires the quality column
    assert main(["--input", str(raw), "--output", str(out), "--no-progress",
                 "--quality-scorer", ""]) == 2
    assert "rule 'column present'" in capsys.readouterr().err
