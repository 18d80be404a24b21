"""The data contract of an input shard: which columns, which types, which values.

A shard is a parquet file with one row per sample: an id column (integer or string, unique,
non-null), one or more numeric quality columns (summed, optionally weighted, into the quality
score q; the paper sums three classifier scores), and an embedding column (a list of floats of
one dimension d for every row). Any other columns (text, source, ...) are allowed and ignored
here; :func:`storage.write_selected_rows` carries them to the output unchanged.

Every violation raises one :class:`DataContractError` naming the file, the column, the rule and
up to 10 offending ids, e.g.::

    shard_000.parquet: column 'feature_arr': rule 'finite embeddings' broken by 3 rows; ids: [5, 9, 12]

All checks are vectorised (pyarrow.compute / numpy); nothing loops over rows in Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import storage

__all__ = ["DataContractError", "Columns", "Shard", "read_shard", "table_to_shard", "check_schema",
           "MAX_IDS"]

MAX_IDS = 10
_BLOCK_ROWS = 65536

# Rule names (stable strings: tests and callers match on them).
RULE_READABLE = "not a readable parquet file"
RULE_PRESENT = "column present"
RULE_ID_TYPE = "id column is integer or string"
RULE_ID_INT64 = "integer ids fit in int64"
RULE_QUALITY_TYPE = "quality column is numeric"
RULE_EMB_TYPE = "embedding column is a list of floats"
RULE_ROWS = "at least one row"
RULE_ID_NULL = "non-null ids"
RULE_ID_UNIQUE = "unique ids"
RULE_Q_NULL = "non-null quality"
RULE_Q_FINITE = "finite quality"
RULE_EMB_NULL = "non-null embeddings"
RULE_EMB_RAGGED = "equal embedding lengths"
RULE_EMB_EMPTY = "non-empty embeddings"
RULE_EMB_FINITE = "finite embeddings"
RULE_EMB_ZERO = "non-zero embeddings"


def rule_quality_range(lo, hi) -> str:
    return f"quality in [{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"


def rule_expected_dim(d: int) -> str:
    return f"embedding dimension {d}"


class DataContractError(ValueError):
    """A shard that breaks the data contract.

    Attributes: ``file``, ``column`` (None for file-level problems), ``rule``, ``ids`` (up to
    10 offending ids; empty when the ids themselves are null, see ``rows``), ``rows`` (up to
    10 offending row numbers), ``count`` (how many rows/ids break the rule), ``detail``."""

    def __init__(self, file, rule: str, column: str | None = None, ids=None, count=None,
                 unit: str = "rows", detail: str | None = None, rows=None):
        self.file = str(file)
        self.column = column
        self.rule = rule
        self.ids = list(ids or [])[:MAX_IDS]
        self.rows = list(rows or [])[:MAX_IDS]
        self.count = count
        self.detail = detail
        msg = f"{self.file}: "
        if column is not None:
            msg += f"column {column!r}: "
        msg += f"rule {rule!r} broken"
        if count is not None:
            if count == 1 and unit.endswith("s"):
                unit = unit[:-1]
            msg += f" by {count} {unit}"
        if self.ids:
            msg += f"; ids: {self.ids}"
        if self.rows:
            msg += f"; row numbers: {self.rows}"
        if detail:
            msg += f"; {detail}"
        super().__init__(msg)


@dataclass(frozen=True)
class Columns:
    """Column names of a shard. Several quality columns are summed, weighted by
    ``quality_weights`` (default all 1)."""

    id: str = "chunk_id"
    quality: tuple = ("quality_score",)
    quality_weights: tuple | None = None
    embedding: str = "feature_arr"

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
        for name in (self.id, self.embedding):
            if not isinstance(name, str) or not name:
                raise ValueError(f"column names must be non-empty strings, got {name!r}")

    @property
    def weights(self) -> tuple:
        return self.quality_weights if self.quality_weights is not None else (1.0,) * len(self.quality)

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

    @property
    def n(self) -> int:
        return int(self.embeddings.shape[0])

    @property
    def d(self) -> int:
        return int(self.embeddings.shape[1])


# ------------------------------------------------------------------ schema checks
def _is_string(t) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_list(t) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def check_schema(schema: pa.Schema, path: str, columns: Columns) -> None:
    """Raise DataContractError for a missing column or a column of the wrong type."""
    names = schema.names
    for c in columns.needed():
        if c not in names:
            raise DataContractError(path, RULE_PRESENT, column=c,
                                    detail=f"available columns: {names}")
    t = schema.field(columns.id).type
    if not (pa.types.is_integer(t) or _is_string(t)):
        raise DataContractError(path, RULE_ID_TYPE, column=columns.id, detail=f"found type {t}")
    for c in columns.quality:
        t = schema.field(c).type
        if not (pa.types.is_integer(t) or pa.types.is_floating(t)):
            raise DataContractError(path, RULE_QUALITY_TYPE, column=c, detail=f"found type {t}")
    t = schema.field(columns.embedding).type
    if not (_is_list(t) and pa.types.is_floating(t.value_type)):
        raise DataContractError(path, RULE_EMB_TYPE, column=columns.embedding,
                                detail=f"found type {t}")


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
    if n == 0:
        raise DataContractError(path, RULE_ROWS, detail="the shard has no rows")

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
    if arr.null_count:
        mask = arr.is_null().to_numpy(zero_copy_only=False)
        raise DataContractError(path, RULE_ID_NULL, column=name, count=int(mask.sum()),
                                rows=_first(mask).tolist())
    t = arr.type
    if pa.types.is_integer(t):
        if t == pa.uint64():
            too_big = pc.greater(arr, pa.scalar(np.iinfo(np.int64).max, pa.uint64()))
            mask = too_big.to_numpy(zero_copy_only=False)
            if mask.any():
                raise DataContractError(path, RULE_ID_INT64, column=name,
                                        ids=arr.filter(too_big).to_pylist()[:MAX_IDS],
                                        count=int(mask.sum()))
        ids = arr.cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    else:
        if pa.types.is_string_view(t):
            arr = arr.cast(pa.large_string())
        ids = arr.to_numpy(zero_copy_only=False).astype(object, copy=False)
    if len(pc.unique(arr)) != len(arr):
        vc = pc.value_counts(arr)
        dup = vc.field("values").filter(pc.greater(vc.field("counts"), 1))
        n_extra = int(pc.sum(vc.field("counts")).as_py()) - len(vc)
        raise DataContractError(path, RULE_ID_UNIQUE, column=name, ids=dup.to_pylist()[:MAX_IDS],
                                count=n_extra,
                                detail=f"{len(dup)} distinct ids occur more than once")
    return ids


def _quality(table: pa.Table, path: str, columns: Columns, quality_range, err) -> np.ndarray:
    lo, hi = (None, None) if quality_range is None else quality_range
    total = np.zeros(table.num_rows, dtype=np.float64)
    for name, w in zip(columns.quality, columns.weights):
        col = table.column(name)
        if col.null_count:
            raise err(RULE_Q_NULL, name, pc.is_null(col).to_numpy(zero_copy_only=False))
        q = pc.cast(col, pa.float64(), safe=False).to_numpy().astype(np.float64, copy=False)
        bad = ~np.isfinite(q)
        if bad.any():
            raise err(RULE_Q_FINITE, name, bad)
        if lo is not None or hi is not None:
            bad = np.zeros(q.shape, dtype=bool)
            if lo is not None:
                bad |= q < lo
            if hi is not None:
                bad |= q > hi
            if bad.any():
                found = f"found min {q.min():.6g}, max {q.max():.6g}"
                raise err(rule_quality_range(lo, hi), name, bad, detail=found)
        total += w * q
    bad = ~np.isfinite(total)
    if bad.any():  # only reachable by overflow of a huge weighted sum
        raise err(RULE_Q_FINITE, " + ".join(columns.quality), bad, detail="weighted sum overflows")
    return total


def _embeddings(col, path: str, name: str, n: int, expected_dim, err) -> np.ndarray:
    if isinstance(col, pa.Array):
        col = pa.chunked_array([col])
    t = col.type
    if col.null_count:
        raise err(RULE_EMB_NULL, name, pc.is_null(col).to_numpy(zero_copy_only=False))
    if pa.types.is_fixed_size_list(t):
        lengths = None
        d = int(t.list_size)
    else:
        lengths = pc.list_value_length(col).to_numpy().astype(np.int64, copy=False)
        vals, counts = np.unique(lengths, return_counts=True)
        d = int(vals[np.argmax(counts)])
    if expected_dim is not None:
        expected_dim = int(expected_dim)
        bad = (np.full(n, d != expected_dim) if lengths is None else lengths != expected_dim)
        if bad.any():
            found = d if lengths is None else sorted(set(np.unique(lengths[bad]).tolist()))[:MAX_IDS]
            raise err(rule_expected_dim(expected_dim), name, bad, detail=f"found length(s) {found}")
    if lengths is not None:
        bad = lengths != d
        if bad.any():
            raise err(RULE_EMB_RAGGED, name, bad,
                      detail=f"most rows have length {d}; others have "
                             f"{np.unique(lengths[bad]).tolist()[:MAX_IDS]}")
    if d == 0:
        raise err(RULE_EMB_EMPTY, name, np.ones(n, dtype=bool))

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
        nonfinite[s:s + _BLOCK_ROWS] = ~np.isfinite(blk).all(axis=1)
        zero[s:s + _BLOCK_ROWS] = ~blk.any(axis=1)
    if nonfinite.any():
        raise err(RULE_EMB_FINITE, name, nonfinite,
                  detail="NaN, Inf, null or float32 overflow inside the vector")
    if zero.any():
        raise err(RULE_EMB_ZERO, name, zero)
    return out


# ------------------------------------------------------------------ files
def read_shard(uri, columns: Columns = Columns(), expected_dim=None, quality_range=None) -> Shard:
    """Read and validate one parquet shard (only the id, quality and embedding columns)."""
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
        check_schema(schema, path, columns)
        try:
            table = pf.read(columns=columns.needed())
        except (OSError, pa.ArrowException, ValueError) as exc:
            raise DataContractError(path, RULE_READABLE, detail=str(exc)) from exc
    finally:
        src.close()
    return table_to_shard(table, path, columns, expected_dim=expected_dim,
                          quality_range=quality_range)
