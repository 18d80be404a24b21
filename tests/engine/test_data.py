"""The data contract: every violation gives one clear error (file, column, rule, ids)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask_pipeline.engine.data import (
    Columns,
    DataContractError,
    Shard,
    read_shard,
    table_to_shard,
)
from datamask_pipeline.engine.sample import make_table

N, D = 12, 4
IDS = list(range(100, 100 + N))


def _emb(n=N, d=D, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, d)).astype(np.float32) + 0.1


def _fixed(x, t=pa.float32()):
    x = np.asarray(x)
    return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), t), x.shape[1])


def good(**over) -> dict:
    """Columns of a valid shard; override any column by name (None drops it)."""
    cols = {
        "chunk_id": pa.array(IDS, pa.int64()),
        "quality_score": pa.array(np.linspace(0.1, 0.9, N)),
        "feature_arr": _fixed(_emb()),
        "text": pa.array([f"doc {i}" for i in IDS]),
    }
    for k, v in over.items():
        if v is None:
            cols.pop(k)
        else:
            cols[k] = v
    return cols


def _q_with(idx, values):
    q = np.linspace(0.1, 0.9, N)
    q[list(idx)] = values
    return pa.array(q)


def _list_emb(rows, t=pa.float32(), large=False):
    typ = pa.large_list(t) if large else pa.list_(t)
    return pa.array(rows, typ)


def _emb_rows_with(idx, value):
    x = _emb()
    x[list(idx), 1] = value
    return _fixed(x)


def _zero_rows(idx):
    x = _emb()
    x[list(idx)] = 0.0
    return _fixed(x)


def _ragged():
    rows = [list(map(float, r)) for r in _emb()]
    rows[3] = rows[3][:3]
    rows[7] = rows[7] + [1.0]
    return _list_emb(rows)


def _null_inside():
    rows = [list(map(float, r)) for r in _emb()]
    rows[4][2] = None
    return _list_emb(rows)


def _null_vec(idx):
    rows = [list(map(float, r)) for r in _emb()]
    for i in idx:
        rows[i] = None
    return _list_emb(rows)


def _dup_ids():
    ids = list(IDS)
    ids[5] = ids[2]
    ids[9] = ids[2]
    ids[10] = ids[8]
    return pa.array(ids, pa.int64())


ALL = list(range(N))

# name, columns, kwargs (Columns / expected_dim / quality_range), column, rule, ids, extra text
CASES = [
    ("missing_id", good(chunk_id=None), {}, "chunk_id", "column present", [],
     "available columns: ['quality_score', 'feature_arr', 'text']"),
    # (with the text column and quality_from_text, the default, the quality is scored from
    # the text instead: tests/engine/test_quality.py)
    ("missing_quality", good(quality_score=None), {"columns": Columns(quality_from_text=False)},
     "quality_score", "column present", [], "available columns"),
    ("missing_second_quality", good(), {"columns": Columns(quality=("quality_score", "edu"))},
     "edu", "column present", [], "available columns"),
    ("missing_embedding", good(feature_arr=None, text=None), {}, "feature_arr", "column present",
     [], "neither the embedding column 'feature_arr' nor a text column 'text'"),
    ("id_float", good(chunk_id=pa.array(np.arange(N, dtype=float))), {}, "chunk_id",
     "id column is integer or string", [], "double"),
    ("id_bool", good(chunk_id=pa.array([True] * N)), {}, "chunk_id",
     "id column is integer or string", [], "bool"),
    ("quality_string", good(quality_score=pa.array(["0.5"] * N)), {}, "quality_score",
     "quality column is numeric", [], "string"),
    ("quality_bool", good(quality_score=pa.array([True] * N)), {}, "quality_score",
     "quality column is numeric", [], "bool"),
    ("emb_strings", good(feature_arr=pa.array([["a", "b"]] * N)), {}, "feature_arr",
     "embedding column is a list of floats", [], "string"),
    ("emb_struct", good(feature_arr=pa.array([{"x": 1.0, "y": 2.0}] * N)), {}, "feature_arr",
     "embedding column is a list of floats", [], "struct"),
    ("emb_ints", good(feature_arr=pa.array([[1, 2, 3]] * N, pa.list_(pa.int32()))), {},
     "feature_arr", "embedding column is a list of floats", [], "int32"),
    ("emb_scalar", good(feature_arr=pa.array(np.ones(N))), {}, "feature_arr",
     "embedding column is a list of floats", [], "double"),
    ("null_ids", good(chunk_id=pa.array([None if i in (2, 5) else v for i, v in enumerate(IDS)],
                                        pa.int64())), {},
     "chunk_id", "non-null ids", [], "row numbers: [2, 5]"),
    ("duplicate_ids", good(chunk_id=_dup_ids()), {}, "chunk_id", "unique ids", [102, 108],
     "broken by 3 rows"),
    ("duplicate_string_ids",
     good(chunk_id=pa.array(["a", "b", "a"] + [f"x{i}" for i in range(N - 3)])), {},
     "chunk_id", "unique ids", ["a"], "broken by 1 row;"),
    ("uint64_overflow", good(chunk_id=pa.array([2**64 - 1] + list(range(1, N)), pa.uint64())),
     {}, "chunk_id", "integer ids fit in int64", [2**64 - 1], ""),
    ("null_quality", good(quality_score=pa.array([None, 0.5] * (N // 2), pa.float64())), {},
     "quality_score", "non-null quality", IDS[0::2], "broken by 6 rows"),
    ("nan_quality", good(quality_score=_q_with([3, 11], np.nan)), {}, "quality_score",
     "finite quality", [103, 111], "broken by 2 rows"),
    ("inf_quality", good(quality_score=_q_with([0, 4], [np.inf, -np.inf])), {}, "quality_score",
     "finite quality", [100, 104], ""),
    ("quality_out_of_range", good(quality_score=_q_with([1, 6], [1.5, -0.2])),
     {"quality_range": (0.0, 1.0)}, "quality_score", "quality in [0.0, 1.0]", [101, 106],
     "found min -0.2, max 1.5"),
    ("quality_below_open_range", good(quality_score=_q_with([9], -3.0)),
     {"quality_range": (0, None)}, "quality_score", "quality in [0, inf]", [109], ""),
    ("null_quality_second_column", good(edu=pa.array([1.0] * (N - 1) + [None])),
     {"columns": Columns(quality=("quality_score", "edu"), quality_weights=(1, 2))},
     "edu", "non-null quality", [111], ""),
    ("null_embedding", good(feature_arr=_null_vec([0, 8])), {}, "feature_arr",
     "non-null embeddings", [100, 108], "broken by 2 rows"),
    ("ragged_embedding", good(feature_arr=_ragged()), {}, "feature_arr",
     "equal embedding lengths", [103, 107], "most rows have length 4; others have [3, 5]"),
    ("wrong_dim_fixed", good(), {"expected_dim": 768}, "feature_arr", "embedding dimension 768",
     IDS[:10], "broken by 12 rows; ids: [100, 101, 102, 103, 104, 105, 106, 107, 108, 109]; found"),
    ("wrong_dim_variable", good(feature_arr=_ragged()), {"expected_dim": 4}, "feature_arr",
     "embedding dimension 4", [103, 107], "found length(s) [3, 5]"),
    ("empty_embeddings", good(feature_arr=_list_emb([[]] * N)), {}, "feature_arr",
     "non-empty embeddings", IDS[:10], "broken by 12 rows"),
    ("nan_embedding", good(feature_arr=_emb_rows_with([5, 9, 10], np.nan)), {}, "feature_arr",
     "finite embeddings", [105, 109, 110], "broken by 3 rows"),
    ("inf_embedding", good(feature_arr=_emb_rows_with([1], -np.inf)), {}, "feature_arr",
     "finite embeddings", [101], "broken by 1 row; ids: [101]"),
    ("null_inside_embedding", good(feature_arr=_null_inside()), {}, "feature_arr",
     "finite embeddings", [104], ""),
    ("float32_overflow", good(feature_arr=_fixed(np.where(np.eye(N, D) > 0, 1e300, 1.0),
                                                  pa.float64())), {},
     "feature_arr", "finite embeddings", [100, 101, 102, 103], "broken by 4 rows"),
    ("zero_embedding", good(feature_arr=_zero_rows([2, 6])), {}, "feature_arr",
     "non-zero embeddings", [102, 106], "broken by 2 rows"),
]


@pytest.mark.parametrize("name, cols, kw, column, rule, ids, extra", CASES,
                         ids=[c[0] for c in CASES])
def test_contract_violation(tmp_path, name, cols, kw, column, rule, ids, extra):
    table = pa.table(cols)
    path = str(tmp_path / f"{name}.parquet")
    pq.write_table(table, path)
    with pytest.raises(DataContractError) as ei:
        read_shard(path, **kw)
    e = ei.value
    msg = str(e)
    assert e.file == path and msg.startswith(f"{path}: column {column!r}: rule {rule!r} broken")
    assert e.column == column and e.rule == rule
    assert e.ids == ids
    if ids:
        assert f"ids: {ids}" in msg
    assert extra in msg
    assert msg.count("\n") == 0
    # the same check on the in-memory table gives the same error
    with pytest.raises(DataContractError) as ei2:
        table_to_shard(table, path, **kw)
    e2 = ei2.value
    assert (e2.file, e2.column, e2.rule, e2.ids, e2.rows, e2.count) == (
        e.file, e.column, e.rule, e.ids, e.rows, e.count)


def test_message_format_and_id_cap(tmp_path):
    x = _emb(30)
    x[[5, 9, 12]] = np.nan
    t = pa.table({"chunk_id": pa.array(np.arange(30)), "quality_score": np.ones(30),
                  "feature_arr": _fixed(x)})
    with pytest.raises(DataContractError) as ei:
        table_to_shard(t, "shard_007.parquet")
    assert str(ei.value).startswith(
        "shard_007.parquet: column 'feature_arr': rule 'finite embeddings' broken by 3 rows; "
        "ids: [5, 9, 12]"
    )
    q = np.ones(30)
    q[::2] = np.nan
    t = t.set_column(1, "quality_score", pa.array(q))
    with pytest.raises(DataContractError) as ei:
        table_to_shard(t, "s.parquet")
    assert ei.value.count == 15 and ei.value.ids == list(range(0, 20, 2))
    assert "broken by 15 rows; ids: [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]" in str(ei.value)


def test_zero_rows(tmp_path):
    t = pa.table(good()).slice(0, 0)
    p = str(tmp_path / "empty_rows.parquet")
    pq.write_table(t, p)
    with pytest.raises(DataContractError) as ei:
        read_shard(p)
    assert ei.value.rule == "at least one row" and ei.value.column is None
    assert str(ei.value).startswith(f"{p}: rule 'at least one row' broken")


def _unreadable_files(tmp_path):
    good_path = tmp_path / "ok.parquet"
    pq.write_table(pa.table(good()), good_path)
    blob = good_path.read_bytes()
    (tmp_path / "empty.parquet").write_bytes(b"")
    (tmp_path / "text.parquet").write_text("chunk_id,quality_score\n1,0.5\n")
    (tmp_path / "truncated.parquet").write_bytes(blob[: len(blob) // 2])
    (tmp_path / "no_footer.parquet").write_bytes(blob[:-8])
    (tmp_path / "dir.parquet").mkdir()
    return ["empty.parquet", "text.parquet", "truncated.parquet", "no_footer.parquet",
            "dir.parquet", "missing.parquet"]


def test_unreadable_files(tmp_path):
    for name in _unreadable_files(tmp_path):
        path = str(tmp_path / name)
        with pytest.raises(DataContractError) as ei:
            read_shard(path)
        e = ei.value
        assert e.rule == "not a readable parquet file" and e.column is None, name
        assert str(e).startswith(f"{path}: rule 'not a readable parquet file' broken; "), str(e)


# ------------------------------------------------------------------ happy paths
def _check(shard: Shard, ids, q, x):
    assert isinstance(shard, Shard)
    assert shard.n == len(ids) and shard.d == x.shape[1]
    assert shard.quality.dtype == np.float64 and shard.quality.shape == (len(ids),)
    assert shard.embeddings.dtype == np.float32 and shard.embeddings.shape == x.shape
    np.testing.assert_array_equal(shard.ids, np.asarray(ids, dtype=shard.ids.dtype))
    np.testing.assert_allclose(shard.quality, q, rtol=0, atol=1e-12)
    np.testing.assert_allclose(shard.embeddings, x.astype(np.float32), rtol=1e-3 if
                               x.dtype == np.float16 else 0, atol=0)


@pytest.mark.parametrize("kind", ["fixed32", "fixed64", "list32", "large_list64", "list16",
                                  "fixed16"])
def test_embedding_layouts(tmp_path, kind):
    x = _emb()
    if kind.endswith("16"):
        x = x.astype(np.float16)
        t = pa.float16()
    elif kind.endswith("64"):
        x = x.astype(np.float64)
        t = pa.float64()
    else:
        t = pa.float32()
    if kind.startswith("fixed"):
        arr = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), t), D)
    else:
        offsets = pa.array(np.arange(0, N * D + 1, D, dtype=np.int32 if kind.startswith("list")
                                     else np.int64))
        cls = pa.LargeListArray if kind.startswith("large") else pa.ListArray
        arr = cls.from_arrays(offsets, pa.array(x.reshape(-1), t))
    p = str(tmp_path / f"{kind}.parquet")
    pq.write_table(pa.table(good(feature_arr=arr)), p)
    shard = read_shard(p, expected_dim=D, quality_range=(0, 1))
    _check(shard, IDS, np.linspace(0.1, 0.9, N), x)


def test_weighted_and_unweighted_multi_quality(tmp_path):
    a = np.linspace(0, 1, N)
    b = np.arange(N, dtype=np.int32)  # integer quality is numeric too
    c = np.full(N, 0.25, dtype=np.float32)
    p = str(tmp_path / "multi.parquet")
    pq.write_table(pa.table(good(dclm=pa.array(a), edu=pa.array(b), wiki=pa.array(c))), p)
    cols = Columns(quality=("dclm", "edu", "wiki"), quality_weights=(2.0, 0.5, -1.0))
    _check(read_shard(p, columns=cols), IDS, 2 * a + 0.5 * b - 0.25, _emb())
    cols = Columns(quality=("dclm", "edu", "wiki"))
    _check(read_shard(p, columns=cols), IDS, a + b + 0.25, _emb())
    # the range applies to every quality column's raw values
    with pytest.raises(DataContractError, match="column 'edu': rule 'quality in \\[0, 1\\]'"):
        read_shard(p, columns=cols, quality_range=(0, 1))


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()])
def test_string_ids(tmp_path, typ):
    ids = [f"doc-{i:04d}" for i in range(N)]
    p = str(tmp_path / "s.parquet")
    pq.write_table(pa.table(good(chunk_id=pa.array(ids, typ))), p)
    shard = read_shard(p)
    assert shard.ids.dtype == object and shard.ids.tolist() == ids
    _check(shard, ids, np.linspace(0.1, 0.9, N), _emb())


def test_extra_reordered_and_renamed_columns(tmp_path):
    x = _emb()
    t = pa.table({
        "meta": pa.array([{"k": i} for i in range(N)]),
        "vec": _fixed(x),
        "junk": pa.array([["not", "floats"]] * N),  # would break the contract if it mattered
        "score": pa.array(np.linspace(0.1, 0.9, N)),
        "uid": pa.array(IDS, pa.int32()),
    })
    p = str(tmp_path / "odd.parquet")
    pq.write_table(t, p)
    cols = Columns(id="uid", quality="score", embedding="vec")
    assert cols.quality == ("score",)
    shard = read_shard(p, columns=cols)
    assert shard.ids.dtype == np.int64 and shard.columns is cols
    _check(shard, IDS, np.linspace(0.1, 0.9, N), x)


def test_chunked_and_sliced_tables_and_file_uri(tmp_path):
    t = pa.table(good())
    t = pa.concat_tables([t.slice(0, 5), t.slice(5, 4), t.slice(9)])
    assert t.column("feature_arr").num_chunks == 3
    _check(table_to_shard(t, "mem"), IDS, np.linspace(0.1, 0.9, N), _emb())
    rows = [list(map(float, r)) for r in _emb()]
    lt = pa.table(good(feature_arr=_list_emb(rows))).slice(3)  # list offsets not at zero
    _check(table_to_shard(lt, "mem"), IDS[3:], np.linspace(0.1, 0.9, N)[3:], _emb()[3:])
    p = tmp_path / "u.parquet"
    pq.write_table(t, p, row_group_size=5)
    _check(read_shard(p.as_uri()), IDS, np.linspace(0.1, 0.9, N), _emb())


def test_generated_shard_passes(tmp_path):
    p = str(tmp_path / "gen.parquet")
    pq.write_table(make_table(300, dim=32, seed=2), p)
    shard = read_shard(p, expected_dim=32, quality_range=(0, 1))
    assert shard.n == 300 and shard.d == 32 and shard.ids.dtype == np.int64


def test_columns_validation():
    with pytest.raises(ValueError, match="2 values for 1 quality columns"):
        Columns(quality_weights=(1.0, 2.0))
    with pytest.raises(ValueError, match="finite"):
        Columns(quality_weights=(float("nan"),))
    with pytest.raises(ValueError):
        Columns(quality=())
    assert Columns(quality=["a", "b"]).weights == (1.0, 1.0)
    e = DataContractError("f.parquet", "finite embeddings", column="x", ids=list(range(20)),
                          count=20)
    assert e.ids == list(range(10)) and isinstance(e, ValueError)
    assert os.path.basename(e.file) == "f.parquet"
