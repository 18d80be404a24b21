"""Quality scores computed from text, for shards without a quality column (Dagster-free).

A :class:`Scorer` turns texts into one float per text. :func:`load_scorer` names one from a
spec string:

* ``heuristic`` (default): :class:`HeuristicScorer`, offline, CPU, no model: quality signals of
  the kind the Gopher, C4 and FineWeb quality filters use (word count, mean word length,
  alphabetic words, stop words, symbols, bullet / ellipsis lines, lines ending in punctuation,
  duplicate lines and repeated n-grams, plus a word-order signal), each mapped to a pass degree
  in [0, 1] and combined into one score in [0, 1]. Which signals, and how they are combined,
  was chosen by measuring their separation of real text from damaged text (``bench/quality.py``,
  ``bench/results/REPORT_quality.md``).
* ``fasttext:/path/model.bin[#__label__hq]``: a fastText classifier file (e.g. DCLM's
  ``openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin``); the score is the probability of
  the label (default: the model's first label). Needs ``pip install fasttext-wheel``.
* ``hf:/path/to/dir[#LABEL]``: a Hugging Face sequence classifier saved in a local directory
  (e.g. ``HuggingFaceFW/fineweb-edu-classifier`` downloaded with ``huggingface-cli download``);
  a one-output (regression) head gives its raw output, several outputs the softmax probability
  of ``LABEL`` (a label name or index; default the last). Needs ``pip install transformers``.
* Several, comma-separated, each with an optional ``=weight`` (default 1): their weighted sum,
  as the paper sums DCLM + FineWeb-Edu + Wiki scores, e.g.
  ``heuristic=1,fasttext:/models/dclm.bin=1,hf:/models/fineweb-edu=0.2``.

Nothing is downloaded: a name that is not a local file or directory raises
:class:`ScorerError` saying how to provide the model. :func:`score_shard` scores a shard's text
column in chunks written under a checkpoint location (reused after a kill, like the
embeddings' chunks); its data version hashes the text and the scorer's name, version and
settings.
"""

from __future__ import annotations

import abc
import hashlib
import io
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from . import contract as C
from . import storage
from .config import ConfigError

__all__ = ["Scorer", "ScorerError", "HeuristicScorer", "FastTextScorer", "HFClassifierScorer",
           "WeightedScorer", "load_scorer", "parse_spec", "signals", "SIGNALS", "score_shard",
           "QualityResult", "QualityProgress", "DEFAULT_SCORER", "HEURISTIC_VERSION"]

DEFAULT_SCORER = "heuristic"
# Bump when the signals, their ramps or their combination change: it is part of the scorer's
# version, so every features file scored by the old one goes stale.
HEURISTIC_VERSION = "1"
DEFAULT_CHUNK_ROWS = 8192
# Characters of a text that are scored (bounded cost per row; the signals are fractions and
# saturate long before this, except the word count, which counts up to it).
MAX_CHARS = 100_000


class ScorerError(ConfigError):
    """A quality scorer that cannot be loaded or used (raised before any row is scored)."""


# ------------------------------------------------------------------ signals
# Gopher's stop words (Rae et al. 2021: a document must hold at least two of them).
STOP_WORDS = ("the", "be", "to", "of", "and", "that", "have", "with")
# Function words: in English an article is almost never followed by one of these; in a word
# salad (shuffled words, keyword lists) it often is. The word-order signal counts that.
ARTICLES = ("the", "a", "an")
FUNCTION_WORDS = ("the", "a", "an", "of", "to", "and", "in", "is", "that", "for", "it", "on",
                  "was", "with", "as", "be", "by", "at", "or", "are", "this", "from")
BULLETS = r"^\s*([-*•‣◦▪●·–—>]|\d+[.)])\s"
# punctuation stripped from a word's ends before its length and stop-word test
_PUNCT = "\"'()[]{}<>.,;:!?`*_-–—…«»“”‘’/\\|#"


