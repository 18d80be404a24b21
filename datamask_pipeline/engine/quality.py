"""Quality scores computed from text, for shards without a quality column (Dagster-free).

A :class:`Scorer` turns texts into one float per text. :func:`load_scorer` names one from a
spec string:

* ``heuristic`` (default): :class:`HeuristicScorer`, offline, CPU, no downloaded model: each
  text's language (py3langid), the quality signals of the Gopher, C4 and FineWeb filters that
  apply to that language and script plus a word-order signal, each a degree in (0, 1) on a
  smooth ramp at the published thresholds for the language (``quality_signals.THRESHOLDS``),
  combined by a mean over the signals that apply (the power mean with exponent -2). Measured
  per language and per kind of damage in ``bench/quality.py``
  (``bench/results/REPORT_quality.md``).
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
HEURISTIC_VERSION = "3"
DEFAULT_CHUNK_ROWS = 8192


class ScorerError(ConfigError):
    """A quality scorer that cannot be loaded or used (raised before any row is scored)."""


# ------------------------------------------------------------------ signals
# (datamask_pipeline/engine/quality_signals.py: the language, the signals, THE thresholds table)
from .quality_signals import (COMBINATION, COMBINATIONS, DEFAULT_SIGNALS, MAX_CHARS,  # noqa: E402
                              SIGNAL_BY_NAME, SIGNALS, THRESHOLDS, _as_text, combine, degrees,
                              detect_languages, signals)


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
    """The default: the combination (:data:`COMBINATION`, the power mean with exponent -2) of
    the degrees of the signals that apply to each text (:data:`DEFAULT_SIGNALS`, at its
    language's thresholds), in [0, 1]. Offline, CPU, no model beyond the language detector's
    (in the py3langid wheel); vectorised over a batch."""

    def __init__(self, combination: str = COMBINATION, names=None):
        if combination not in COMBINATIONS:
            raise ScorerError(f"heuristic combination must be one of {COMBINATIONS}")
        self.combination, self.names = combination, tuple(names or DEFAULT_SIGNALS)
        unknown = set(self.names) - set(SIGNAL_BY_NAME)
        if unknown:
            raise ScorerError(f"unknown heuristic signal(s) {sorted(unknown)}: choose from "
                              f"{sorted(SIGNAL_BY_NAME)}")
        self.name = DEFAULT_SCORER
        rows = [[t.signal, t.languages, t.good, t.bad] for t in THRESHOLDS
                if t.signal in self.names]
        h = hashlib.sha256(json.dumps([combination, rows, MAX_CHARS]).encode()).hexdigest()[:8]
        self.version = f"{HEURISTIC_VERSION}+{h}"

    def score_languages(self, texts) -> tuple[np.ndarray, np.ndarray]:
        """(scores (n,) float64, languages (n,) ISO 639-1 codes) of ``texts``."""
        text = _as_text(texts)
        langs = detect_languages(text.to_pylist())
        deg = degrees(signals(text, langs), langs)
        return combine(deg, self.combination, self.names), langs

    def score(self, texts) -> np.ndarray:
        return self.score_languages(texts)[0]


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
    # each row's language (ISO 639-1) where the scorer detects it (the heuristic), else None
    languages: Optional[np.ndarray] = None

    def metadata(self) -> dict:
        q = self.scores
        return {"quality_scorer": self.scorer, "quality_scorer_version": self.scorer_version,
                "quality_data_version": self.data_version,
                "quality_chunks_computed": self.computed, "quality_chunks_reused": self.reused,
                "quality_seconds": round(self.seconds, 3),
                "quality_mean": float(q.mean()) if len(q) else None,
                "quality_min": float(q.min()) if len(q) else None,
                "quality_max": float(q.max()) if len(q) else None}


def _read_scores(uri) -> tuple:
    """(scores, languages or None) of one chunk file."""
    fs, path = storage.resolve(uri)
    with fs.open_input_stream(path) as fh:
        data = fh.read()
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return z["scores"], (z["languages"] if "languages" in z.files else None)


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
    parts, langs, chunks, computed, reused = [], [], [], 0, 0
    with TextChunks(raw_uri, text_column, chunk_rows, storage.join(checkpoint_dir, scorer.key),
                    id_column, skip) as reader:
        for c in reader:
            if c.cached:
                scores, lang = _read_scores(c.uri)
                reused += 1
            else:
                lang = None
                if isinstance(scorer, HeuristicScorer):
                    scores, lang = scorer.score_languages(c.texts)
                    lang = lang.astype(str)
                else:
                    scores = scorer.score(c.texts)
                scores = np.asarray(scores, np.float64)
                bad = ~np.isfinite(scores)
                if bad.any():
                    raise _fail(C.Q_FINITE, bad, path, text_column, c.ids, c.start,
                                detail=f"computed by the quality scorer {scorer.name}")
                buf = io.BytesIO()
                np.savez(buf, scores=scores, **({} if lang is None else {"languages": lang}))
                storage.atomic_write_bytes(c.uri, buf.getvalue())
                computed += 1
            parts.append(scores)
            langs.append(lang)
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
                         seconds=time.perf_counter() - t0,
                         languages=np.concatenate(langs).astype(object) if langs and all(
                             x is not None for x in langs) else None)
