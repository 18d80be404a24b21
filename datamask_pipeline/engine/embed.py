"""Sentence embeddings for text-only shards (a text column, no embedding column).

An :class:`Embedder` turns texts into unit-length float32 vectors; :func:`load_embedder` names
one (the default ``wordllama`` model ships inside its PyPI package and runs offline; any other
name is a sentence-transformers model or local directory). :func:`embed_shard` streams a
shard's text column, applies the contract's text rules, and writes the vectors in chunks under a
checkpoint location, so that chunks already written are not recomputed after a kill.
:class:`LanguageSums` (each language's vector sum and rows, a shard's or a corpus's) gives the
:class:`LanguageCentering` that takes each language's mean vector out of the vectors (the
diversity geometry of a corpus in several languages, ``LANGUAGE_GEOMETRIES``).
"""

from __future__ import annotations

import abc
import base64
import hashlib
import io
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import contract as C
from . import storage
from .config import ConfigError
from .errors import MAX_IDS, DataContractError

__all__ = ["Embedder", "Encoded", "EmbedderError", "WordLlamaEmbedder",
           "SentenceTransformerEmbedder", "load_embedder", "embed_shard", "EmbedResult",
           "EmbedProgress", "DEFAULT_MODEL", "POOLINGS", "LanguageCentering", "LanguageSums",
           "language_centering", "read_language_sums", "LANGUAGE_GEOMETRIES",
           "DEFAULT_LANGUAGE_GEOMETRY", "LANGUAGE_MIN_ROWS", "LANGUAGE_COLUMN"]

DEFAULT_MODEL = "wordllama"
# WordLlama has no positional limit (a bag of tokens); 512 is the limit of the BERT-family
# sentence encoders, so swapping models does not change which part of a document counts.
WORDLLAMA_MAX_TOKENS = 512
WORDLLAMA_DIMS = (64, 128, 256)  # Matryoshka truncations of the shipped 256-d weights
POOLINGS = ("truncate", "chunks")
DEFAULT_MAX_CHUNKS = 64
DEFAULT_CHUNK_ROWS = 8192
# The geometry the diversity terms see in a corpus of several languages (the contract's
# embedding_language_geometry): "center" subtracts each language's mean vector where the vectors
# are read, the shard's mean in a shard's steps and the corpus's in the corpus stage
# (LanguageSums); "off" keeps the model's vectors as they are (upstream).
LANGUAGE_GEOMETRIES = ("center", "off")
DEFAULT_LANGUAGE_GEOMETRY = "center"
# A language with fewer rows than this in the scope (shard or corpus) is centered with the
# scope's other rare languages (their pooled mean; the whole scope's mean when they are fewer
# than this too).
LANGUAGE_MIN_ROWS = 8
# A centered vector shorter than this (a group of one row, or identical rows) keeps the model's
# vector: a zero vector has no direction.
CENTERED_MIN_NORM = 1e-3


class EmbedderError(ConfigError):
    """An embedding model that cannot be loaded or used."""


@dataclass(frozen=True)
class Encoded:
    """What :meth:`Embedder.encode` returns for n texts."""

    vectors: np.ndarray  # (n, d) float32, unit length (all zeros only for a text with no token)
    tokens: np.ndarray  # (n,) int64, tokens per text before truncation (a lower bound when cut)
    truncated: np.ndarray  # (n,) bool, the text was longer than what was embedded