@dataclass(frozen=True)
class Signal:
    """One quality signal: ``bad`` and ``good`` are the values at which its pass degree is 0
    and 1 (a linear ramp between them; ``good < bad`` for a signal where less is better), from
    the published filters' thresholds where they have one (``source``)."""

    name: str
    description: str
    bad: float
    good: float
    source: str

    def degree(self, x: np.ndarray) -> np.ndarray:
        return np.clip((np.asarray(x, np.float64) - self.bad) / (self.good - self.bad), 0.0, 1.0)


SIGNALS = (
    Signal("word_count", "words (whitespace-separated), log-scaled ramp", 10, 50,
           "Gopher: 50 <= words <= 100,000"),
    Signal("mean_word_length", "distance of the mean word length (punctuation trimmed) from "
           "3..10 characters", 2.0, 0.0, "Gopher: 3 <= mean word length <= 10"),
    Signal("alpha_words", "fraction of words with an alphabetic character", 0.5, 0.8,
           "Gopher: >= 80 % of words"),
    Signal("stop_words", "Gopher stop words (the, be, to, of, and, that, have, with) per 100 "
           "words", 0.5, 4.0, "Gopher: >= 2 stop words"),
    Signal("symbol_ratio", "'#' and ellipses ('...', '…') per word", 0.1, 0.02,
           "Gopher: <= 0.1"),
    Signal("bullet_lines", "fraction of non-empty lines starting with a bullet", 0.9, 0.5,
           "Gopher: <= 90 %"),
    Signal("ellipsis_lines", "fraction of non-empty lines ending in an ellipsis", 0.3, 0.1,
           "Gopher: <= 30 %"),
    Signal("punct_lines", "fraction of non-empty lines ending in terminal punctuation "
           "(. ! ? : \" ')", 0.1, 0.4, "C4 keeps only such lines; FineWeb: >= 12 %"),
    Signal("short_lines", "fraction of non-empty lines under 30 characters", 0.8, 0.5,
           "FineWeb: <= 67 %"),
    Signal("dup_lines", "fraction of non-empty lines that repeat an earlier line", 0.3, 0.05,
           "Gopher: <= 30 %; FineWeb: <= 10 % of characters"),
    Signal("top_2gram", "share of the word 2-grams taken by the most frequent one", 0.2, 0.05,
           "Gopher: <= 20 % (by characters)"),
    Signal("dup_5gram", "fraction of word 5-grams that occur more than once", 0.5, 0.15,
           "Gopher: <= 15 % (by characters)"),
    Signal("article_function", "fraction of articles (the, a, an) followed by a function "
           "word (a word-order check: high in shuffled words and keyword lists)", 0.25, 0.03,
           "ours"),
)
SIGNAL_BY_NAME = {s.name: s for s in SIGNALS}


def _as_text(texts) -> pa.Array:
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if not isinstance(texts, pa.Array):
        texts = pa.array(list(texts), pa.large_string())
    if not pa.types.is_large_string(texts.type):
        texts = texts.cast(pa.large_string())
    return pc.fill_null(texts, "")


