"""The data contract of an input shard: which columns, which types, which values.

A shard is a parquet file with one row per sample: an id column (integer or string, unique,
non-null), one or more numeric quality columns (summed, optionally weighted, into the quality
score q; the paper sums three classifier scores), and an embedding column (a list of floats of
one dimension d for every row). Any other columns (text, source, ...) are allowed and ignored
here; :func:`storage.write_selected_rows` carries them to the output unchanged.

Every violation raises one :class:`DataContractError` naming the file, the column, the rule and
up to 10 offending ids, e.g.::

    shard_000.parquet: column 'feature_arr': rule 'finite embeddings' broken by 3 rows; ids: [5, 9, 12]

The rules themselves (names, predicates, message details) live in :mod:`engine.contract`;
this module reads a shard and applies them, vectorised (pyarrow.compute / numpy): nothing loops
over rows in Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import contract as C
from . import embed, storage
from .contract import rule_expected_dim, rule_quality_range
from .errors import MAX_IDS, DataContractError

__all__ = ["DataContractError", "Columns", "Shard", "read_shard", "table_to_shard", "check_schema",
           "MAX_IDS", "rule_quality_range", "rule_expected_dim", "TextRejects", "text_rejects",
           "raw_row_numbers", "quarantined_rows", "RAW_ROW"]

_BLOCK_ROWS = 65536

# Rule names (stable strings: tests and callers match on them), defined in engine.contract.
RULE_READABLE = C.READABLE.name
RULE_PRESENT = C.PRESENT.name
RULE_ID_TYPE = C.ID_TYPE.name
RULE_ID_INT64 = C.ID_INT64.name
RULE_QUALITY_TYPE = C.QUALITY_TYPE.name
RULE_EMB_TYPE = C.EMB_TYPE.name
RULE_ROWS = C.ROWS.name
RULE_ID_NULL = C.ID_NULL.name
RULE_ID_UNIQUE = C.ID_UNIQUE.name
RULE_Q_NULL = C.Q_NULL.name
RULE_Q_FINITE = C.Q_FINITE.name
RULE_EMB_NULL = C.EMB_NULL.name
RULE_EMB_RAGGED = C.EMB_RAGGED.name
RULE_EMB_EMPTY = C.EMB_EMPTY.name
RULE_EMB_FINITE = C.EMB_FINITE.name
RULE_EMB_ZERO = C.EMB_ZERO.name


@dataclass(frozen=True)
class Columns:
    """Column names of a shard. Several quality columns are summed, weighted by
    ``quality_weights`` (default all 1)."""

    id: str = C.DEFAULT_NAMES[C.ID]
    quality: tuple = (C.DEFAULT_NAMES[C.QUALITY],)
    quality_weights: tuple | None = None
    embedding: str = C.DEFAULT_NAMES[C.EMBEDDING]
    # A shard without the embedding column but with this text column is embedded from its text
    # (``engine.embed``); None: embeddings are required.
    text: str | None = C.DEFAULT_NAMES[C.TEXT]
    # A shard without any quality column but with the text column gets its quality scored from
    # the text (``engine.quality``); False: the quality column(s) are required.
    quality_from_text: bool = True

    def __post_init__(self):
        q = self.quality
        if isinstance(q, str):
            q = (q,)
        q = tuple(q)
        if not q or not all(isinstance(c, str) and c for c in q):
            raise ValueError(f"Columns.quality must be one or more column names, got {self.quality!r}")
        object.__setattr__(self, "quality", q)
        if self.quality_weights is not None:
            w = tuple(float(x) for x in self.quality_weights)
            if len(w) != len(q):
                raise ValueError(
                    f"Columns.quality_weights has {len(w)} values for {len(q)} quality columns {q}"
                )
            if not all(math.isfinite(x) for x in w):
                raise ValueError(f"Columns.quality_weights must be finite, got {w}")
            object.__setattr__(self, "quality_weights", w)
        for name in (self.id, self.embedding) + (() if self.text is None else (self.text,)):
            if not isinstance(name, str) or not name:
                raise ValueError(f"column names must be non-empty strings, got {name!r}")

    @property
    def weights(self) -> tuple:
        return self.quality_weights if self.quality_weights is not None else (1.0,) * len(self.quality)

    def of(self, role: str) -> tuple:
        """The column name(s) of a contract role (``contract.ID``, ``QUALITY``, ``EMBEDDING``)."""
        return {C.ID: (self.id,), C.QUALITY: self.quality, C.EMBEDDING: (self.embedding,),
                C.TEXT: () if self.text is None else (self.text,)}[role]

    def source(self, names) -> str | None:
        """Where a shard with columns ``names`` gets its embeddings: ``contract.EMBEDDING`` (it
        carries them; preferred), ``contract.TEXT`` (embedded from its text) or None."""
        if self.embedding in names:
            return C.EMBEDDING
        if self.text is not None and self.text in names:
            return C.TEXT
        return None

    def quality_source(self, names) -> str | None:
        """Where a shard with columns ``names`` gets its quality: ``contract.QUALITY`` (it has
        the quality column(s); a partial set is a missing column), ``contract.TEXT`` (none of
        them, the text column, and ``quality_from_text``: scored from the text) or None."""
        if any(c in names for c in self.quality):
            return C.QUALITY
        if self.quality_from_text and self.text is not None and self.text in names:
            return C.TEXT
        return None

    def needed(self) -> list:
        out = []
        for c in (self.id, *self.quality, self.embedding):
            if c not in out:
                out.append(c)
        return out


@dataclass
class Shard:
    """A validated shard in memory: ids (int64, or object array of str), quality (float64,
    (n,)) and embeddings (float32, (n, d))."""

    path: str
    ids: np.ndarray
    quality: np.ndarray
    embeddings: np.ndarray
    columns: Columns = Columns()
    # engine.embed.EmbedResult when the embeddings were computed from the text, else None
    embedded: object = None
    # engine.quality.QualityResult when the quality was scored from the text, else None
    scored: object = None

    @property
    def n(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def d(self) -> int:
        return int(self.embeddings.shape[1])


# ------------------------------------------------------------------ schema checks
def check_schema(schema: pa.Schema, path: str, columns: Columns) -> str:
    """Raise DataContractError for a missing column or a column of the wrong type (the
    contract's ``type`` rules, in its order: every column is present before any type is read).
    Returns the embeddings' source (``Columns.source``): a shard without the embedding column
    needs the text column, of a string type, instead."""
    names = schema.names
    source = columns.source(names)
    qsource = columns.quality_source(names)
    for rule in C.RULES:
        if rule.scope != "type":
            continue
        for role in rule.columns:
            if role == C.EMBEDDING and source == C.TEXT:
                continue
            if role == C.QUALITY and qsource == C.TEXT:
                continue
            for c in columns.of(role):
                t = schema.field(c).type if c in names else None
                if rule.arrow(t):
                    detail = rule.detail.format(names=names, type=t)
                    if rule is C.PRESENT and role == C.EMBEDDING and columns.text is not None:
                        detail = C.NO_EMBEDDING_NOR_TEXT.format(embedding=c, text=columns.text,
                                                                names=names)
                    raise DataContractError(path, rule.name, column=c, detail=detail)
    if C.TEXT in (source, qsource):
        t = schema.field(columns.text).type
        if C.TEXT_TYPE.arrow(t):
            raise DataContractError(path, C.TEXT_TYPE.name, column=columns.text,
                                    detail=C.TEXT_TYPE.detail.format(type=t))
    return source


def _combine(col) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _first(mask: np.ndarray) -> np.ndarray:
    return np.flatnonzero(mask)[:MAX_IDS]


# ------------------------------------------------------------------ table -> shard
def table_to_shard(table: pa.Table, path, columns: Columns = Columns(), expected_dim=None,
                   quality_range=None) -> Shard:
    """Validate ``table`` against the contract and convert it to a :class:`Shard`.

    ``expected_dim``: required embedding dimension. ``quality_range``: ``(lo, hi)``, inclusive,
    either end may be None; applied to every quality column's raw values."""
    path = str(path)
    check_schema(table.schema, path, columns)
    n = table.num_rows
    if C.ROWS.arrow(n):
        raise DataContractError(path, RULE_ROWS, detail=C.ROWS.detail)

    ids = _ids(table.column(columns.id), path, columns.id)

    def err(rule, column, mask, unit="rows", detail=None):
        return DataContractError(path, rule, column=column, ids=ids[_first(mask)].tolist(),
                                 count=int(mask.sum()), unit=unit, detail=detail)

    quality = _quality(table, path, columns, quality_range, err)
    emb = _embeddings(table.column(columns.embedding), path, columns.embedding, n,
                      expected_dim, err)
    return Shard(path=path, ids=ids, quality=quality, embeddings=emb, columns=columns)


def _ids(col, path: str, name: str) -> np.ndarray:
    arr = _combine(col)
    bad = C.ID_NULL.mask(arr)
    if bad.any():  # the ids cannot name these rows: give row numbers
        raise DataContractError(path, RULE_ID_NULL, column=name, count=int(bad.sum()),
                                rows=_first(bad).tolist())
    t = arr.type
    if pa.types.is_integer(t):
        bad = C.ID_INT64.mask(arr)
        if bad.any():  # they cannot be int64: give the raw values
            raise DataContractError(path, RULE_ID_INT64, column=name,
                                    ids=arr.filter(pa.array(bad))[:MAX_IDS].to_pylist(),
                                    count=int(bad.sum()))
        ids = arr.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    else:
        if pa.types.is_string_view(t):
            arr = arr.cast(pa.large_string())
        ids = arr.to_numpy(zero_copy_only=False).astype(object, copy=False)
    vc = pc.value_counts(arr)
    bad = C.ID_UNIQUE.mask(vc.field("counts").to_numpy())
    if bad.any():
        dup = vc.field("values").filter(pa.array(bad))
        raise DataContractError(path, RULE_ID_UNIQUE, column=name, ids=dup[:MAX_IDS].to_pylist(),
                                count=len(arr) - len(vc),
                                detail=C.ID_UNIQUE.detail.format(groups=len(dup)))
    return ids


def _quality(table: pa.Table, path: str, columns: Columns, quality_range, err) -> np.ndarray:
    lo, hi = (None, None) if quality_range is None else quality_range
    total = np.zeros(table.num_rows, dtype=np.float64)
    for name, w in zip(columns.quality, columns.weights):
        col = table.column(name)
        bad = C.Q_NULL.mask(col)
        if bad.any():
            raise err(RULE_Q_NULL, name, bad)
        q = pc.cast(col, pa.float64(), safe=False).to_numpy().astype(np.float64, copy=False)
        bad = C.Q_FINITE.mask(q)
        if bad.any():
            raise err(RULE_Q_FINITE, name, bad)
        if lo is not None or hi is not None:
            bad = C.Q_RANGE.mask(q, lo=lo, hi=hi)
            if bad.any():
                raise err(rule_quality_range(lo, hi), name, bad,
                          detail=C.Q_RANGE.detail.format(min=q.min(), max=q.max()))
        total += w * q
    bad = C.Q_FINITE.mask(total)
    if bad.any():  # only reachable by overflow of a huge weighted sum
        raise err(RULE_Q_FINITE, " + ".join(columns.quality), bad, detail="weighted sum overflows")
    return total


def _embeddings(col, path: str, name: str, n: int, expected_dim, err) -> np.ndarray:
    if isinstance(col, pa.Array):
        col = pa.chunked_array([col])
    t = col.type
    bad = C.EMB_NULL.mask(col)
    if bad.any():
        raise err(RULE_EMB_NULL, name, bad)
    if pa.types.is_fixed_size_list(t):
        d = int(t.list_size)
        lengths = np.full(n, d, dtype=np.int64)
    else:
        lengths = pc.list_value_length(col).to_numpy().astype(np.int64, copy=False)
        vals, counts = np.unique(lengths, return_counts=True)
        d = int(vals[np.argmax(counts)])  # the most common length, the smallest on a tie
    if expected_dim is not None:
        expected_dim = int(expected_dim)
        bad = C.EMB_DIM.mask(lengths, d=expected_dim)
        if bad.any():
            found = np.unique(lengths[bad]).tolist()[:MAX_IDS]
            raise err(rule_expected_dim(expected_dim), name, bad,
                      detail=C.EMB_DIM.detail.format(found=found))
    bad = C.EMB_RAGGED.mask(lengths, d=d)
    if bad.any():
        others = np.unique(lengths[bad]).tolist()[:MAX_IDS]
        raise err(RULE_EMB_RAGGED, name, bad, detail=C.EMB_RAGGED.detail.format(d=d, others=others))
    bad = C.EMB_EMPTY.mask(lengths)
    if bad.any():
        raise err(RULE_EMB_EMPTY, name, bad)

    out = np.empty((n, d), dtype=np.float32)
    off = 0
    nan = pa.scalar(float("nan"), t.value_type)
    with np.errstate(over="ignore", invalid="ignore"):
        for chunk in col.chunks:
            m = len(chunk)
            if m == 0:
                continue
            flat = chunk.flatten()
            if flat.null_count:  # a null inside a vector counts as non-finite
                flat = pc.fill_null(flat, nan)
            out[off:off + m] = flat.to_numpy(zero_copy_only=False).reshape(m, d)
            off += m
    nonfinite = np.empty(n, dtype=bool)
    zero = np.empty(n, dtype=bool)
    for s in range(0, n, _BLOCK_ROWS):
        blk = out[s:s + _BLOCK_ROWS]
        nonfinite[s:s + _BLOCK_ROWS] = C.EMB_FINITE.mask(blk)
        zero[s:s + _BLOCK_ROWS] = C.EMB_ZERO.mask(blk)
    if nonfinite.any():
        raise err(RULE_EMB_FINITE, name, nonfinite, detail=C.EMB_FINITE.detail)
    if zero.any():
        raise err(RULE_EMB_ZERO, name, zero)
    return out


# ------------------------------------------------------------------ files
def read_shard(uri, columns: Columns = Columns(), expected_dim=None, quality_range=None, *,
               embedder=None, embed_checkpoint=None, embed_progress=None, scorer=None,
               quality_checkpoint=None, quality_progress=None, language_sums=None) -> Shard:
    """Read and validate one parquet shard (only the id, quality and embedding columns).

    A features file whose footer records its languages' vector sums (the features step's
    ``embedding_language_geometry: center``, ``engine.embed.LanguageSums``) has its vectors
    centered by language as they are read: by ``language_sums`` when given (the corpus's, in
    the corpus stage), else by the shard's own. Any other file's vectors are used as stored.

    A text-only shard (``Columns.source``) is embedded from its text column by ``embedder``
    (an ``engine.embed.Embedder`` or a function returning one; default: the default model),
    with its chunks under ``embed_checkpoint``
    (default: a temporary directory, removed afterwards); ``Shard.embedded`` says how.
    A shard without its quality column(s) but with the text column (``Columns.quality_source``)
    is scored from its text by ``scorer`` (an ``engine.quality.Scorer`` or a function returning
    one; default: the heuristic), with its chunks under ``quality_checkpoint`` (default: a
    temporary directory); ``Shard.scored`` says how."""
    shard, scored = _read_shard(uri, columns, expected_dim, quality_range, embedder,
                                embed_checkpoint, embed_progress, scorer, quality_checkpoint,
                                quality_progress, language_sums)
    shard.scored = scored
    return shard


def score_text(uri, columns: Columns, scorer=None, checkpoint=None, progress=None, skip=None):
    """The quality scores of a shard's text column (``engine.quality.score_shard``), with the
    chunks under ``checkpoint`` (default: a temporary directory, removed afterwards); ``skip``
    (:class:`TextRejects`): rows left out."""
    import tempfile

    from . import quality

    if scorer is None:
        scorer = quality.load_scorer()
    elif callable(scorer) and not isinstance(scorer, quality.Scorer):
        scorer = scorer()  # a factory: the scorer loads only for a shard without quality
    with tempfile.TemporaryDirectory(prefix="datamask-quality-") as tmp:
        return quality.score_shard(uri, checkpoint or tmp, columns.text, scorer,
                                   id_column=columns.id, progress=progress, skip=skip)


def scored_columns(columns: Columns) -> Columns:
    """The column mapping of a table to which the computed quality was appended (as the first
    quality column's name, weight 1: the scorer's own weights are already in the score)."""
    from dataclasses import replace

    return replace(columns, quality=(columns.quality[0],), quality_weights=None)


def _read_shard(uri, columns, expected_dim, quality_range, embedder, embed_checkpoint,
                embed_progress, scorer, quality_checkpoint, quality_progress, language_sums):
    path = str(uri)
    try:
        fs, p = storage.resolve(uri)
        src = fs.open_input_file(p)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise DataContractError(path, RULE_READABLE, detail=str(exc)) from exc
    try:
        try:
            pf = pq.ParquetFile(src)
            schema = pf.schema_arrow
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise DataContractError(path, RULE_READABLE, detail=str(exc)) from exc
        source = check_schema(schema, path, columns)
        scored = None
        if columns.quality_source(schema.names) == C.TEXT:
            scored = score_text(uri, columns, scorer, quality_checkpoint, quality_progress)
        if source == C.TEXT:
            return _read_text_shard(pf, path, columns, expected_dim, quality_range, embedder,
                                    embed_checkpoint, embed_progress, scored), scored
        own = embed.LanguageSums.from_footer(schema.metadata)
        wanted = [c for c in columns.needed() if c in schema.names]
        if own is not None:
            if embed.LANGUAGE_COLUMN not in schema.names:
                raise DataContractError(path, RULE_PRESENT, column=embed.LANGUAGE_COLUMN,
                                        detail="the footer records language sums")
            wanted.append(embed.LANGUAGE_COLUMN)
        try:
            table = pf.read(columns=wanted)
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise DataContractError(path, RULE_READABLE, detail=str(exc)) from exc
    finally:
        src.close()
    table, columns = _with_scores(table, columns, scored)
    shard = table_to_shard(table, path, columns, expected_dim=expected_dim,
                           quality_range=quality_range)
    if own is not None:  # the model's vectors, centered here (in place)
        sums = own if language_sums is None else language_sums
        centering = sums.centering(table.column(embed.LANGUAGE_COLUMN))
        centering.apply(shard.embeddings, out=shard.embeddings)
    return shard, scored


def _with_scores(table: pa.Table, columns: Columns, scored):
    if scored is None:
        return table, columns
    columns = scored_columns(columns)
    return table.append_column(columns.quality[0], pa.array(scored.scores, pa.float64())), columns


def _read_text_shard(pf, path, columns: Columns, expected_dim, quality_range, embedder,
                     checkpoint, progress, scored=None) -> Shard:
    """A text-only shard: ids and quality checked first (cheap), then embedded, then the
    embeddings checked like read ones."""
    import tempfile

    names = pf.schema_arrow.names
    try:
        table = pf.read(columns=[c for c in columns.needed()
                                 if c != columns.embedding and c in names])
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise DataContractError(path, RULE_READABLE, detail=str(exc)) from exc
    table, columns = _with_scores(table, columns, scored)
    if C.ROWS.arrow(table.num_rows):
        raise DataContractError(path, RULE_ROWS, detail=C.ROWS.detail)
    ids = _ids(table.column(columns.id), path, columns.id)

    def err(rule, column, mask, unit="rows", detail=None):
        return DataContractError(path, rule, column=column, ids=ids[_first(mask)].tolist(),
                                 count=int(mask.sum()), unit=unit, detail=detail)

    _quality(table, path, columns, quality_range, err)
    if embedder is None:
        embedder = embed.load_embedder()
    elif callable(embedder):  # a factory: the model loads only for a text-only shard
        embedder = embedder()
    if expected_dim is not None and int(expected_dim) != embedder.dim:
        raise DataContractError(path, rule_expected_dim(int(expected_dim)), column=columns.text,
                                detail=f"the embedding model {embedder.name} gives "
                                       f"{embedder.dim}-d vectors")
    with tempfile.TemporaryDirectory(prefix="datamask-embed-") as tmp:
        result = embed.embed_shard(path, checkpoint or tmp, columns.text, embedder,
                                   id_column=columns.id, progress=progress)
        x = result.load()  # (n, d)
    emb = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
    table = table.append_column(columns.embedding, emb)
    shard = table_to_shard(table, path, columns, expected_dim=expected_dim,
                           quality_range=quality_range)
    shard.embedded = result
    return shard


# ------------------------------------------------------------------ row-level quarantine
# The rejects file's columns: the raw id (as text: shards differ in id type; null when the id
# is null), the rule broken, the row number in the raw file and the text column.
REJECTS_SCHEMA = pa.schema([("id", pa.string()), ("rule", pa.string()), ("row", pa.int64()),
                            ("column", pa.string())])
# The features file's extra column when rows were quarantined: each row's row number in the
# raw file (absent when the features are the raw file row for row), and the footer keys that
# say how many rows were quarantined out of how many.
RAW_ROW = "raw_row"
META_QUARANTINED, META_RAW_ROWS = b"datamask.rows_quarantined", b"datamask.rows_raw"


@dataclass(frozen=True)
class TextRejects:
    """The rows of a shard quarantined by :func:`text_rejects`: their raw row numbers (sorted),
    the rule each breaks first, their raw ids (None for a null id), out of ``n`` rows."""

    path: str
    column: str
    n: int
    rows: np.ndarray
    rules: tuple
    ids: tuple
    share: float

    @property
    def count(self) -> int:
        return int(self.rows.size)

    def by_rule(self) -> dict:
        """{rule name: rows}, in the order of ``contract.QUARANTINE_RULES``."""
        out = {}
        for r in C.QUARANTINE_RULES:
            c = sum(1 for x in self.rules if x == r.name)
            if c:
                out[r.name] = c
        return out

    def table(self) -> pa.Table:
        ids = [None if i is None else str(i) for i in self.ids]
        return pa.table({"id": pa.array(ids, pa.string()),
                         "rule": pa.array(self.rules, pa.string()),
                         "row": pa.array(self.rows, pa.int64()),
                         "column": pa.array([self.column] * self.count, pa.string())},
                        schema=REJECTS_SCHEMA)

    def kept(self, start: int, n: int) -> np.ndarray | None:
        """Bool mask of the raw rows [start, start + n) that are not quarantined (None: all)."""
        lo, hi = np.searchsorted(self.rows, [start, start + n])
        if lo == hi:
            return None
        keep = np.ones(n, dtype=bool)
        keep[self.rows[lo:hi] - start] = False
        return keep


def text_rejects(uri, columns: Columns, share: float = C.DEFAULT_QUARANTINE_SHARE) -> TextRejects:
    """One streaming pass over the text column of ``uri``: the rows that break a row rule of
    the text (``contract.QUARANTINE_RULES``: null, not UTF-8, blank), each under the first rule
    it breaks. Up to ``share`` of the shard's rows (``count <= share * rows``) they are
    returned, to be quarantined; past it :class:`DataContractError` rejects the shard, naming
    the file, the column, the rule with the most rows, their count and first ids, and the
    count per rule."""
    if not 0.0 <= float(share) <= 1.0:
        raise ValueError(f"quarantine share must be in [0, 1], got {share!r}")
    path, column = str(uri), columns.text
    try:
        fs, p = storage.resolve(uri)
        src = fs.open_input_file(p)
    except FileNotFoundError as exc:
        raise storage.StorageError(f"{uri}: raw shard does not exist") from exc
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise DataContractError(path, RULE_READABLE, detail=str(exc)) from exc
    rows, rules, ids = [], [], []
    try:
        try:
            pf = pq.ParquetFile(src, buffer_size=1 << 20, pre_buffer=False)
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise DataContractError(path, RULE_READABLE, detail=str(exc)) from exc
        names = pf.schema_arrow.names
        if column is None or column not in names:
            raise DataContractError(path, RULE_PRESENT, column=column,
                                    detail=C.PRESENT.detail.format(names=names))
        t = pf.schema_arrow.field(column).type
        if C.TEXT_TYPE.arrow(t):
            raise DataContractError(path, C.TEXT_TYPE.name, column=column,
                                    detail=C.TEXT_TYPE.detail.format(type=t))
        n = pf.metadata.num_rows
        cols = [column] + ([columns.id] if columns.id in names and columns.id != column else [])
        start = 0
        batches = pf.iter_batches(batch_size=_BLOCK_ROWS, columns=cols, use_threads=False)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except (OSError, pa.ArrowException) as exc:
                raise DataContractError(path, RULE_READABLE, detail=str(exc)) from exc
            col = batch.column(column)
            broken = np.zeros(batch.num_rows, dtype=bool)
            for rule in C.QUARANTINE_RULES:
                if rule is C.TEXT_BLANK:  # on valid text only: decode what the others passed
                    ok = ~broken
                    if not ok.any():
                        break
                    text = col.filter(pa.array(ok))
                    if not pa.types.is_large_string(text.type):
                        text = text.cast(pa.large_binary()).cast(pa.large_string())
                    bad = np.zeros(batch.num_rows, dtype=bool)
                    bad[np.flatnonzero(ok)] = rule.mask(text)
                else:
                    bad = rule.mask(col) & ~broken
                where = np.flatnonzero(bad)
                if where.size:
                    broken |= bad
                    rows.append(where + start)
                    rules.append(np.full(where.size, rule.name, dtype=object))
                    if columns.id in batch.schema.names:
                        got = batch.column(columns.id).take(pa.array(where)).to_pylist()
                        ids.append(np.asarray(got + [None], dtype=object)[:-1])
                    else:
                        ids.append(np.full(where.size, None, dtype=object))
            start += batch.num_rows
    finally:
        src.close()
    if rows:
        order = np.argsort(np.concatenate(rows), kind="stable")
        rows_ = np.concatenate(rows)[order].astype(np.int64)
        rules_ = tuple(np.concatenate(rules)[order].tolist())
        ids_ = tuple(np.concatenate(ids)[order].tolist())
    else:
        rows_, rules_, ids_ = np.zeros(0, dtype=np.int64), (), ()
    out = TextRejects(path, column, int(n), rows_, rules_, ids_, float(share))
    if out.count and out.count <= share * n and columns.id in names:
        # the ids are the shard's structure: a quarantined row must not take a null or
        # repeated id out of the features, where the checks would no longer see it
        with fs.open_input_file(p) as fh:
            _ids(pq.ParquetFile(fh).read(columns=[columns.id]).column(columns.id), path,
                 columns.id)
    if out.count > share * n:
        counts = out.by_rule()
        worst = max(counts, key=counts.get)
        sel = [i for i, r in enumerate(out.rules) if r == worst][:MAX_IDS]
        named = [out.ids[i] for i in sel]
        per_rule = ", ".join(f"{r!r}: {c}" for r, c in counts.items())
        detail = (f"{out.count} of {n} rows ({out.count / max(1, n):.2%}) break the row rules of "
                  f"the text ({per_rule}), more than the quarantine share {share:.2%} "
                  f"({int(share * n)} rows): the shard is rejected; fix the rows, or raise the "
                  f"contract's quarantine_share to quarantine them")
        if all(i is not None for i in named):
            raise DataContractError(path, worst, column=column, ids=named, count=counts[worst],
                                    detail=detail)
        raise DataContractError(path, worst, column=column, count=counts[worst],
                                rows=out.rows[sel].tolist(), detail=detail)
    return out


def raw_row_numbers(features_uri, rows=None) -> np.ndarray | None:
    """The raw file's row numbers of the features file's rows ``rows`` (all when None): the
    features' ``raw_row`` column where rows were quarantined at ingestion, else the rows
    themselves (None when ``rows`` is None: the features are the raw file row for row)."""
    fs, p = storage.resolve(features_uri)
    with fs.open_input_file(p) as fh:
        pf = pq.ParquetFile(fh)
        if RAW_ROW not in pf.schema_arrow.names:
            return None if rows is None else np.asarray(rows, dtype=np.int64)
        col = pf.read(columns=[RAW_ROW]).column(RAW_ROW).to_numpy().astype(np.int64)
    return col if rows is None else col[np.asarray(rows, dtype=np.int64)]


def quarantined_rows(features_uri) -> tuple[int, int | None]:
    """(rows quarantined, raw rows) as the features file's footer records them ((0, None) for
    a file written without quarantine)."""
    fs, p = storage.resolve(features_uri)
    with fs.open_input_file(p) as fh:
        meta = pq.ParquetFile(fh).schema_arrow.metadata or {}
    q = int(meta.get(META_QUARANTINED, b"0"))
    raw = meta.get(META_RAW_ROWS)
    return q, None if raw is None else int(raw)