def _unit(v: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(v, axis=1, keepdims=True)
    return (v / np.where(norm > 0, norm, 1.0)).astype(np.float32, copy=False)


class Embedder(abc.ABC):
    """A sentence-embedding model. ``name`` and ``version`` identify the weights (the version
    changes when they do), ``dim`` is the vector length, ``max_tokens`` the tokens of a text
    (or of a window, pooling ``chunks``) that are embedded."""

    name: str
    version: str
    dim: int
    max_tokens: int
    pooling: str = "truncate"
    max_chunks: int = DEFAULT_MAX_CHUNKS

    @abc.abstractmethod
    def encode(self, texts: list) -> Encoded:
        """Vectors and token statistics of ``texts``."""

    def embed(self, texts: list) -> np.ndarray:
        """(n, dim) float32 unit vectors of ``texts``."""
        return self.encode(list(texts)).vectors

    @property
    def settings(self) -> dict:
        return {"name": self.name, "version": self.version, "dim": self.dim,
                "max_tokens": self.max_tokens, "pooling": self.pooling,
                "max_chunks": self.max_chunks if self.pooling == "chunks" else None}

    @property
    def key(self) -> str:
        """A short hash of everything that determines the vectors (model and settings)."""
        return hashlib.sha256(json.dumps(self.settings, sort_keys=True).encode()).hexdigest()[:16]

    def _check_pooling(self) -> None:
        if self.pooling not in POOLINGS:
            raise EmbedderError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.max_tokens < 1 or self.max_chunks < 1:
            raise EmbedderError(f"max_tokens and max_chunks must be >= 1, got "
                                f"{self.max_tokens} and {self.max_chunks}")


# ------------------------------------------------------------------ wordllama (default)
def _import_wordllama():
    """Import wordllama without its import-time ``logging.basicConfig(level=INFO)`` (0.4.0,
    ``wordllama.inference``) changing the process's root logger."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import wordllama
    except ImportError as exc:
        raise EmbedderError(f"the default embedding model needs the wordllama package "
                            f"(pip install wordllama): {exc}") from exc
    finally:
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
    return wordllama


class WordLlamaEmbedder(Embedder):
    """WordLlama ``l2_supercat`` (MIT; the weights and tokenizer ship inside the PyPI wheel, so
    nothing is downloaded): the mean of static token embeddings, ``dim`` 256 or a Matryoshka
    truncation to 128 or 64. Tokenizer: LLaMA 2's 32k vocabulary, no special tokens.

    Pooling ``truncate`` averages a text's first ``max_tokens`` tokens. Without context, the
    token-weighted mean of per-window means is the mean over all windows' tokens, so ``chunks``
    averages the first ``max_tokens * max_chunks`` tokens."""

    CONFIG = "l2_supercat"

    def __init__(self, dim: int = 256, max_tokens: int | None = None, pooling: str = "truncate",
                 max_chunks: int = DEFAULT_MAX_CHUNKS, batch_size: int = 64):
        if dim not in WORDLLAMA_DIMS:
            raise EmbedderError(f"wordllama dim must be one of {WORDLLAMA_DIMS}, got {dim}")
        self.max_tokens = int(max_tokens or WORDLLAMA_MAX_TOKENS)
        self.pooling, self.max_chunks, self.batch_size = pooling, int(max_chunks), int(batch_size)
        self._check_pooling()
        wordllama = _import_wordllama()
        from tokenizers import Tokenizer
        from wordllama import WordLlama

        pkg = Path(wordllama.__file__).parent
        try:
            # cache_dir=pkg: 0.4.0 looks for its shipped tokenizer under <cache_dir>/tokenizers
            # (its own package lookup uses a "tokenizer/" folder that does not exist);
            # disable_download: never reach the network.
            wl = WordLlama.load(config=self.CONFIG, dim=256, trunc_dim=None if dim == 256 else dim,
                                cache_dir=pkg, disable_download=True)
        except (FileNotFoundError, ValueError) as exc:
            raise EmbedderError(f"wordllama {wordllama.__version__}: cannot load the shipped "
                                f"{self.CONFIG} model: {exc}") from exc
        weights = pkg / "weights" / f"{self.CONFIG}_256.safetensors"
        digest = hashlib.sha256(weights.read_bytes()).hexdigest()[:16]
        self.name = f"wordllama/{self.CONFIG}" + ("" if dim == 256 else f":{dim}")
        self.version = f"{wordllama.__version__}+sha256.{digest}"
        self.dim = dim
        self._table = np.ascontiguousarray(wl.embedding, dtype=np.float32)  # (vocab, dim)
        self._tok = Tokenizer.from_str(wl.tokenizer.to_str())
        self._tok.no_padding()
        self._tok.no_truncation()
        self._max_token_chars = max(len(t) for t in self._tok.get_vocab())

    def encode(self, texts: list) -> Encoded:
        n = len(texts)
        limit = self.max_tokens * (self.max_chunks if self.pooling == "chunks" else 1)
        # Each token covers at most _max_token_chars characters, so the first `cut` characters
        # hold at least `limit` tokens: longer texts are cut before tokenizing (bounded cost).
        cut = limit * self._max_token_chars
        vectors = np.zeros((n, self.dim), dtype=np.float32)
        tokens = np.zeros(n, dtype=np.int64)
        truncated = np.zeros(n, dtype=bool)
        for s in range(0, n, self.batch_size):
            part = texts[s:s + self.batch_size]
            encs = self._tok.encode_batch([t[:cut] for t in part], add_special_tokens=False)
            ids = [e.ids[:limit] for e in encs]
            lengths = np.fromiter((len(e.ids) for e in encs), np.int64, len(encs))
            kept = np.fromiter((len(i) for i in ids), np.int64, len(ids))
            tokens[s:s + len(part)] = lengths
            truncated[s:s + len(part)] = (lengths > limit) | np.fromiter(
                (len(t) > cut for t in part), bool, len(part))
            has = kept > 0
            if not has.any():
                continue
            flat = np.fromiter((t for i in ids for t in i), np.int64, int(kept.sum()))
            starts = np.concatenate([[0], np.cumsum(kept)[:-1]])[has]
            sums = np.add.reduceat(self._table[flat], starts, axis=0)  # (docs with tokens, d)
            vectors[s:s + len(part)][has] = sums / kept[has, None]
        return Encoded(_unit(vectors), tokens, truncated)


# ------------------------------------------------------------------ sentence-transformers
class SentenceTransformerEmbedder(Embedder):
    """Any sentence-transformers model, by hub name (needs the network or the local Hugging
    Face cache) or local directory. ``max_tokens`` defaults to the model's ``max_seq_length``;
    pooling ``chunks`` embeds windows of that many tokens and averages them weighted by their
    token counts. ``version`` hashes the loaded weights, so retrained weights under the same
    name are a new version."""

    def __init__(self, model: str, device: str | None = None, max_tokens: int | None = None,
                 pooling: str = "truncate", max_chunks: int = DEFAULT_MAX_CHUNKS,
                 batch_size: int = 32):
        try:
            import sentence_transformers
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise EmbedderError(f"embedding model {model!r}: not the default wordllama, so it "
                                f"needs sentence-transformers (pip install "
                                f"sentence-transformers): {exc}") from exc
        try:
            self._model = SentenceTransformer(str(model), device=device)
        except (OSError, ValueError) as exc:
            raise EmbedderError(f"embedding model {model!r} cannot be loaded (a local directory, "
                                f"or a hub name already in the local cache when offline): "
                                f"{exc}") from exc
        if max_tokens:
            self._model.max_seq_length = int(max_tokens)
        self.name = str(model)
        self.dim = int(self._model.get_sentence_embedding_dimension())
        self.max_tokens = int(self._model.max_seq_length)
        self.pooling, self.max_chunks, self.batch_size = pooling, int(max_chunks), int(batch_size)
        self._check_pooling()
        h = hashlib.sha256()
        for k, t in sorted(self._model.state_dict().items()):
            h.update(k.encode())
            h.update(t.detach().to("cpu").contiguous().numpy().tobytes())
        self.version = f"sentence-transformers-{sentence_transformers.__version__}+sha256." \
                       f"{h.hexdigest()[:16]}"

    def _encode(self, texts: list) -> np.ndarray:
        return self._model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                  normalize_embeddings=False, show_progress_bar=False)

    def encode(self, texts: list) -> Encoded:
        tok = self._model.tokenizer
        ids = tok(texts, add_special_tokens=False, truncation=False)["input_ids"]
        tokens = np.fromiter((len(i) for i in ids), np.int64, len(ids))
        body = max(1, self.max_tokens - tok.num_special_tokens_to_add())
        truncated = tokens > body * (self.max_chunks if self.pooling == "chunks" else 1)
        if self.pooling == "truncate" or not (tokens > body).any():
            return Encoded(_unit(np.asarray(self._encode(texts), np.float32)), tokens, truncated)
        # windows of `body` tokens, decoded back to text, embedded, averaged by token count
        pieces, owner, weight = [], [], []
        for row, i in enumerate(ids):
            windows = [i[s:s + body] for s in range(0, len(i), body)][:self.max_chunks] or [[]]
            for w in windows:
                pieces.append(tok.decode(w) if w else texts[row])
                owner.append(row)
                weight.append(max(len(w), 1))
        vecs = np.asarray(self._encode(pieces), np.float32)  # (pieces, d)
        out = np.zeros((len(texts), self.dim), np.float32)
        np.add.at(out, np.asarray(owner), vecs * np.asarray(weight, np.float32)[:, None])
        return Encoded(_unit(out), tokens, truncated)


def load_embedder(model: str = DEFAULT_MODEL, *, max_tokens: int | None = None,
                  pooling: str = "truncate", max_chunks: int = DEFAULT_MAX_CHUNKS,
                  device: str | None = None) -> Embedder:
    """``wordllama`` (default; ``wordllama:128`` / ``wordllama:64`` for the truncated
    dimensions) or a sentence-transformers model name or local directory."""
    model = str(model or DEFAULT_MODEL)
    base, _, dim = model.partition(":")
    if base == DEFAULT_MODEL:
        try:
            d = int(dim) if dim else 256
        except ValueError:
            raise EmbedderError(f"embedding model {model!r}: wordllama:DIM with DIM in "
                                f"{WORDLLAMA_DIMS}") from None
        return WordLlamaEmbedder(dim=d, max_tokens=max_tokens, pooling=pooling,
                                 max_chunks=max_chunks)
    return SentenceTransformerEmbedder(model, device=device, max_tokens=max_tokens,
                                       pooling=pooling, max_chunks=max_chunks)


# ------------------------------------------------------------------ language geometry
RARE = "*"  # the group of the rows whose language is rare in the scope
LANGUAGE_COLUMN = "language"  # the features' column of each row's language
# The features file's footer: the geometry the features step wrote them for and, with
# ``center``, each language's vector sum and rows over the shard (:meth:`LanguageSums.footer`).
META_GEOMETRY = b"datamask.embedding_language_geometry"
META_LANGUAGE_SUMS = b"datamask.embedding_language_sums"
_APPLY_ROWS = 65536  # rows centered at a time (bounds the temporary copy)


@dataclass(frozen=True)
class LanguageCentering:
    """Each row's language group and each group's mean vector: :meth:`apply` takes the group's
    mean out of the rows' vectors and scales them back to unit length.

    Why: a static English-centric model (the default wordllama) puts each language in its own
    region, far from English and packed tighter than English (on man pages in en/de/fr/es,
    centroid cosines en-de 0.35 against de-fr 0.70; mean cosine between pages 0.46 in English,
    0.57-0.66 in the others). The diversity terms then read the language as the main axis of
    variety: DiSF's selection was 62 of 67 English pages, Facility and Pair_simi favoured
    English too (``docs/quality.md``). Centered, every language's pages spread around the
    same origin, so variety means variety of content within a language and no language is
    rewarded or punished for where the model put it. Cosines between rows of one language
    shrink a little (0.98 becomes about 0.97 for a language whose mean has norm 0.6); identical
    texts stay identical."""

    groups: np.ndarray  # (n,) object: the row's language, or RARE
    centroids: dict  # group -> (d,) float32 mean of the model's vectors of its rows in the scope
    counts: dict  # group -> rows in the scope

    def apply(self, vectors: np.ndarray, start: int = 0, out: np.ndarray | None = None
              ) -> np.ndarray:
        """The centered unit vectors of rows ``start .. start + len(vectors)``, (rows, d)
        float32, written to ``out`` when given (it may be ``vectors`` itself: in place)."""
        n = len(vectors)
        out = np.empty((n, np.shape(vectors)[1]), np.float32) if out is None else out
        names = list(self.centroids)
        means = np.stack([self.centroids[k] for k in names]) if names else None  # (groups, d)
        enc = pc.dictionary_encode(pa.array(self.groups[start:start + n], pa.string()))
        at = np.array([names.index(k) for k in enc.dictionary.to_pylist()], dtype=np.int64)
        code = at[enc.indices.to_numpy(zero_copy_only=False)] if at.size else at  # (n,)
        for s in range(0, n, _APPLY_ROWS):
            v = np.asarray(vectors[s:s + _APPLY_ROWS], dtype=np.float32)
            c = v - means[code[s:s + len(v)]]
            flat = np.linalg.norm(c, axis=1) < CENTERED_MIN_NORM
            c[flat] = v[flat]
            out[s:s + len(v)] = _unit(c)
        return out

    def metadata(self) -> dict:
        return {"embedding_language_geometry": "center",
                "embedding_language_groups": {str(k): int(v) for k, v in
                                              sorted(self.counts.items(), key=lambda kv: -kv[1])}}


def _language_codes(languages) -> tuple:
    """(the distinct languages, (rows,) int64 index of each row's among them) of ``languages``
    (a sequence or an Arrow string array; None counts as unknown, '')."""
    if isinstance(languages, pa.ChunkedArray):
        languages = languages.combine_chunks()
    if not isinstance(languages, pa.Array):
        languages = pa.array(list(languages), pa.string())
    if languages.type != pa.string():
        languages = languages.cast(pa.string())
    enc = pc.dictionary_encode(pc.fill_null(languages, ""))
    return enc.dictionary.to_pylist(), enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)


@dataclass(frozen=True)
class LanguageSums:
    """Each language's sum of the model's vectors (float64) and rows over a scope: one shard
    (:meth:`of` its vectors; the features step writes it in the features' footer) or a corpus
    (:meth:`total` of its shards' footers, no row read). :meth:`centering` is the scope's
    :class:`LanguageCentering` of any of its rows: a shard's steps center by the shard's sums,
    the corpus stage by the corpus's, so what it reads does not depend on how the corpus was
    cut into files."""

    sums: dict  # language ('' unknown) -> (d,) float64
    counts: dict  # language -> rows

    @classmethod
    def of(cls, arrays, languages) -> "LanguageSums":
        """The sums of ``arrays`` ((rows, d) pieces in row order, e.g.
        :meth:`EmbedResult.arrays`) by each row's language (``languages``, e.g. the quality
        scorer's ISO 639-1 codes; None or '' counts as unknown)."""
        names, inv = _language_codes(languages)
        sums, start = None, 0
        for a in arrays:
            a = np.asarray(a, dtype=np.float64)
            if sums is None:
                sums = np.zeros((len(names), a.shape[1]), np.float64)
            g = inv[start:start + len(a)]
            order = np.argsort(g, kind="stable")
            at = np.flatnonzero(np.r_[True, np.diff(g[order]) != 0]) if g.size else g
            if g.size:
                sums[g[order][at]] += np.add.reduceat(a[order], at, axis=0)
            start += len(a)
        if start != inv.size:
            raise ValueError(f"{start} vectors for {inv.size} languages")
        counts = np.bincount(inv, minlength=len(names))
        return cls({k: sums[i] for i, k in enumerate(names)},
                   {k: int(counts[i]) for i, k in enumerate(names)})

    @classmethod
    def total(cls, parts) -> "LanguageSums | None":
        """The sums over ``parts`` (LanguageSums, None skipped); None when there is none."""
        sums: dict = {}
        counts: dict = {}
        dim = None
        for p in parts:
            if p is None:
                continue
            if dim is not None and p.dim != dim:
                raise ValueError(f"language sums of {p.dim}-d and {dim}-d vectors")
            dim = p.dim
            for k, v in p.sums.items():
                sums[k] = sums[k] + v if k in sums else np.array(v, np.float64)
                counts[k] = counts.get(k, 0) + p.counts[k]
        return None if dim is None else cls(sums, counts)

    @property
    def dim(self) -> int:
        return int(next(iter(self.sums.values())).shape[0])

    @property
    def rows(self) -> int:
        return int(sum(self.counts.values()))

    def centering(self, languages, min_rows: int = LANGUAGE_MIN_ROWS) -> LanguageCentering:
        """The centering of rows of this scope whose languages are ``languages``: a language
        with at least ``min_rows`` rows in the scope is its own group; the others are pooled
        into one group centered by its own mean when it has ``min_rows`` rows, else by the
        whole scope's mean."""
        common = {k for k, c in self.counts.items() if c >= min_rows and k}
        rare = [k for k in self.counts if k not in common]
        cents = {k: (self.sums[k] / self.counts[k]).astype(np.float32) for k in common}
        counts = {k: self.counts[k] for k in common}
        n_rare = sum(self.counts[k] for k in rare)
        pool = rare if n_rare >= min_rows else list(self.counts)
        n_pool = sum(self.counts[k] for k in pool)
        if pool:
            cents[RARE] = (sum(self.sums[k] for k in pool) / max(n_pool, 1)).astype(np.float32)
        if n_rare:
            counts[RARE] = n_rare
        names, inv = _language_codes(languages)
        group = np.array([v if v in common else RARE for v in names], dtype=object)
        return LanguageCentering(group[inv], cents, counts)

    def footer(self) -> dict:
        """The features' footer keys: the geometry (``center``) and these sums (JSON: rows and
        the float64 sum, little-endian and base64, per language)."""
        body = {k: {"rows": self.counts[k],
                    "sum": base64.b64encode(np.asarray(self.sums[k], "<f8").tobytes()).decode()}
                for k in sorted(self.sums)}
        return {META_GEOMETRY: b"center",
                META_LANGUAGE_SUMS: json.dumps(body, sort_keys=True).encode()}

    @classmethod
    def from_footer(cls, metadata) -> "LanguageSums | None":
        """The sums a features footer (parquet key-value metadata) records; None when it
        records none (geometry ``off``, a shard not embedded here, or a features file written
        before the sums were: its vectors are used as stored)."""
        metadata = metadata or {}
        if metadata.get(META_GEOMETRY) != b"center" or META_LANGUAGE_SUMS not in metadata:
            return None
        body = json.loads(metadata[META_LANGUAGE_SUMS])
        return cls({k: np.frombuffer(base64.b64decode(v["sum"]), "<f8").astype(np.float64)
                    for k, v in body.items()}, {k: int(v["rows"]) for k, v in body.items()})

    def digest(self) -> str:
        """A short hash of these sums (a corpus's vectors change with them)."""
        return hashlib.sha256(self.footer()[META_LANGUAGE_SUMS]).hexdigest()[:16]


def language_centering(arrays, languages, min_rows: int = LANGUAGE_MIN_ROWS) -> LanguageCentering:
    """The :class:`LanguageCentering` of rows by their own means (one shard's): the
    :meth:`LanguageSums.centering` of :meth:`LanguageSums.of` ``arrays`` and ``languages``."""
    if not isinstance(languages, (pa.Array, pa.ChunkedArray)):
        languages = pa.array(["" if v is None else str(v) for v in languages], pa.string())
    return LanguageSums.of(arrays, languages).centering(languages, min_rows)


def read_language_sums(uri) -> "LanguageSums | None":
    """The language sums in the footer of the features file ``uri`` (its footer only)."""
    fs, path = storage.resolve(uri)
    with fs.open_input_file(path) as fh:
        return LanguageSums.from_footer(pq.ParquetFile(fh).schema_arrow.metadata)


# ------------------------------------------------------------------ shards
@dataclass(frozen=True)
class EmbedProgress:
    rows_done: int
    rows: int
    chunks_done: int
    chunks: int
    computed: int  # chunks embedded in this call
    reused: int  # chunks found under the checkpoint location
    seconds: float


@dataclass(frozen=True)
class EmbedResult:
    """What :func:`embed_shard` returns. ``chunks`` are the checkpoint files in row order;
    ``data_version`` hashes the text content and the model (name, version, settings)."""

    rows: int
    dim: int
    model: str
    model_version: str
    model_key: str
    text_sha256: str
    data_version: str
    chunks: tuple
    computed: int
    reused: int
    tokens: int
    truncated_rows: int
    seconds: float

    def arrays(self) -> Iterator[np.ndarray]:
        """The vectors chunk by chunk, (rows of the chunk, dim) float32."""
        for uri in self.chunks:
            yield _read_chunk(uri)["vectors"]

    def load(self) -> np.ndarray:
        """All vectors, (rows, dim) float32."""
        parts = list(self.arrays())
        return np.concatenate(parts) if parts else np.zeros((0, self.dim), np.float32)

    def reader(self) -> "RowReader":
        return RowReader(self.arrays(), self.dim)

    def metadata(self) -> dict:
        return {"embedding_model": self.model, "embedding_model_version": self.model_version,
                "embedding_dim": self.dim, "embedding_data_version": self.data_version,
                "text_sha256": self.text_sha256, "embedding_tokens": self.tokens,
                "embedding_truncated_rows": self.truncated_rows,
                "embedding_chunks_computed": self.computed,
                "embedding_chunks_reused": self.reused,
                "embedding_seconds": round(self.seconds, 3)}


class RowReader:
    """Hands out consecutive rows of chunked arrays in pieces of any size."""

    def __init__(self, arrays: Iterator[np.ndarray], dim: int):
        self._arrays, self._dim = arrays, dim
        self._buf, self._pos = np.zeros((0, dim), np.float32), 0

    def take(self, m: int) -> np.ndarray:
        parts, need = [], m
        while need:
            if self._pos == len(self._buf):
                self._buf, self._pos = next(self._arrays), 0
            piece = self._buf[self._pos:self._pos + need]
            parts.append(piece)
            self._pos += len(piece)
            need -= len(piece)
        return np.concatenate(parts) if len(parts) != 1 else parts[0]


def _read_chunk(uri) -> dict:
    fs, path = storage.resolve(uri)
    with fs.open_input_stream(path) as fh:
        data = fh.read()
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _write_chunk(uri, enc: Encoded) -> None:
    buf = io.BytesIO()
    np.savez(buf, vectors=enc.vectors, tokens=enc.tokens, truncated=enc.truncated)
    storage.atomic_write_bytes(uri, buf.getvalue())


def _rechunk(batches, rows: int) -> Iterator[pa.RecordBatch]:
    """Record batches of exactly ``rows`` rows (the last one shorter), whatever the file's
    row groups: chunk boundaries depend on the row numbers only."""
    pending, have = [], 0
    for b in batches:
        while b.num_rows:
            take = min(rows - have, b.num_rows)
            pending.append(b.slice(0, take))
            have += take
            b = b.slice(take)
            if have == rows:
                yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]
                pending, have = [], 0
    if have:
        yield pa.Table.from_batches(pending).combine_chunks().to_batches()[0]


def _text_digest(arr: pa.Array) -> tuple[bytes, memoryview]:
    """(lengths, UTF-8 bytes) of a large_string array, for hashing (no copy of the text)."""
    offsets = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset:arr.offset + len(arr) + 1]
    data = arr.buffers()[2]
    body = memoryview(b"") if data is None else memoryview(data)[offsets[0]:offsets[-1]]
    return np.diff(offsets).astype("<i8").tobytes(), body


@dataclass
class TextChunk:
    """One checked chunk of a shard's text column: its texts, ids (or None), the rows before it,
    and its checkpoint file (``<dir>/chunk-<index>-<text hash>.npz``) and whether that exists."""

    index: int
    texts: pa.Array
    ids: object
    start: int
    uri: str
    cached: bool


class TextChunks:
    """A raw shard's text column read in chunks of ``chunk_rows`` rows, each checked against
    the contract's text rules (naming the rows by ``id_column``, else by row number) and named
    by a hash of its text under ``chunk_dir``: what the embeddings and the quality scores are
    checkpointed by. After iterating, ``text_sha256`` is the hash of the whole column.
    Use as a context manager (the file is closed on exit)."""

    def __init__(self, raw_uri, text_column: str, chunk_rows: int, chunk_dir,
                 id_column: str | None = None, skip=None):
        # skip: an ``engine.data.TextRejects`` whose rows are left out (quarantined): chunks
        # keep their raw row ranges, hold only the other rows, and ``start`` / ``total``
        # count those rows only (the row numbers of the vectors and scores produced)
        self.skip = skip if skip is not None and skip.count else None
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.path, self.column, self.id_column = str(raw_uri), text_column, id_column
        self.chunk_rows, self.dir = chunk_rows, chunk_dir
        try:
            fs, p = storage.resolve(raw_uri)
            self._src = fs.open_input_file(p)
            self._pf = pq.ParquetFile(self._src, buffer_size=1 << 20, pre_buffer=False)
        except FileNotFoundError as exc:
            raise storage.StorageError(f"{raw_uri}: raw shard does not exist") from exc
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise DataContractError(self.path, C.READABLE.name, detail=str(exc)) from exc
        try:
            names = self._pf.schema_arrow.names
            if text_column not in names:
                raise DataContractError(self.path, C.PRESENT.name, column=text_column,
                                        detail=C.PRESENT.detail.format(names=names))
            t = self._pf.schema_arrow.field(text_column).type
            if C.TEXT_TYPE.arrow(t):
                raise DataContractError(self.path, C.TEXT_TYPE.name, column=text_column,
                                        detail=C.TEXT_TYPE.detail.format(type=t))
        except BaseException:
            self._src.close()
            raise
        self.total = self._pf.metadata.num_rows - (self.skip.count if self.skip else 0)
        self.n_chunks = math.ceil(self._pf.metadata.num_rows / chunk_rows)
        self._h_len, self._h_text = hashlib.sha256(), hashlib.sha256()

    def __enter__(self) -> "TextChunks":
        return self

    def __exit__(self, *exc) -> None:
        self._src.close()

    def __iter__(self) -> Iterator[TextChunk]:
        storage.makedirs(self.dir)
        existing = {u.rsplit("/", 1)[-1] for u in storage.list_files(self.dir, suffix=".npz")}
        idc = self.id_column
        cols = [self.column] + ([idc] if idc and idc != self.column else [])
        batches = self._pf.iter_batches(batch_size=min(self.chunk_rows, 65536), columns=cols,
                                        use_threads=False)
        done = raw = 0
        for i, batch in enumerate(_rechunk(_readable(batches, self.path), self.chunk_rows)):
            keep = self.skip.kept(raw, batch.num_rows) if self.skip else None
            raw += batch.num_rows
            if keep is not None:
                batch = batch.filter(pa.array(keep))
                if not batch.num_rows:
                    continue
            ids = batch.column(idc) if idc else None
            texts = _checked_text(batch.column(self.column), self.path, self.column, ids, done)
            lengths, body = _text_digest(texts)
            self._h_len.update(lengths)
            self._h_text.update(body)
            h = hashlib.sha256(lengths)
            h.update(body)
            uri = storage.join(self.dir, f"chunk-{i:06d}-{h.hexdigest()[:16]}.npz")
            yield TextChunk(i, texts, ids, done, uri, uri.rsplit("/", 1)[-1] in existing)
            done += batch.num_rows

    @property
    def text_sha256(self) -> str:
        return hashlib.sha256(self._h_len.digest() + self._h_text.digest()).hexdigest()


def embed_shard(raw_uri, checkpoint_dir, text_column: str = C.DEFAULT_NAMES[C.TEXT],
                embedder: Embedder | None = None, *, id_column: str | None = None,
                chunk_rows: int = DEFAULT_CHUNK_ROWS,
                progress: Optional[Callable[[EmbedProgress], None]] = None,
                skip=None) -> EmbedResult:
    """Embed ``raw_uri``'s ``text_column`` in chunks of ``chunk_rows`` rows, each written to
    ``<checkpoint_dir>/<model key>/chunk-<index>-<text hash>.npz``; a chunk whose file exists
    (same model, settings and text) is reused, not recomputed. Breaking a text rule raises
    :class:`DataContractError` naming the rows by ``id_column`` (else by row number); a
    computed vector that is zero or not finite does too. ``skip`` (``engine.data.TextRejects``):
    rows left out (quarantined); the vectors are those of the other rows, in raw order."""
    embedder = embedder or load_embedder()
    path = str(raw_uri)
    t0 = time.perf_counter()
    chunks, computed, reused, tokens, truncated, done = [], 0, 0, 0, 0, 0
    with TextChunks(raw_uri, text_column, chunk_rows, storage.join(checkpoint_dir, embedder.key),
                    id_column, skip) as reader:
        for c in reader:
            if c.cached:
                enc = _read_chunk(c.uri)
                reused += 1
            else:
                e = embedder.encode(c.texts.to_pylist())
                _check_vectors(e.vectors, path, text_column, c.ids, c.start, embedder.name)
                _write_chunk(c.uri, e)
                enc = {"tokens": e.tokens, "truncated": e.truncated}
                computed += 1
            tokens += int(enc["tokens"].sum())
            truncated += int(enc["truncated"].sum())
            chunks.append(c.uri)
            done = c.start + len(c.texts)
            if progress is not None:
                progress(EmbedProgress(done, reader.total, c.index + 1, reader.n_chunks,
                                       computed, reused, time.perf_counter() - t0))
        text_sha = reader.text_sha256
    version = hashlib.sha256(f"{text_sha}:{embedder.key}".encode()).hexdigest()
    return EmbedResult(rows=done, dim=embedder.dim, model=embedder.name,
                       model_version=embedder.version, model_key=embedder.key,
                       text_sha256=text_sha, data_version=version, chunks=tuple(chunks),
                       computed=computed, reused=reused, tokens=tokens, truncated_rows=truncated,
                       seconds=time.perf_counter() - t0)


def remove_checkpoint(checkpoint_dir) -> None:
    """Delete the chunks of every model under ``checkpoint_dir`` (after a successful run)."""
    storage.remove(checkpoint_dir, recursive=True)


def _readable(batches, path: str):
    while True:
        try:
            b = next(batches)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as exc:
            raise DataContractError(path, C.READABLE.name, detail=str(exc)) from exc
        yield b


def _fail(rule: C.Rule, bad: np.ndarray, path, column, ids, offset, detail=None):
    where = np.flatnonzero(bad)[:MAX_IDS]
    if ids is not None and not ids.null_count:
        return DataContractError(path, rule.name, column=column, count=int(bad.sum()),
                                 ids=ids.take(pa.array(where)).to_pylist(), detail=detail)
    return DataContractError(path, rule.name, column=column, count=int(bad.sum()),
                             rows=(where + offset).tolist(), detail=detail)


def _checked_text(col: pa.Array, path, column, ids, offset) -> pa.Array:
    """The text rules (``contract.TEXT_RULES``, row rules) on one chunk; returns it as a
    valid large_string array."""
    for rule in (C.TEXT_NULL, C.TEXT_UTF8):
        bad = rule.mask(col)
        if bad.any():
            raise _fail(rule, bad, path, column, ids, offset)
    text = col.cast(pa.large_binary()).cast(pa.large_string()) if not pa.types.is_large_string(
        col.type) else col
    bad = C.TEXT_BLANK.mask(text)
    if bad.any():
        raise _fail(C.TEXT_BLANK, bad, path, column, ids, offset)
    return text


def _check_vectors(v: np.ndarray, path, column, ids, offset, model: str) -> None:
    for rule in (C.EMB_FINITE, C.EMB_ZERO):
        bad = rule.mask(v)
        if bad.any():
            raise _fail(rule, bad, path, column, ids, offset,
                        detail=f"computed by the embedding model {model} from the text")