def _per_doc(offsets: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sums of ``values`` between consecutive ``offsets`` (one per document, 0 when empty)."""
    csum = np.concatenate([[0.0], np.cumsum(values, dtype=np.float64)])
    return csum[offsets[1:]] - csum[offsets[:-1]]


def _offsets(lists: pa.Array) -> np.ndarray:
    return np.asarray(lists.offsets.to_numpy(zero_copy_only=False), np.int64) - int(
        lists.offsets[0].as_py())


def _ratio(num, den, empty=0.0) -> np.ndarray:
    num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
    return np.where(den > 0, num / np.maximum(den, 1), empty)


def _codes(values: pa.Array) -> np.ndarray:
    """One int64 code per value, equal for equal values."""
    enc = pc.dictionary_encode(values).combine_chunks() if isinstance(
        values, pa.ChunkedArray) else pc.dictionary_encode(values)
    return np.asarray(enc.indices.to_numpy(zero_copy_only=False), np.int64)


def _repeat_fractions(doc: np.ndarray, codes: np.ndarray, starts: np.ndarray, n: int,
                      n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """For word n-grams inside each document: (fraction of n-gram positions whose n-gram occurs
    more than once in the document, share of the most frequent n-gram)."""
    m = len(codes)
    if m < n:  # a text of fewer than n words has no n-gram: both fractions are 1 (fails)
        return np.ones(n_docs), np.ones(n_docs)
    pos = np.arange(m - n + 1)
    valid = doc[pos] == doc[pos + n - 1]  # the n-gram does not cross a document boundary
    pos = pos[valid]
    if not len(pos):
        return np.ones(n_docs), np.ones(n_docs)
    h = np.zeros(len(pos), np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * np.uint64(1_000_003) + codes[pos + j].astype(np.uint64)
        h = h * np.uint64(2_654_435_761) + doc[pos].astype(np.uint64)
    _, inv, counts = np.unique(h, return_inverse=True, return_counts=True)
    d = doc[pos]
    total = np.bincount(d, minlength=n_docs)
    dup = np.bincount(d, weights=(counts[inv] > 1), minlength=n_docs)
    top = np.zeros(n_docs)
    np.maximum.at(top, d, counts[inv].astype(np.float64))
    return _ratio(dup, total, empty=1.0), _ratio(top, total, empty=1.0)


def signals(texts) -> dict:
    """The raw value of every signal in :data:`SIGNALS` for each text, vectorised over the
    batch (pyarrow.compute and numpy; nothing loops over rows in Python). Returns
    ``{name: float64 (n,)}``. A text is read up to :data:`MAX_CHARS` characters."""
    text = _as_text(texts)
    n = len(text)
    text = pc.utf8_slice_codeunits(text, 0, MAX_CHARS)
    out = {}
    # words
    words_l = pc.utf8_split_whitespace(text)
    w_off = _offsets(words_l)
    words = pc.list_flatten(words_l)
    n_words = np.diff(w_off).astype(np.float64)
    doc = np.repeat(np.arange(n), np.diff(w_off))
    out["word_count"] = n_words
    trimmed = pc.utf8_trim(words, _PUNCT)
    lengths = np.asarray(pc.utf8_length(trimmed).to_numpy(zero_copy_only=False), np.float64)
    mwl = _ratio(_per_doc(w_off, lengths), n_words)
    out["mean_word_length"] = np.where(n_words > 0, np.maximum(3.0 - mwl, 0) + np.maximum(
        mwl - 10.0, 0), 3.0)
    alpha = np.asarray(pc.match_substring_regex(words, r"[^\W\d_]").to_numpy(
        zero_copy_only=False), np.float64)
    out["alpha_words"] = _ratio(_per_doc(w_off, alpha), n_words)
    lower = pc.utf8_lower(trimmed)
    stop = np.asarray(pc.is_in(lower, pa.array(STOP_WORDS)).to_numpy(zero_copy_only=False),
                      np.float64)
    out["stop_words"] = 100.0 * _ratio(_per_doc(w_off, stop), n_words)
    n_sym = (np.asarray(pc.count_substring(text, "#").to_numpy(zero_copy_only=False), np.float64)
             + np.asarray(pc.count_substring(text, "...").to_numpy(zero_copy_only=False), np.float64)
             + np.asarray(pc.count_substring(text, "…").to_numpy(zero_copy_only=False), np.float64))
    out["symbol_ratio"] = _ratio(n_sym, n_words, empty=1.0)
    # word order: an article followed by a function word
    codes = _codes(lower)
    art = np.asarray(pc.is_in(lower, pa.array(ARTICLES)).to_numpy(zero_copy_only=False), bool)
    fun = np.asarray(pc.is_in(lower, pa.array(FUNCTION_WORDS)).to_numpy(zero_copy_only=False),
                     bool)
    nxt = np.zeros(len(art), bool)
    if len(art) > 1:
        nxt[:-1] = fun[1:] & (doc[1:] == doc[:-1])
    last = np.zeros(len(art), bool)
    if len(art):
        last[w_off[1:][n_words > 0] - 1] = True  # an article that ends its document
    art = art & ~last
    # no article at all is no evidence of prose: it fails the check
    out["article_function"] = _ratio(_per_doc(w_off, (art & nxt).astype(np.float64)),
                                     _per_doc(w_off, art.astype(np.float64)), empty=1.0)
    # repeated n-grams
    _, top2 = _repeat_fractions(doc, codes, w_off, 2, n)
    dup5, _ = _repeat_fractions(doc, codes, w_off, 5, n)
    out["top_2gram"], out["dup_5gram"] = top2, dup5
    # lines
    lines_l = pc.split_pattern(text, "\n")
    l_off = _offsets(lines_l)
    lines = pc.utf8_trim_whitespace(pc.list_flatten(lines_l))
    nonempty = np.asarray(pc.greater(pc.utf8_length(lines), 0).to_numpy(zero_copy_only=False),
                          bool)
    n_lines = _per_doc(l_off, nonempty.astype(np.float64))

    def line_frac(mask) -> np.ndarray:
        m = np.asarray(pc.fill_null(mask, False).to_numpy(zero_copy_only=False), bool) & nonempty
        return _ratio(_per_doc(l_off, m.astype(np.float64)), n_lines)

    out["bullet_lines"] = line_frac(pc.match_substring_regex(lines, BULLETS))
    out["ellipsis_lines"] = line_frac(pc.or_(pc.ends_with(lines, "..."), pc.ends_with(lines, "…")))
    p = line_frac(pc.match_substring_regex(lines, r"[.!?:\"'”’)]$"))
    out["punct_lines"] = p
    out["short_lines"] = line_frac(pc.less(pc.utf8_length(lines), 30))
    line_doc = np.repeat(np.arange(n), np.diff(l_off))
    lc = _codes(lines)
    key = (line_doc.astype(np.int64) * (int(lc.max(initial=0)) + 1) + lc)[nonempty]
    first = np.zeros(len(key), bool)
    if len(key):
        first[np.unique(key, return_index=True)[1]] = True
    repeat = np.zeros(len(nonempty), np.float64)
    repeat[np.flatnonzero(nonempty)] = ~first
    out["dup_lines"] = _ratio(_per_doc(l_off, repeat), n_lines)
    return out


def degrees(values: dict) -> dict:
    """Each signal's pass degree in [0, 1] (``Signal.degree``; the word count on a log scale)."""
    out = {}
    for s in SIGNALS:
        x = values[s.name]
        if s.name == "word_count":
            x = np.log(np.maximum(x, 1.0))
            s = Signal(s.name, s.description, math.log(s.bad), math.log(s.good), s.source)
        out[s.name] = s.degree(x)
    return out


# How the pass degrees become one score. Measured in bench/quality.py: the AUC on the tuning
# sources (held-out man pages reported), where mean and geomean tie, and what the selection
# does with the score's size (python -m bench.quality --main-job 400): the geometric mean
# scores damaged text far lower than the mean (a failing signal pulls it down instead of
# being averaged away), so a diversity term that likes outliers (Pair_simi) selects far
# fewer of them. COMBINATION is the default's.
COMBINATIONS = ("mean", "geomean", "product", "min")
COMBINATION = "geomean"
# The signals the default score combines: backward elimination on the tuning sources (drop a
# signal while the mean per-kind AUC does not fall) kept these eight; the others separated
# nothing in that sample (AUC ~0.5 on every kind of damage) or cost separation. They are still
# computed by ``signals`` and reported by the bench.
DEFAULT_SIGNALS = ("word_count", "stop_words", "ellipsis_lines", "punct_lines", "short_lines",
                   "dup_lines", "dup_5gram", "article_function")
_EPS = 0.02  # the floor of a degree inside the geometric mean (so one zero is not -inf)


def combine(deg: dict, how: str = COMBINATION, names=None) -> np.ndarray:
    """One score in [0, 1] per text from the signals' pass degrees ``deg`` (:func:`degrees`),
    over ``names`` (default: :data:`DEFAULT_SIGNALS`). ``mean``; ``geomean``: the geometric mean with
    each degree floored at 0.02, rescaled so that 0.02 maps to 0; ``product`` and ``min``:
    every signal must pass, as the filters combine them."""
    names = list(names or DEFAULT_SIGNALS)
    x = np.stack([np.asarray(deg[k], np.float64) for k in names])
    if how == "mean":
        return x.mean(axis=0)
    if how == "geomean":
        g = np.exp(np.log(np.maximum(x, _EPS)).mean(axis=0))
        return np.clip((g - _EPS) / (1 - _EPS), 0.0, 1.0)
    if how == "product":
        return x.prod(axis=0)
    if how == "min":
        return x.min(axis=0)
    raise ValueError(f"combination must be one of {COMBINATIONS}, got {how!r}")


# ------------------------------------------------------------------ scorers
class Scorer(abc.ABC):
    """Texts -> one float per text. ``name`` and ``version`` identify it (the version changes
    when the model or the heuristic does); ``key`` hashes everything that determines the
    scores, for checkpoints and data versions."""

    name: str
    version: str

    @abc.abstractmethod
    def score(self, texts) -> np.ndarray:
        """(n,) float64 scores of ``texts`` (a list of str or a pyarrow string array)."""

    @property
    def settings(self) -> dict:
        return {"name": self.name, "version": self.version}

    @property
    def key(self) -> str:
        return hashlib.sha256(json.dumps(self.settings, sort_keys=True).encode()).hexdigest()[:16]


class HeuristicScorer(Scorer):
    """The default: the mean of the pass degrees of :data:`DEFAULT_SIGNALS`, in [0, 1]. Offline,
    CPU, no model; vectorised over a batch."""

    def __init__(self, combination: str = COMBINATION, names=None):
        if combination not in COMBINATIONS:
            raise ScorerError(f"heuristic combination must be one of {COMBINATIONS}")
        self.combination, self.names = combination, tuple(names or DEFAULT_SIGNALS)
        unknown = set(self.names) - set(SIGNAL_BY_NAME)
        if unknown:
            raise ScorerError(f"unknown heuristic signal(s) {sorted(unknown)}: choose from "
                              f"{sorted(SIGNAL_BY_NAME)}")
        self.name = DEFAULT_SCORER
        ramps = [(s.name, s.bad, s.good) for s in SIGNALS if s.name in self.names]
        h = hashlib.sha256(json.dumps([combination, ramps, MAX_CHARS]).encode()).hexdigest()[:8]
        self.version = f"{HEURISTIC_VERSION}+{h}"

    def score(self, texts) -> np.ndarray:
        return combine(degrees(signals(texts)), self.combination, self.names)


def _texts(texts) -> list:
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        return _as_text(texts).to_pylist()
    return ["" if t is None else str(t) for t in texts]


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


class FastTextScorer(Scorer):
    """A fastText classifier file (``.bin`` / ``.ftz``) by local path; the score is the
    probability of ``label`` (default: the model's first label; DCLM's is ``__label__hq``).
    Newlines are replaced by spaces (fastText predicts one line)."""

    def __init__(self, path, label: str | None = None):
        p = Path(path)
        if not p.is_file():
            raise ScorerError(
                f"fastText model {str(path)!r} is not a local file. Quality classifiers are "
                f"never downloaded: fetch the model file where there is network (e.g. DCLM's "
                f"openhermes_reddit_eli5_vs_rw_v2_bigram_200k_train.bin from the Hugging Face "
                f"repository mlfoundations/fasttext-oh-eli5) and pass fasttext:/path/to/model.bin")
        try:
            import fasttext
        except ImportError as exc:
            raise ScorerError(f"fastText model {str(path)!r} needs the fasttext package: "
                              f"pip install fasttext-wheel (or pip install "
                              f"'datamask-pipeline[quality]'): {exc}") from exc
        try:
            self._model = fasttext.load_model(str(p))
        except ValueError as exc:
            raise ScorerError(f"fastText model {str(path)!r} cannot be loaded: {exc}") from exc
        labels = list(self._model.get_labels())
        self.label = label or labels[0]
        if self.label not in labels:
            raise ScorerError(f"fastText model {str(path)!r} has no label {self.label!r}; its "
                              f"labels: {labels}")
        self._k = len(labels)
        self.name = f"fasttext:{p.name}#{self.label}"
        self.version = f"fasttext-{getattr(fasttext, '__version__', '0.9')}+sha256.{_file_digest(p)}"

    def score(self, texts) -> np.ndarray:
        lines = [t.replace("\n", " ").replace("\r", " ") for t in _texts(texts)]
        if not lines:
            return np.zeros(0)
        labels, probs = self._model.predict(lines, k=self._k, threshold=0.0)
        return np.array([float(p[list(lab).index(self.label)]) if self.label in lab else 0.0
                         for lab, p in zip(labels, probs)], np.float64)


class HFClassifierScorer(Scorer):
    """A Hugging Face sequence classifier saved in a local directory (``config.json``, weights,
    tokenizer), loaded with ``local_files_only``. One output (a regression head, like
    FineWeb-Edu's 0-5 educational score): the raw output. Several: the softmax probability of
    ``label`` (a name from ``id2label`` or an index; default the last)."""

    def __init__(self, model, label: str | None = None, max_tokens: int = 512,
                 batch_size: int = 16, device: str | None = None):
        try:
            import torch
            import transformers
            from transformers import AutoModelForSequenceClassification, AutoTokenizer
        except ImportError as exc:
            raise ScorerError(f"Hugging Face classifier {str(model)!r} needs the transformers "
                              f"package: pip install transformers (or pip install "
                              f"'datamask-pipeline[quality]'): {exc}") from exc
        p = Path(model)
        try:
            self._tok = AutoTokenizer.from_pretrained(str(model), local_files_only=True)
            self._model = AutoModelForSequenceClassification.from_pretrained(
                str(model), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ScorerError(
                f"Hugging Face classifier {str(model)!r} cannot be loaded offline. Quality "
                f"classifiers are never downloaded: where there is network, run "
                f"`huggingface-cli download {model if not p.exists() else 'ORG/NAME'} "
                f"--local-dir DIR` (e.g. HuggingFaceFW/fineweb-edu-classifier) and pass hf:DIR, "
                f"or put the model in the local Hugging Face cache: {exc}") from exc
        self._torch = torch
        self._model.eval()
        self.device = device or "cpu"
        self._model.to(self.device)
        n_out = int(self._model.config.num_labels)
        id2label = {int(k): v for k, v in (self._model.config.id2label or {}).items()}
        if n_out == 1:
            self.index, self.label = 0, None
        else:
            if label is None:
                self.index = n_out - 1
            elif str(label).isdigit():
                self.index = int(label)
            else:
                by_name = {v: k for k, v in id2label.items()}
                if label not in by_name:
                    raise ScorerError(f"Hugging Face classifier {str(model)!r} has no label "
                                      f"{label!r}; its labels: {list(by_name)}")
                self.index = by_name[label]
            if not 0 <= self.index < n_out:
                raise ScorerError(f"label index {self.index} out of range for {n_out} outputs")
            self.label = id2label.get(self.index, str(self.index))
        self.max_tokens, self.batch_size = int(max_tokens), int(batch_size)
        h = hashlib.sha256()
        for k, t in sorted(self._model.state_dict().items()):
            h.update(k.encode())
            h.update(t.detach().to("cpu").contiguous().numpy().tobytes())
        self.name = f"hf:{p.name if p.exists() else model}" + (
            "" if self.label is None else f"#{self.label}")
        self.version = f"transformers-{transformers.__version__}+sha256.{h.hexdigest()[:16]}"

    @property
    def settings(self) -> dict:
        return {**super().settings, "index": self.index, "max_tokens": self.max_tokens}

    def score(self, texts) -> np.ndarray:
        torch = self._torch
        texts = _texts(texts)
        out = np.zeros(len(texts))
        with torch.inference_mode():
            for s in range(0, len(texts), self.batch_size):
                enc = self._tok(texts[s:s + self.batch_size], truncation=True, padding=True,
                                max_length=self.max_tokens, return_tensors="pt").to(self.device)
                logits = self._model(**enc).logits.float()
                if logits.shape[1] == 1:
                    v = logits[:, 0]
                else:
                    v = torch.softmax(logits, dim=1)[:, self.index]
                out[s:s + len(v)] = v.cpu().numpy()
        return out


class WeightedScorer(Scorer):
    """The weighted sum of several scorers' scores (the paper sums DCLM + FineWeb-Edu + Wiki)."""

    def __init__(self, parts):
        self.parts = [(s, float(w)) for s, w in parts]
        if not self.parts:
            raise ScorerError("a weighted scorer needs at least one scorer")
        for _, w in self.parts:
            if not math.isfinite(w):
                raise ScorerError(f"scorer weights must be finite, got {w}")
        self.name = " + ".join(f"{w:g}*{s.name}" for s, w in self.parts)
        self.version = ";".join(s.version for s, _ in self.parts)

    @property
    def settings(self) -> dict:
        return {"parts": [[s.settings, w] for s, w in self.parts]}

    def score(self, texts) -> np.ndarray:
        if isinstance(texts, (pa.Array, pa.ChunkedArray)):
            texts = _as_text(texts)
        total = None
        for s, w in self.parts:
            v = w * np.asarray(s.score(texts), np.float64)
            total = v if total is None else total + v
        return total


def parse_spec(spec: str) -> list:
    """``[(kind, target, label, weight)]`` of a scorer spec (see the module docstring)."""
    spec = str(spec or "").strip()
    if not spec:
        raise ScorerError("empty quality scorer spec: use 'heuristic' (the default), "
                          "fasttext:/path/model.bin, hf:/path/dir, or several, comma-separated "
                          "with =weight")
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        weight = 1.0
        body, eq, w = part.rpartition("=")
        if eq:
            try:
                weight = float(w)
            except ValueError:
                raise ScorerError(f"quality scorer {part!r}: the weight after '=' must be a "
                                  f"number") from None
            part = body.strip()
        kind, colon, target = part.partition(":")
        if not colon:
            kind, target = part, ""
        target, _, label = target.partition("#")
        kind = kind.strip().lower()
        if kind == DEFAULT_SCORER and not target:
            out.append((kind, "", None, weight))
        elif kind in ("fasttext", "hf") and target:
            out.append((kind, target, label or None, weight))
        else:
            raise ScorerError(
                f"unknown quality scorer {part!r}: use 'heuristic' (offline, the default), "
                f"'fasttext:/local/path/model.bin[#label]' (pip install fasttext-wheel), or "
                f"'hf:/local/model/dir[#label]' (pip install transformers); classifiers are "
                f"never downloaded, so a name must be a local file or directory")
    if not out:
        raise ScorerError(f"quality scorer spec {spec!r} names no scorer")
    return out


def load_scorer(spec: str = DEFAULT_SCORER, *, device: str | None = None) -> Scorer:
    """The scorer a spec names (see the module docstring); a single unweighted one as itself,
    else a :class:`WeightedScorer`."""
    parts = []
    for kind, target, label, weight in parse_spec(spec):
        if kind == DEFAULT_SCORER:
            s = HeuristicScorer()
        elif kind == "fasttext":
            s = FastTextScorer(target, label)
        else:
            s = HFClassifierScorer(target, label, device=device)
        parts.append((s, weight))
    if len(parts) == 1 and parts[0][1] == 1.0:
        return parts[0][0]
    return WeightedScorer(parts)


# ------------------------------------------------------------------ shards
@dataclass(frozen=True)
class QualityProgress:
    rows_done: int
    rows: int
    chunks_done: int
    chunks: int
    computed: int
    reused: int
    seconds: float


@dataclass(frozen=True)
class QualityResult:
    """What :func:`score_shard` returns: the scores in row order, and where they came from.
    ``data_version`` hashes the text content and the scorer (name, version, settings)."""

    scores: np.ndarray
    scorer: str
    scorer_version: str
    scorer_key: str
    text_sha256: str
    data_version: str
    chunks: tuple
    computed: int
    reused: int
    seconds: float

    def metadata(self) -> dict:
        q = self.scores
        return {"quality_scorer": self.scorer, "quality_scorer_version": self.scorer_version,
                "quality_data_version": self.data_version,
                "quality_chunks_computed": self.computed, "quality_chunks_reused": self.reused,
                "quality_seconds": round(self.seconds, 3),
                "quality_mean": float(q.mean()) if len(q) else None,
                "quality_min": float(q.min()) if len(q) else None,
                "quality_max": float(q.max()) if len(q) else None}


def _read_scores(uri) -> np.ndarray:
    fs, path = storage.resolve(uri)
    with fs.open_input_stream(path) as fh:
        data = fh.read()
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return z["scores"]


def score_shard(raw_uri, checkpoint_dir, text_column: str = C.DEFAULT_NAMES[C.TEXT],
                scorer: Scorer | None = None, *, id_column: str | None = None,
                chunk_rows: int = DEFAULT_CHUNK_ROWS,
                progress: Optional[Callable[[QualityProgress], None]] = None,
                skip=None) -> QualityResult:
    """Score ``raw_uri``'s ``text_column`` in chunks of ``chunk_rows`` rows, each written to
    ``<checkpoint_dir>/<scorer key>/chunk-<index>-<text hash>.npz``; a chunk whose file exists
    (same scorer and text) is reused. The contract's text rules apply first (``contract.
    TEXT_RULES``: null, non-UTF-8 and blank texts are refused, naming the rows by
    ``id_column``), as for the embeddings; a score that is not finite is refused too.
    ``skip`` (``engine.data.TextRejects``): rows left out (quarantined); the scores are those
    of the other rows, in raw order."""
    from .embed import TextChunks, _fail

    scorer = scorer or load_scorer()
    path = str(raw_uri)
    t0 = time.perf_counter()
    parts, chunks, computed, reused = [], [], 0, 0
    with TextChunks(raw_uri, text_column, chunk_rows, storage.join(checkpoint_dir, scorer.key),
                    id_column, skip) as reader:
        for c in reader:
            if c.cached:
                scores = _read_scores(c.uri)
                reused += 1
            else:
                scores = np.asarray(scorer.score(c.texts), np.float64)
                bad = ~np.isfinite(scores)
                if bad.any():
                    raise _fail(C.Q_FINITE, bad, path, text_column, c.ids, c.start,
                                detail=f"computed by the quality scorer {scorer.name}")
                buf = io.BytesIO()
                np.savez(buf, scores=scores)
                storage.atomic_write_bytes(c.uri, buf.getvalue())
                computed += 1
            parts.append(scores)
            chunks.append(c.uri)
            if progress is not None:
                progress(QualityProgress(c.start + len(c.texts), reader.total, c.index + 1,
                                         reader.n_chunks, computed, reused,
                                         time.perf_counter() - t0))
        text_sha = reader.text_sha256
    version = hashlib.sha256(f"{text_sha}:{scorer.key}".encode()).hexdigest()
    return QualityResult(scores=np.concatenate(parts) if parts else np.zeros(0),
                         scorer=scorer.name, scorer_version=scorer.version,
                         scorer_key=scorer.key, text_sha256=text_sha, data_version=version,
                         chunks=tuple(chunks), computed=computed, reused=reused,
                         seconds=time.perf_counter() - t0)
