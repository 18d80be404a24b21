"""The data contract has one home (``engine.contract``): the engine's reader and the pipeline's
DuckDB checks apply the same rules, under the same names, with predicates that agree, and the
README's table is rendered from them."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from assets.ingest import write_features
from assets.validate import CHECK_RULES, TABLE, _Context, q, run_checks, sql_string
from datamask_pipeline.engine import contract as C
from datamask_pipeline.engine import data
from datamask_pipeline.engine.data import Columns, DataContractError, read_shard
from resources.contract import DataContract

REPO = Path(__file__).resolve().parents[2]
N, D = 12, 4
IDS = list(range(100, 100 + N))


def test_rule_names_are_the_stable_strings():
    stable = {
        "RULE_READABLE": "not a readable parquet file", "RULE_PRESENT": "column present",
        "RULE_ID_TYPE": "id column is integer or string", "RULE_ID_INT64": "integer ids fit in int64",
        "RULE_QUALITY_TYPE": "quality column is numeric",
        "RULE_EMB_TYPE": "embedding column is a list of floats", "RULE_ROWS": "at least one row",
        "RULE_ID_NULL": "non-null ids", "RULE_ID_UNIQUE": "unique ids",
        "RULE_Q_NULL": "non-null quality", "RULE_Q_FINITE": "finite quality",
        "RULE_EMB_NULL": "non-null embeddings", "RULE_EMB_RAGGED": "equal embedding lengths",
        "RULE_EMB_EMPTY": "non-empty embeddings", "RULE_EMB_FINITE": "finite embeddings",
        "RULE_EMB_ZERO": "non-zero embeddings",
    }
    assert {k: getattr(data, k) for k in stable} == stable
    assert set(stable.values()) | {"quality in [{lo}, {hi}]", "embedding dimension {d}"} == set(C.BY_NAME)
    assert data.rule_quality_range(0.0, None) == "quality in [0.0, inf]"
    assert data.rule_quality_range(None, 1) == "quality in [-inf, 1]"
    assert data.rule_expected_dim(768) == "embedding dimension 768"
    assert Columns() == Columns(id="chunk_id", quality=("quality_score",), embedding="feature_arr")


def test_readme_table_is_rendered_from_the_rules():
    from tests.doc_pages import page

    section = page("contract.md").split("# The data contract", 1)[1].split("\n#", 1)[0]
    table = "".join(line + "\n" for line in section.splitlines() if line.startswith("|"))
    assert table == C.contract_table_markdown()
    assert len(table.splitlines()) == 2 + len(C.RULES)


def test_every_sql_rule_is_in_exactly_one_duckdb_check():
    in_checks = [r.name for rules in CHECK_RULES.values() for r in rules]
    assert sorted(in_checks) == sorted(r.name for r in C.RULES if r.sql is not None)
    # each check lists its rules in the engine's order
    order = [r.name for r in C.RULES]
    for rules in CHECK_RULES.values():
        idx = [order.index(r.name) for r in rules]
        assert idx == sorted(idx)


# ------------------------------------------------------------------ predicates agree
def _sql_mask(table: pa.Table, rule: C.Rule, column: str, **params) -> np.ndarray:
    """``rule``'s SQL predicate evaluated by DuckDB on every row of ``table`` (NULL = not broken,
    as in a WHERE clause)."""
    con = duckdb.connect()
    t = table.append_column("rn", pa.array(np.arange(table.num_rows)))
    con.register("t", t)
    where, args = rule.where(q(column), **params)
    if rule.scope == "groups":
        bad = {r[0] for r in con.execute(
            f"SELECT {q(column)} FROM t WHERE {q(column)} IS NOT NULL GROUP BY {q(column)} "
            f"HAVING {rule.sql}").fetchall()}
        return np.array([v in bad for v in table.column(column).to_pylist()])
    rows = con.execute(f"SELECT coalesce(({where}), false) FROM t ORDER BY rn", args).fetchall()
    return np.array([r[0] for r in rows], dtype=bool)


def _operand(col: pa.ChunkedArray, operand: str):
    """The numpy/pyarrow operand a ``rows`` rule takes (see ``contract.Rule``)."""
    if operand == "column":
        return col
    if operand == "values":
        return col.to_numpy().astype(np.float64)
    if operand == "lengths":
        return pc.list_value_length(col).to_numpy().astype(np.int64)
    flat = pc.fill_null(col.combine_chunks().flatten(), float("nan"))
    return flat.to_numpy(zero_copy_only=False).reshape(len(col), -1).astype(np.float32)


NAN, INF = float("nan"), float("inf")
# Edge values per operand, as the canonical features file holds them. The engine applies the
# value/length/vector rules only once the null rules passed: those tables hold no null row.
EDGE = {
    ("id", "column"): pa.array([1, None, 3, None, 5], pa.int64()),
    ("quality", "column"): pa.array([0.5, None, NAN, INF, None], pa.float64()),
    ("embedding", "column"): pa.array([[1.0], None, [], [None], None], pa.list_(pa.float32())),
    ("quality", "values"): pa.array([0.5, NAN, INF, -INF, 1e300, -1e-300, 0.0, -0.0, 1.0, 1.5,
                                     -0.2, 1.0000001], pa.float64()),
    ("embedding", "lengths"): pa.array([[1.0] * 4, [], [1.0] * 3, [1.0] * 4, [1.0] * 5,
                                        [0.0] * 4], pa.list_(pa.float32())),
    ("embedding", "vectors"): pa.array(
        [[1, 2, 3, 4], [NAN, 1, 1, 1], [1, INF, 1, 1], [1, 1, -INF, 1], [1, None, 1, 1],
         [0, 0, 0, 0], [-0.0, 0, 0, 0], [0, 0, 0, 1e-45], [0, 0, 0, NAN], [3e38, -3e38, 0, 0],
         [None, None, None, None]], pa.list_(pa.float32())),
}
PARAMS = {"lo": [(0.0, 1.0), (None, 1.0), (0.0, None), (0.5, 0.5)], "d": [(0,), (3,), (4,)]}
ROW_CASES = []
for _r in C.RULES:
    if _r.scope == "rows" and _r.sql is not None:
        for _values in (PARAMS["lo"] if "lo" in _r.params else PARAMS["d"] if _r.params else [()]):
            ROW_CASES.append(pytest.param(_r, dict(zip(_r.params, _values)),
                                          id=f"{_r.label}-{_values}"))


@pytest.mark.parametrize("rule, params", ROW_CASES)
def test_row_predicates_agree(rule, params):
    role = rule.columns[0]
    col = pa.chunked_array([EDGE[(role, rule.operand)]])
    engine = rule.mask(_operand(col, rule.operand), **params)
    sql = _sql_mask(pa.table({role: col}), rule, role, **params)
    assert engine.tolist() == sql.tolist()
    assert engine.any() and not engine.all()  # the edge values exercise both outcomes


def test_group_and_shard_predicates_agree():
    ids = pa.chunked_array([pa.array([1, 2, 1, 3, 3, 3, 4], pa.int64())])
    vc = pc.value_counts(ids)
    engine_dups = vc.field("values").filter(pa.array(C.ID_UNIQUE.mask(vc.field("counts").to_numpy())))
    sql = _sql_mask(pa.table({"id": ids}), C.ID_UNIQUE, "id")
    assert sorted(engine_dups.to_pylist()) == [1, 3]
    assert sql.tolist() == [v in (1, 3) for v in ids.to_pylist()]
    for n in (0, 1, 3):
        con = duckdb.connect()
        con.register("t", pa.table({"id": pa.array(range(n), pa.int64())}))
        assert con.execute(f"SELECT {C.ROWS.sql} FROM t").fetchall()[0][0] == C.ROWS.arrow(n) == (n == 0)


# ------------------------------------------------------------------ both readers, end to end
def _emb(x, t=pa.float32()):
    return pa.array([None if r is None else list(map(float, r)) for r in x], pa.list_(t))


def _vectors():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((N, D)) + 0.1).tolist()


def _good(**over) -> pa.Table:
    cols = {"chunk_id": pa.array(IDS, pa.int64()), "quality_score": pa.array(np.linspace(0.1, 0.9, N)),
            "feature_arr": _emb(_vectors()), "text": pa.array([f"doc {i}" for i in IDS])}
    cols.update(over)
    return pa.table({k: v for k, v in cols.items() if v is not None})


def _set_rows(col, idx, value):
    rows = list(col)
    for i in idx:
        rows[i] = value(rows[i]) if callable(value) else value
    return rows


def _q(idx, value):
    return pa.array(_set_rows(np.linspace(0.1, 0.9, N).tolist(), idx, value), pa.float64())


# rule name -> (raw shard breaking only that rule (a table, or bytes), contract settings)
BREAK = {
    C.READABLE.name: (b"PAR1 this is not parquet PAR1", {}),
    C.PRESENT.name: (_good(feature_arr=None, text=None), {}),  # no text to embed either
    C.ID_TYPE.name: (_good(chunk_id=pa.array(np.arange(N, dtype=float))), {}),
    C.QUALITY_TYPE.name: (_good(quality_score=pa.array(["0.5"] * N)), {}),
    C.EMB_TYPE.name: (_good(feature_arr=pa.array([[1, 2, 3, 4]] * N, pa.list_(pa.int32()))), {}),
    C.ROWS.name: (_good().slice(0, 0), {}),
    C.ID_NULL.name: (_good(chunk_id=pa.array(_set_rows(IDS, [2, 5], None), pa.int64())), {}),
    C.ID_INT64.name: (_good(chunk_id=pa.array([2**64 - 1] + IDS[1:], pa.uint64())), {}),
    C.ID_UNIQUE.name: (_good(chunk_id=pa.array(_set_rows(IDS, [5, 9], IDS[2]), pa.int64())), {}),
    C.Q_NULL.name: (_good(quality_score=_q([0, 7], None)), {}),
    C.Q_FINITE.name: (_good(quality_score=_q([3, 11], NAN)), {}),
    C.Q_RANGE.name: (_good(quality_score=_q([1, 6], 1.5)), {"quality_min": 0.0, "quality_max": 1.0}),
    C.EMB_NULL.name: (_good(feature_arr=_emb(_set_rows(_vectors(), [0, 8], None))), {}),
    C.EMB_DIM.name: (_good(feature_arr=_emb([r[:3] for r in _vectors()])), {"expected_dim": D}),
    C.EMB_RAGGED.name: (_good(feature_arr=_emb(_set_rows(_vectors(), [4], lambda r: r + [1.0]))), {}),
    C.EMB_EMPTY.name: (_good(feature_arr=_emb([[]] * N)), {}),
    C.EMB_FINITE.name: (_good(feature_arr=_emb(_set_rows(_vectors(), [5, 9], lambda r: [NAN] + r[1:]))), {}),
    C.EMB_ZERO.name: (_good(feature_arr=_emb(_set_rows(_vectors(), [2, 6], [0.0] * D), pa.float64())), {}),
}


def _write(shard, path):
    if isinstance(shard, bytes):
        Path(path).write_bytes(shard)
    else:
        pq.write_table(shard, path)


def _pipeline_failures(raw: str, features: str, settings: dict, key="p0") -> list:
    """What the pipeline reports on ``raw``: ingestion's error, else every failing rule of the
    blocking DuckDB checks as (check, rule, message, count, ids)."""
    contract = DataContract(**settings)
    try:
        write_features(raw, features, contract.columns())
    except DataContractError as exc:
        return [("ingest", exc.rule, str(exc), exc.count, exc.ids)]
    con = duckdb.connect()
    con.execute(f"CREATE TEMP VIEW {q(TABLE)} AS SELECT * FROM read_parquet({sql_string(features)})")
    results = run_checks(con, _Context(key, raw, features, contract))
    return [(check, *f) for check, fails in results.items() for f in fails or []]


def test_the_good_shard_passes_both(tmp_path):
    raw = str(tmp_path / "good.parquet")
    _write(_good(), raw)
    assert read_shard(raw, expected_dim=D, quality_range=(0.0, 1.0)).n == N
    assert _pipeline_failures(raw, str(tmp_path / "f.parquet"),
                              {"expected_dim": D, "quality_min": 0.0, "quality_max": 1.0}) == []


def test_every_rule_has_a_breaking_shard():
    assert list(BREAK) == [r.name for r in C.RULES]


@pytest.mark.parametrize("rule", C.RULES, ids=[r.name for r in C.RULES])
def test_both_readers_reject_with_the_same_rule(tmp_path, rule):
    """A shard breaking only ``rule`` is rejected by the engine's reader and by the pipeline
    (its DuckDB checks, or ingestion for the rules without SQL) under the same name, and for
    the SQL rules with the same message, counts and ids."""
    shard, settings = BREAK[rule.name]
    raw, features = str(tmp_path / "raw.parquet"), str(tmp_path / "features.parquet")
    _write(shard, raw)
    lo, hi = settings.get("quality_min"), settings.get("quality_max")
    qr = None if lo is None and hi is None else (lo, hi)
    name = rule.name.format(lo=lo, hi=hi, d=settings.get("expected_dim"))

    with pytest.raises(DataContractError) as ei:
        read_shard(raw, expected_dim=settings.get("expected_dim"), quality_range=qr)
    assert ei.value.rule == name, str(ei.value)

    failures = _pipeline_failures(raw, features, settings)
    assert [f[1] for f in failures] == [name], failures
    where, _rule, msg, count, ids = failures[0]
    if rule.sql is None:
        assert where == "ingest"
        return
    assert where != "ingest" and rule in CHECK_RULES[where]
    e = ei.value
    assert msg == f"partition 'p0': {e}; checked in {features}"
    assert (count or None, ids) == (e.count, e.ids)
