"""The data contract's rules in one place: each rule's stable name (matched by tests and users),
its column, a one-line description and its predicate in both forms it runs in: vectorised
numpy/pyarrow (``engine.data``) and DuckDB SQL (the pipeline's checks, ``assets/validate.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["Rule", "RULES", "BY_NAME", "ID", "QUALITY", "EMBEDDING", "DEFAULT_NAMES",
           "rule_quality_range", "rule_expected_dim", "contract_table_markdown",
           "TEXT", "TEXT_RULES", "text_contract_table_markdown", "QUARANTINE_RULES",
           "DEFAULT_QUARANTINE_SHARE"]

# Column roles. The raw shard's names come from ``data.Columns`` (defaults below); the pipeline's
# canonical features file uses the role names themselves.
ID, QUALITY, EMBEDDING = "id", "quality", "embedding"
# TEXT: the column a text-only shard (no embedding column) is embedded from (``engine.embed``).
TEXT = "text"
DEFAULT_NAMES = {ID: "chunk_id", QUALITY: "quality_score", EMBEDDING: "feature_arr", TEXT: "text"}

SCOPES = ("file", "type", "shard", "rows", "groups")
OPERANDS = ("column", "values", "lengths", "vectors")


@dataclass(frozen=True)
class Rule:
    """One rule of the contract. Both predicates are True where the rule is BROKEN.

    ``scope`` says what they look at:

    * ``file``: the file itself (it cannot be read); no predicate.
    * ``type``: ``arrow(t)`` on a column's Arrow type, None when the column is missing. No SQL:
      the pipeline checks these while ingesting the raw file (with ``data.check_schema``).
    * ``shard``: ``arrow(n_rows)``; ``sql`` an aggregate over the whole table.
    * ``rows``: ``arrow(operand, *params)`` -> one bool per row; ``sql`` a WHERE predicate with
      ``{c}`` for the quoted column and ``?`` for the ``params`` in order. ``operand`` is
      ``column`` (the Arrow column), ``values`` (float64 numpy), ``lengths`` (int64 list lengths)
      or ``vectors`` (float32 (n, d), a null value read as NaN). ``sql`` None: the canonical
      features file cannot hold the violation, so ingestion refuses it.
    * ``groups``: ``arrow(counts)`` over the groups of equal non-null values -> one bool per
      group; ``sql`` the HAVING predicate of ``GROUP BY {c}``.

    ``name`` is a ``str.format`` template for the parametrised rules (``{lo}``, ``{hi}``,
    ``{d}``); ``detail`` the template of the text after the rule in the message, if any.
    """

    name: str
    columns: tuple
    scope: str
    description: str
    arrow: Optional[Callable] = None
    sql: Optional[str] = None
    operand: Optional[str] = None
    params: tuple = ()
    detail: Optional[str] = None

    def __post_init__(self):
        if self.scope not in SCOPES or (self.operand in OPERANDS) != (self.scope == "rows"):
            raise ValueError(f"rule {self.name!r}: bad scope {self.scope!r} / operand {self.operand!r}")

    def mask(self, operand, **params) -> np.ndarray:
        """The vectorised predicate as a numpy bool array (True: broken)."""
        out = self.arrow(operand, *(params[p] for p in self.params))
        if isinstance(out, (pa.Array, pa.ChunkedArray)):
            out = pc.fill_null(out, False).to_numpy(zero_copy_only=False)
        return np.asarray(out, dtype=bool)

    def where(self, column: str, **params) -> tuple[str, list]:
        """The SQL predicate on ``column`` (a quoted identifier) and its parameters."""
        return self.sql.format(c=column), [params[p] for p in self.params]

    @property
    def label(self) -> str:
        """The name as the README shows it (parameters as plain words)."""
        return self.name.replace("{", "").replace("}", "")


# ------------------------------------------------------------------ predicates
def _is_string(t) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def _is_list(t) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def _beyond_int64(col):
    if col.type != pa.uint64():  # the only integer type with values beyond int64
        return np.zeros(len(col), dtype=bool)
    return pc.greater(col, pa.scalar(np.iinfo(np.int64).max, pa.uint64()))


def _outside(q, lo, hi):
    out = np.zeros(q.shape, dtype=bool)
    if lo is not None:
        out |= q < lo
    if hi is not None:
        out |= q > hi
    return out & np.isfinite(q)


# ------------------------------------------------------------------ the rules
R = Rule
READABLE = R("not a readable parquet file", (), "file", "the file opens and reads as parquet")
PRESENT = R(
    "column present", (ID, QUALITY, EMBEDDING), "type",
    "the id, quality and embedding columns exist, or instead of the embedding column the "
    "text column `text`, which is then embedded (see *Text-only shards*), and instead of the "
    "quality column(s) the text column, from which the quality is scored (see *Quality from "
    "text*); any other column (`source`, …) is allowed, not checked, and copied untouched to "
    "the selected subset",
    arrow=lambda t: t is None, detail="available columns: {names}")
ID_TYPE = R("id column is integer or string", (ID,), "type", "ids are integers or strings",
            arrow=lambda t: not (pa.types.is_integer(t) or _is_string(t)),
            detail="found type {type}")
QUALITY_TYPE = R(
    "quality column is numeric", (QUALITY,), "type",
    "each quality column is integer or float; several are summed, optionally weighted (the "
    "paper sums DCLM + FineWeb-Edu + Wiki scores)",
    arrow=lambda t: not (pa.types.is_integer(t) or pa.types.is_floating(t)),
    detail="found type {type}")
EMB_TYPE = R("embedding column is a list of floats", (EMBEDDING,), "type",
             "embeddings are lists, large lists or fixed-size lists of float16/32/64",
             arrow=lambda t: not (_is_list(t) and pa.types.is_floating(t.value_type)),
             detail="found type {type}")
ROWS = R("at least one row", (), "shard", "the shard has at least one row",
         arrow=lambda n: n == 0, sql="count(*) = 0", detail="the shard has no rows")
ID_NULL = R("non-null ids", (ID,), "rows", "no id is null",
            arrow=pc.is_null, sql="{c} IS NULL", operand="column")
ID_INT64 = R("integer ids fit in int64", (ID,), "rows", "unsigned integer ids are at most 2^63 - 1",
             arrow=_beyond_int64, operand="column")
ID_UNIQUE = R("unique ids", (ID,), "groups", "no id occurs more than once",
              arrow=lambda counts: counts > 1, sql="count(*) > 1",
              detail="{groups} distinct ids occur more than once")
Q_NULL = R("non-null quality", (QUALITY,), "rows", "no quality value is null",
           arrow=pc.is_null, sql="{c} IS NULL", operand="column")
Q_FINITE = R("finite quality", (QUALITY,), "rows", "every quality value is finite (no NaN, ±Inf)",
             arrow=lambda q: ~np.isfinite(q), sql="{c} IS NOT NULL AND NOT isfinite({c})",
             operand="values")
# A NULL bound makes its comparison NULL, i.e. no bound, as None does in ``_outside``.
Q_RANGE = R("quality in [{lo}, {hi}]", (QUALITY,), "rows",
            "every quality value lies in the declared range, inclusive (only when one is "
            "declared: `DATAMASK_QUALITY_MIN/MAX`)",
            arrow=_outside, sql="isfinite({c}) AND ({c} < ? OR {c} > ?)", operand="values",
            params=("lo", "hi"), detail="found min {min:.6g}, max {max:.6g}")
EMB_NULL = R("non-null embeddings", (EMBEDDING,), "rows", "no embedding is null",
             arrow=pc.is_null, sql="{c} IS NULL", operand="column")
EMB_DIM = R("embedding dimension {d}", (EMBEDDING,), "rows",
            "every embedding has the declared dimension d (only when one is declared: "
            "`DATAMASK_EMBEDDING_DIM`; 768 in the paper)",
            arrow=lambda lengths, d: lengths != d, sql="{c} IS NOT NULL AND len({c}) <> ?",
            operand="lengths", params=("d",), detail="found length(s) {found}")
# d here is the shard's most common length (the smallest one on a tie).
EMB_RAGGED = R("equal embedding lengths", (EMBEDDING,), "rows",
               "every embedding has the same length d",
               arrow=lambda lengths, d: lengths != d, sql="{c} IS NOT NULL AND len({c}) <> ?",
               operand="lengths", params=("d",),
               detail="most rows have length {d}; others have {others}")
EMB_EMPTY = R("non-empty embeddings", (EMBEDDING,), "rows", "every embedding has at least one value",
              arrow=lambda lengths: lengths == 0, sql="{c} IS NOT NULL AND len({c}) = 0",
              operand="lengths")
EMB_FINITE = R(
    "finite embeddings", (EMBEDDING,), "rows",
    "every embedding value is finite as float32 (no NaN, ±Inf, null, or float64 beyond "
    "float32's range)",
    arrow=lambda x: ~np.isfinite(x).all(axis=1),
    # a null value inside (list_count skips nulls), or a NaN / Inf that makes the DOUBLE sum
    # non-finite (a sum of float32 values in DOUBLE cannot overflow); vectorised list
    # functions instead of a per-value lambda
    sql="{c} IS NOT NULL AND (list_count({c}) < len({c}) OR NOT isfinite(list_sum({c})))",
    operand="vectors", detail="NaN, Inf, null or float32 overflow inside the vector")
EMB_ZERO = R("non-zero embeddings", (EMBEDDING,), "rows", "no embedding is all zeros",
             arrow=lambda x: ~x.any(axis=1),
             sql="{c} IS NOT NULL AND len({c}) > 0 AND list_count({c}) = len({c}) AND "
                 "list_min({c}) = 0 AND list_max({c}) = 0",
             operand="vectors")
del R

# In the order the engine checks them (it stops at the first rule broken).
RULES = (READABLE, PRESENT, ID_TYPE, QUALITY_TYPE, EMB_TYPE, ROWS, ID_NULL, ID_INT64, ID_UNIQUE,
         Q_NULL, Q_FINITE, Q_RANGE, EMB_NULL, EMB_DIM, EMB_RAGGED, EMB_EMPTY, EMB_FINITE, EMB_ZERO)
BY_NAME = {r.name: r for r in RULES}
assert len(BY_NAME) == len(RULES)


def rule_quality_range(lo, hi) -> str:
    """The name of the declared-range rule; an open end shows as ∓inf."""
    return Q_RANGE.name.format(lo="-inf" if lo is None else lo, hi="inf" if hi is None else hi)


def rule_expected_dim(d: int) -> str:
    return EMB_DIM.name.format(d=d)


def contract_table_markdown() -> str:
    """The README's data contract table, one row per rule, in the engine's order."""
    lines = ["| rule (as in error messages) | column (default name) | requirement |",
             "|---|---|---|"]
    for r in RULES:
        where = ", ".join(f"`{DEFAULT_NAMES[c]}`" for c in r.columns)
        where = where or ("the file" if r.scope == "file" else "the shard")
        lines.append(f"| `{r.label}` | {where} | {r.description} |")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ text-only shards
# A shard without its embedding column but with a text column is embedded from the text
# (``engine.embed``); one without its quality column(s) is scored from the text
# (``engine.quality``). These rules apply to that text, while it is embedded or scored, and only
# then (a shard that carries embeddings and quality never has its text read). A bad text is
# never scored 0, embedded or silently dropped. Empty and whitespace-only text are one rule,
# ``non-blank text``; binary text is decoded as UTF-8 under ``text is valid UTF-8`` (a string
# column can break it too: parquet writers do not all validate UTF-8). None has SQL: the
# canonical features file holds no text. The policy: the engine's reader (``read_shard``, the
# ``train_mask`` CLI) rejects the shard, naming the rows; the pipeline's ingestion quarantines
# the rows that break a row rule (``QUARANTINE_RULES``) to a rejects file, up to a share of the
# shard (``DEFAULT_QUARANTINE_SHARE``, the contract's ``quarantine_share``), and rejects the shard
# past it. A very long document is no violation: it is truncated at the embedding model's token
# limit (``max_tokens``), or embedded window by window and averaged when the pooling is
# ``chunks``; the number of truncated rows is reported.
def _is_binary(t) -> bool:
    return pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)


def _invalid_utf8(col) -> np.ndarray:
    """True where a value is not valid UTF-8 (a vectorised validation first; the per-value
    decode runs only when it fails, to name the rows)."""
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    try:
        col.cast(pa.large_string()).validate(full=True)
        return np.zeros(len(col), dtype=bool)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        pass
    out = np.zeros(len(col), dtype=bool)
    for i, v in enumerate(col.cast(pa.large_binary()).to_pylist()):
        if v is not None:
            try:
                v.decode("utf-8")
            except UnicodeDecodeError:
                out[i] = True
    return out


def _blank(col):
    """True where a (valid UTF-8) text is empty or whitespace only."""
    return pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(col)), 0)


R = Rule
TEXT_TYPE = R("text column is a string", (TEXT,), "type",
              "a text-only shard's text is a string column (binary is decoded as UTF-8)",
              arrow=lambda t: not (_is_string(t) or _is_binary(t)), detail="found type {type}")
TEXT_NULL = R("non-null text", (TEXT,), "rows", "no text is null",
              arrow=pc.is_null, operand="column")
TEXT_UTF8 = R("text is valid UTF-8", (TEXT,), "rows",
              "every text decodes as UTF-8 (binary columns are decoded; string columns are "
              "UTF-8 by type, but a writer can store invalid bytes)",
              arrow=_invalid_utf8, operand="column")
TEXT_BLANK = R("non-blank text", (TEXT,), "rows",
               "no text is empty or whitespace only: it would embed to a zero or meaningless "
               "vector, so such a row is never embedded (quarantined by the pipeline's "
               "ingestion, up to quarantine_share; named by train_mask)",
               arrow=_blank, operand="column")
del R

# In the order ``engine.embed`` checks them (after the id and quality columns' own rules).
TEXT_RULES = (TEXT_TYPE, TEXT_NULL, TEXT_UTF8, TEXT_BLANK)
assert not set(r.name for r in TEXT_RULES) & set(BY_NAME)
# The row rules of the text whose rows the pipeline's ingestion quarantines (``engine.data.
# text_rejects``), in this order (a row is recorded under the first rule it breaks), up to
# this share of the shard's rows. Every other rule, and these past the share, rejects the shard:
# ids (null, duplicate), types and embedding dimensions are the shard's structure, not a row's.
QUARANTINE_RULES = (TEXT_NULL, TEXT_UTF8, TEXT_BLANK)
DEFAULT_QUARANTINE_SHARE = 0.01

# When a shard has neither its embedding column nor a text column: the ``column present``
# rule's message names both.
NO_EMBEDDING_NOR_TEXT = ("neither the embedding column {embedding!r} nor a text column {text!r} "
                         "to compute embeddings from exists; available columns: {names}")


def text_contract_table_markdown() -> str:
    """The README's table of the text rules (text-only shards), in the order they apply."""
    lines = ["| rule (as in error messages) | column (default name) | requirement |",
             "|---|---|---|"]
    for r in TEXT_RULES:
        lines.append(f"| `{r.label}` | `{DEFAULT_NAMES[TEXT]}` | {r.description} |")
    return "\n".join(lines) + "\n"
