"""The hostile input corpus: malformed (and oddly shaped but valid) shards, generated in the
test from a valid 300-row, 16-d shard (``helpers.good_table``).

Each :class:`Case` writes one file and says what must happen:

* ``fragment`` is None: the shard is legitimately fine and must PASS through the engine CLI
  and the Dagster chain, the selected rows byte-for-byte equal to the raw rows;
* otherwise both must fail with a message containing ``fragment`` (the rule, in the data
  contract's wording), and ``stage`` names the Dagster step that stops it: ``ingest`` (the
  raw file cannot be mapped to the canonical features: nothing is written), ``check`` (a
  blocking DuckDB check fails: only the features file exists), ``mask`` (the shard satisfies
  the contract but no mask can be learned from it: no mask, no subset), ``select``.

Decisions recorded here (also in the README of this directory):

* negative quality and huge quality are legal unless a quality range is declared
  (``DataContract.quality_min/max``, ``--quality-min/--quality-max``); with a declared range,
  values outside it break rule ``quality in [lo, hi]``;
* quality so large that summing n of them overflows the learner's float32 arithmetic
  (|q|·n > 3.4e38) is refused by the learner's pre-flight before any work, naming the knob
  (the quality weights) - without it the learner silently produced NaN logits and dropped the
  highest-quality rows;
* a one-row shard satisfies the contract but cannot be selected from (k = 1 = n): it fails at
  the mask step with "a shard needs at least 2 rows";
* text that is not valid UTF-8 is fine in a *binary* column (carried byte for byte); in a
  *string* column it makes a file that breaks the Parquet spec and that DuckDB refuses to read
  (the corpus catalog's ``selected_rows`` view), so it is refused when the selected rows are
  copied (stage ``select``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .helpers import DIM, ROWS, good_table

ID, QUAL, EMB, TEXT = "chunk_id", "quality_score", "feature_arr", "text"


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[str], None]
    fragment: Optional[str] = None  # None: must pass
    stage: Optional[str] = None  # ingest | check | mask | select
    check: Optional[str] = None  # the failing blocking check (stage "check")
    expected_dim: Optional[int] = DIM
    quality_range: Optional[tuple] = None
    xfail: Optional[str] = None

    @property
    def passes(self) -> bool:
        return self.fragment is None

    def cli_args(self) -> list:
        out = []
        if self.expected_dim is not None:
            out += ["--expected-dim", str(self.expected_dim)]
        if self.quality_range is not None:
            lo, hi = self.quality_range
            if lo is not None:
                out += ["--quality-min", str(lo)]
            if hi is not None:
                out += ["--quality-max", str(hi)]
        return out

    def contract_kwargs(self) -> dict:
        lo, hi = self.quality_range or (None, None)
        return dict(expected_dim=self.expected_dim, quality_min=lo, quality_max=hi)


# ------------------------------------------------------------------ builders
def _table(fn):
    def build(path):
        pq.write_table(fn(good_table()), path)
    return build


def _bytes(fn):
    def build(path):
        with open(path, "wb") as fh:
            fh.write(fn())
    return build


def _good_bytes() -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(good_table(), sink)
    return sink.getvalue().to_pybytes()


def _set(t: pa.Table, name: str, arr) -> pa.Table:
    i = t.schema.get_field_index(name)
    return t.set_column(i, name, arr)


def _emb(t: pa.Table) -> np.ndarray:
    col = t.column(EMB).combine_chunks()
    return col.flatten().to_numpy().reshape(len(col), -1).astype(np.float64)


def _emb_rows(rows, typ=pa.float32()):
    return pa.array(rows, pa.list_(typ))


def _q(t: pa.Table) -> np.ndarray:
    return t.column(QUAL).to_numpy().astype(np.float64)


def _with_q(t, idx, values):
    q = _q(t)
    q[list(idx)] = values
    return _set(t, QUAL, pa.array(q))


def _with_emb_values(t, idx, col, value):
    x = _emb(t).astype(np.float32)
    x[list(idx), col] = value
    return _set(t, EMB, _emb_rows(x.tolist()))


def _invalid_utf8_strings(n, bad_rows) -> tuple:
    vals = [f"document {i}".encode() for i in range(n)]
    for i in bad_rows:
        vals[i] = b"caf\xe9 \xff\xfe broken \xc3\x28"
    return vals


def _string_array_unvalidated(vals) -> pa.Array:
    """A ``string`` array holding arbitrary bytes (what a buggy writer produces)."""
    data = b"".join(vals)
    offsets = np.cumsum([0] + [len(v) for v in vals]).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), len(vals),
                                 [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])


# rows made attractive to the selection (top quality) so that their odd cells are likely to
# be among the selected rows the tests compare byte for byte
ODD_ROWS = [0, 1, 2]


def _top_quality(t, rows=ODD_ROWS):
    return _with_q(t, rows, 1.0)


# ------------------------------------------------------------------ legitimately fine
def extra_columns(t):
    n = t.num_rows
    t = t.append_column("lang", pa.array(["en", "de", "fr"] * (n // 3)))
    t = t.append_column("meta", pa.array([{"a": i, "b": str(i)} for i in range(n)]))
    t = t.append_column("tags", pa.array([["x", "y"][: i % 3] for i in range(n)], pa.list_(pa.string())))
    t = t.append_column("score_2", pa.array(np.linspace(5, 6, n)))
    t = t.append_column("nothing", pa.nulls(n))
    return t


def reordered_columns(t):
    return t.select(list(reversed(t.schema.names)))


def negative_quality(t):
    return _set(t, QUAL, pa.array(_q(t) - 3.0))


def huge_quality_float32(t):
    return _set(t, QUAL, pa.array(_q(t) * 1e30))


def text_1mb_cell(t):
    t = _top_quality(t)
    text = t.column(TEXT).to_pylist()
    for i in ODD_ROWS:
        text[i] = (f"row {i} " + "lorem ipsum dolor sit amet " * 40_000)[: 1 << 20]
    return _set(t, TEXT, pa.array(text, pa.string()))


def text_binary_invalid_utf8(t):
    t = _top_quality(t)
    return _set(t, TEXT, pa.array(_invalid_utf8_strings(t.num_rows, ODD_ROWS), pa.binary()))


def string_ids_lookalike(t):
    ids = [f"doc-{i}" for i in range(t.num_rows)]
    ids[:8] = ["1", "01", "1.0", " 1", "\u0661", "", "x'; DROP TABLE features; --", 'a"b']
    return _set(t, ID, pa.array(ids, pa.string()))


# ------------------------------------------------------------------ broken
def missing_id(t):
    return t.drop_columns([ID])


def renamed_quality(t):
    # without the text: a text column would have its quality scored (engine.quality)
    return t.rename_columns(["chunk_id", "quality", "feature_arr", "text", "source"]).drop_columns(["text"])


def missing_embedding(t):
    return t.drop_columns([EMB, "text"])  # a text column would be embedded (engine.embed)


def id_float(t):
    return _set(t, ID, pa.array(np.arange(t.num_rows, dtype=np.float64)))


def quality_as_string(t):
    return _set(t, QUAL, pa.array([f"{v:.3f}" for v in _q(t)]))


def embedding_as_string(t):
    return _set(t, EMB, pa.array([json.dumps(r) for r in _emb(t).tolist()]))


def embedding_as_struct(t):
    x = _emb(t)
    return _set(t, EMB, pa.StructArray.from_arrays(
        [pa.array(x[:, j], pa.float32()) for j in range(x.shape[1])],
        names=[f"x{j}" for j in range(x.shape[1])]))


def mixed_type_ids(t):
    n = t.num_rows
    ints = pa.array([i if i % 2 else None for i in range(n)], pa.int64())
    strs = pa.array([None if i % 2 else f"id-{i}" for i in range(n)], pa.string())
    return _set(t, ID, pa.StructArray.from_arrays([ints, strs], names=["int", "str"]))


def uint64_overflow_ids(t):
    ids = np.arange(t.num_rows, dtype=np.uint64)
    ids[7] = np.uint64(2**64 - 1)
    return _set(t, ID, pa.array(ids, pa.uint64()))


def null_ids(t):
    ids = t.column(ID).to_pylist()
    ids[3] = ids[9] = None
    return _set(t, ID, pa.array(ids, pa.int64()))


def duplicate_ids(t):
    ids = t.column(ID).to_numpy().copy()
    ids[21], ids[41] = ids[20], ids[40]
    return _set(t, ID, pa.array(ids))


def nan_quality(t):
    return _with_q(t, [4, 8], np.nan)


def inf_quality(t):
    return _with_q(t, [4, 8], [np.inf, -np.inf])


def null_quality(t):
    q = _q(t).tolist()
    q[5] = None
    return _set(t, QUAL, pa.array(q, pa.float64()))


def huge_quality_overflow(t):
    return _with_q(t, [4, 8], 1e300)


def huge_quality_declared(t):
    return _with_q(t, [4], 1e6)


def nan_embedding(t):
    return _with_emb_values(t, [3, 7], 0, np.nan)


def inf_embedding(t):
    return _with_emb_values(t, [11], 5, np.inf)


def zero_embedding(t):
    x = _emb(t).astype(np.float32)
    x[[9, 10]] = 0.0
    return _set(t, EMB, _emb_rows(x.tolist()))


def null_embedding(t):
    rows = _emb(t).astype(np.float32).tolist()
    rows[6] = None
    return _set(t, EMB, _emb_rows(rows))


def ragged_embedding(t):
    rows = _emb(t).astype(np.float32).tolist()
    rows[4] = rows[4][:12]
    rows[8] = rows[8] + [0.5]
    return _set(t, EMB, _emb_rows(rows))


def wrong_dimension(t):
    rows = [r[:12] for r in _emb(t).astype(np.float32).tolist()]
    return _set(t, EMB, _emb_rows(rows))


def empty_embeddings(t):
    return _set(t, EMB, _emb_rows([[] for _ in range(t.num_rows)]))


def float32_overflow_embedding(t):
    x = _emb(t)
    x[13, 2] = 1e300
    return _set(t, EMB, _emb_rows(x.tolist(), pa.float64()))


def zero_rows(t):
    return t.slice(0, 0)


def one_row(t):
    return t.slice(0, 1)


def text_string_invalid_utf8(t):
    t = _top_quality(t)
    return _set(t, TEXT, _string_array_unvalidated(_invalid_utf8_strings(t.num_rows, ODD_ROWS)))


def _csv() -> bytes:
    return b"chunk_id,quality_score,feature_arr\n1,0.5,\"[0.1, 0.2]\"\n"


def _truncated() -> bytes:
    b = _good_bytes()
    return b[: len(b) // 2]


def _magic_garbage() -> bytes:
    rng = np.random.default_rng(0)
    return b"PAR1" + rng.bytes(4096) + b"\x10\x00\x00\x00PAR1"


READABLE = "rule 'not a readable parquet file'"

CASES = [
    # ---- must pass
    Case("extra_columns", _table(extra_columns)),
    Case("reordered_columns", _table(reordered_columns)),
    Case("negative_quality_no_range", _table(negative_quality)),
    Case("huge_quality_no_range", _table(huge_quality_float32)),
    Case("text_1mb_cell", _table(text_1mb_cell)),
    Case("text_binary_invalid_utf8", _table(text_binary_invalid_utf8)),
    Case("string_ids_lookalike", _table(string_ids_lookalike)),
    # ---- columns and types (ingestion cannot map them)
    Case("missing_id_column", _table(missing_id), "column 'chunk_id': rule 'column present'", "ingest"),
    Case("renamed_quality_column", _table(renamed_quality),
         "column 'quality_score': rule 'column present'", "ingest"),
    Case("missing_embedding_column", _table(missing_embedding),
         "column 'feature_arr': rule 'column present'", "ingest"),
    Case("id_float", _table(id_float), "rule 'id column is integer or string'", "ingest"),
    Case("quality_as_string", _table(quality_as_string), "rule 'quality column is numeric'", "ingest"),
    Case("embedding_as_string", _table(embedding_as_string),
         "rule 'embedding column is a list of floats'", "ingest"),
    Case("embedding_as_struct", _table(embedding_as_struct),
         "rule 'embedding column is a list of floats'", "ingest"),
    Case("mixed_type_ids", _table(mixed_type_ids), "rule 'id column is integer or string'", "ingest"),
    Case("uint64_ids_overflow", _table(uint64_overflow_ids), "rule 'integer ids fit in int64'", "ingest"),
    # ---- ids
    Case("null_ids", _table(null_ids), "rule 'non-null ids' broken by 2 rows", "check", "unique_ids"),
    Case("duplicate_ids", _table(duplicate_ids), "rule 'unique ids' broken by 2 rows", "check",
         "unique_ids"),
    # ---- quality
    Case("nan_quality", _table(nan_quality), "rule 'finite quality' broken by 2 rows; ids: [4, 8]",
         "check", "finite_quality"),
    Case("inf_quality", _table(inf_quality), "rule 'finite quality' broken by 2 rows; ids: [4, 8]",
         "check", "finite_quality"),
    Case("null_quality", _table(null_quality), "rule 'non-null quality' broken by 1 row; ids: [5]",
         "check", "finite_quality"),
    Case("negative_quality_declared_range", _table(negative_quality),
         "rule 'quality in [0.0, 1.0]' broken by 300 rows", "check", "finite_quality",
         quality_range=(0.0, 1.0)),
    Case("huge_quality_declared_range", _table(huge_quality_declared),
         "rule 'quality in [0.0, 1.0]' broken by 1 row; ids: [4]", "check", "finite_quality",
         quality_range=(0.0, 1.0)),
    Case("huge_quality_overflows_float32", _table(huge_quality_overflow),
         "overflow float32", "mask"),
    # ---- embeddings
    Case("nan_embedding", _table(nan_embedding), "rule 'finite embeddings' broken by 2 rows; ids: [3, 7]",
         "check", "finite_nonzero_embeddings"),
    Case("inf_embedding", _table(inf_embedding), "rule 'finite embeddings' broken by 1 row; ids: [11]",
         "check", "finite_nonzero_embeddings"),
    Case("all_zero_embedding", _table(zero_embedding),
         "rule 'non-zero embeddings' broken by 2 rows; ids: [9, 10]", "check",
         "finite_nonzero_embeddings"),
    Case("null_embedding", _table(null_embedding), "rule 'non-null embeddings' broken by 1 row; ids: [6]",
         "check", "finite_nonzero_embeddings"),
    Case("ragged_embedding", _table(ragged_embedding),
         "rule 'equal embedding lengths' broken by 2 rows; ids: [4, 8]", "check", "embedding_dim",
         expected_dim=None),
    Case("wrong_dimension", _table(wrong_dimension), f"rule 'embedding dimension {DIM}' broken by {ROWS} rows",
         "check", "embedding_dim"),
    Case("empty_embeddings", _table(empty_embeddings), "rule 'non-empty embeddings'", "check",
         "embedding_dim", expected_dim=None),
    Case("float32_overflow_embedding", _table(float32_overflow_embedding),
         "rule 'finite embeddings' broken by 1 row; ids: [13]", "check", "finite_nonzero_embeddings"),
    # ---- rows
    Case("zero_rows", _table(zero_rows), "rule 'at least one row'", "check", "non_empty"),
    Case("one_row", _table(one_row), "a shard needs at least 2 rows", "mask"),
    # ---- files
    Case("csv_named_parquet", _bytes(_csv), READABLE, "ingest"),
    Case("truncated_parquet", _bytes(_truncated), READABLE, "ingest"),
    Case("empty_file", _bytes(lambda: b""), READABLE, "ingest"),
    Case("garbage_between_magic", _bytes(_magic_garbage), READABLE, "ingest"),
    # ---- text
    Case("text_string_invalid_utf8", _table(text_string_invalid_utf8),
         "rule 'valid UTF-8 text' broken", "select"),
]

BY_NAME = {c.name: c for c in CASES}
assert len(BY_NAME) == len(CASES)
BAD = [c for c in CASES if not c.passes]
GOOD = [c for c in CASES if c.passes]
