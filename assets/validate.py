"""Validation: blocking DuckDB checks on the features parquet of a shard.

One multi-check step per partition opens its own in-memory DuckDB database (``":memory:"``
through ``DuckDBResource``), so parallel partitions never share a DuckDB file. A local
features file is read by DuckDB's own parquet reader (streaming: memory flat in the shard size);
on object storage it is read through a pyarrow dataset registered with the connection, which
needs no DuckDB extension (but DuckDB's Arrow scan holds what it scanned: memory grows with the
shard). Identifiers are quoted; values are passed as parameters (the file path of the view is
a quoted literal: DDL takes no parameters).

Every check is blocking: when one fails, the run's downstream steps (mask learning, the
selected subset) do not run, so a bad shard never reaches the GPU. The checks are partitioned
like ``features``: each shard keeps its own result per check (:func:`latest_check_status`,
:func:`latest_check_records` read them back), so a failed shard blocks only its own run and
never overwrites another shard's result. A failing check says which
partition, file, column and rule, how many rows break it and up to 10 offending ids, in the
engine's wording (``engine.data.DataContractError``). The rules, their names, descriptions and
SQL predicates come from ``engine.contract``, the same rules the engine's reader applies::

    partition 'shard_007': data/raw/shard_007.parquet: column 'feature_arr': rule 'finite
    embeddings' broken by 2 rows; ids: [17, 301]; checked in data/features/shard_007.parquet
"""


import os
import warnings

import dagster as dg
import pyarrow as pa
from dagster_duckdb import DuckDBResource

from datamask_pipeline.automation import CHECK_CONDITION
from datamask_pipeline.engine import contract as C
from datamask_pipeline.engine import storage
from datamask_pipeline.engine.contract import rule_expected_dim, rule_quality_range
from datamask_pipeline.engine.data import RAW_ROW, MAX_IDS, DataContractError, quarantined_rows
from resources.contract import DataContract
from resources.storage import DataRoot

from .ingest import EMBEDDING, ID, QUALITY, features
from .partitions import shards

TABLE = "features"
# DuckDB memory limit of one validation step unless the duckdb resource's connection_config
# sets one: bounds the checks' memory whatever the shard size (the unique-id hash table needs
# about 45 bytes per row).
VALIDATION_MEMORY_LIMIT = "1GB"
RULE_SCHEMA = "canonical features schema"
EXPECTED_TYPES = {ID: ("BIGINT", "VARCHAR"), QUALITY: ("DOUBLE",), EMBEDDING: ("FLOAT[]",)}
# The columns a features file has only sometimes: when ingestion quarantined rows
# (``engine.data.RAW_ROW``), each row's row number in the raw file; when the heuristic scored the
# quality from the text, each row's language (``engine.quality``).
OPTIONAL_TYPES = {RAW_ROW: ("BIGINT",), "language": ("VARCHAR",)}

# The contract's rules each value check evaluates, in the engine's order: every rule with a SQL
# form, each in one check (the others are enforced while ingesting the raw file).
CHECK_RULES = {
    "non_empty": (C.ROWS,),
    "unique_ids": (C.ID_NULL, C.ID_UNIQUE),
    "finite_quality": (C.Q_NULL, C.Q_FINITE, C.Q_RANGE),
    "embedding_dim": (C.EMB_DIM, C.EMB_RAGGED, C.EMB_EMPTY),
    "finite_nonzero_embeddings": (C.EMB_NULL, C.EMB_FINITE, C.EMB_ZERO),
}


def _describe(rules) -> str:
    text = "; ".join(r.description for r in rules)
    return text[0].upper() + text[1:] + "."


CHECKS = {
    "schema": "The features parquet has exactly the canonical columns: id (BIGINT or VARCHAR), "
              "quality (DOUBLE), embedding (FLOAT[]), and raw_row (BIGINT) when ingestion "
              "quarantined rows.",
    **{name: _describe(rules) for name, rules in CHECK_RULES.items()},
}


CHECK_KEYS = [dg.AssetCheckKey(features.key, name) for name in CHECKS]


def latest_check_status(instance: dg.DagsterInstance, partition_keys=None) -> dict:
    """``{shard: {check name: status}}``, the latest result of every check per shard as the
    instance stores it (status ``"SUCCEEDED"``, ``"FAILED"`` or ``"PLANNED"``; a shard never
    checked is absent). One query per check, whatever the number of shards."""
    out: dict = {}
    infos = instance.event_log_storage.get_asset_check_partition_info(
        CHECK_KEYS, partition_keys=list(partition_keys) if partition_keys is not None else None)
    for info in infos:
        if info.partition_key is not None:
            out.setdefault(info.partition_key, {})[info.check_key.name] = info.latest_execution_status.value
    return out


def latest_check_records(instance: dg.DagsterInstance, key: str) -> dict:
    """``{check name: AssetCheckExecutionRecord}``: the latest record of every check for shard
    ``key``; ``record.evaluation`` holds ``passed``, ``description`` (the rules broken, in the
    engine's words) and ``metadata`` (``rules_broken``, ``offending_ids``, ...)."""
    from dagster._core.event_api import PartitionKeyFilter  # what the UI's per-partition view uses

    out = {}
    for check_key in CHECK_KEYS:
        records = instance.event_log_storage.get_asset_check_execution_history(
            check_key, limit=1, partition_filter=PartitionKeyFilter(key=key))
        if records:
            out[check_key.name] = records[0]
    return out


def q(name: str) -> str:
    """A quoted SQL identifier."""
    return '"' + str(name).replace('"', '""') + '"'


def sql_string(value: str) -> str:
    """A SQL string literal (DDL such as CREATE VIEW cannot take parameters)."""
    return "'" + str(value).replace("'", "''") + "'"


T, I, Q, E = q(TABLE), q(ID), q(QUALITY), q(EMBEDDING)
# A contract role's column in the canonical features file.
COLUMN = {C.ID: ID, C.QUALITY: QUALITY, C.EMBEDDING: EMBEDDING}
# Row numbers in file order (DuckDB preserves insertion order for a single scan).
NUMBERED = f"(SELECT row_number() OVER () - 1 AS rn, * FROM {T})"


class _Context:
    """What a rule needs to describe a failure in the engine's words."""

    def __init__(self, key, raw_uri, features_uri, contract: DataContract):
        self.key = key
        self.raw_uri = str(raw_uri)
        self.features_uri = str(features_uri)
        self.contract = contract
        self.raw_col = {ID: contract.id_column, QUALITY: " + ".join(contract.quality_columns),
                        EMBEDDING: contract.embedding_column}
        # {(predicate, params): offending rows}, counted for many rules in one scan, and the
        # embedding lengths' (min, max, non-null count) from the same scan
        self.counts: dict = {}
        self.lengths: tuple | None = None

    def message(self, rule, column=None, ids=None, count=None, unit="rows", detail=None, rows=None):
        extra = f"checked in {self.features_uri}"
        detail = f"{detail}; {extra}" if detail else extra
        err = DataContractError(self.raw_uri, rule, column=self.raw_col.get(column, column),
                                ids=ids, count=count, unit=unit, detail=detail, rows=rows)
        return f"partition {self.key!r}: {err}"


def _offenders(con, where: str, params=(), count=None) -> tuple[int, list, list]:
    """(count, first ids, first row numbers) of rows matching ``where`` (``count``: already
    known, e.g. from ``prefetch_counts``)."""
    if count is None:
        count = con.execute(f"SELECT count(*) FROM {T} WHERE {where}", list(params)).fetchall()[0][0]
    if not count:
        return 0, [], []
    rows = con.execute(
        f"SELECT rn, {I} FROM {NUMBERED} WHERE {where} ORDER BY rn LIMIT ?", [*params, MAX_IDS]
    ).fetchall()
    return int(count), [r[1] for r in rows if r[1] is not None], [int(r[0]) for r in rows]


def check_schema(con, ctx: _Context) -> list:
    cols = con.execute(f"DESCRIBE SELECT * FROM {T}").fetchall()
    found = {c[0]: c[1] for c in cols}
    problems = []
    for name, types in EXPECTED_TYPES.items():
        if name not in found:
            problems.append(f"column {name!r} missing")
        elif found[name] not in types:
            problems.append(f"column {name!r} is {found[name]}, expected {' or '.join(types)}")
    for name, types in OPTIONAL_TYPES.items():
        if name in found and found[name] not in types:
            problems.append(f"column {name!r} is {found[name]}, expected {' or '.join(types)}")
    extra = sorted(set(found) - set(EXPECTED_TYPES) - set(OPTIONAL_TYPES))
    if extra:
        problems.append(f"unexpected columns {extra}")
    if problems:
        return [(RULE_SCHEMA, ctx.message(RULE_SCHEMA, detail="; ".join(problems)), 0, [])]
    return []


def _broken_rows(con, ctx: _Context, rule: C.Rule, name=None, detail=None, **params) -> list:
    """``[(rule name, message, count, ids)]`` when rows break the ``rows`` rule ``rule``, else
    ``[]``. ``name``: the rule's name with its parameters; ``detail``: text or a function
    giving it (run only on failure)."""
    column = COLUMN[rule.columns[0]]
    where, args = rule.where(q(column), **params)
    count, ids, rows = _offenders(con, where, args, ctx.counts.get((where, tuple(args))))
    if not count:
        return []
    name = name or rule.name
    msg = ctx.message(name, column, ids=ids, count=count, rows=None if ids else rows,
                      detail=detail() if callable(detail) else detail)
    return [(name, msg, count, ids)]


def check_non_empty(con, ctx: _Context) -> list:
    if con.execute(f"SELECT {C.ROWS.sql} FROM {T}").fetchall()[0][0]:
        return [(C.ROWS.name, ctx.message(C.ROWS.name, detail=C.ROWS.detail), 0, [])]
    return []


def check_unique_ids(con, ctx: _Context) -> list:
    out = _broken_rows(con, ctx, C.ID_NULL)
    rule = C.ID_UNIQUE
    groups = f"WHERE {I} IS NOT NULL GROUP BY {I} HAVING {rule.sql}"
    dup_rows, dup_ids = con.execute(
        f"SELECT coalesce(sum(c - 1), 0), count(*) FROM (SELECT count(*) AS c FROM {T} {groups})"
    ).fetchall()[0]
    if dup_ids:
        ids = [r[0] for r in con.execute(
            f"SELECT {I} FROM {NUMBERED} {groups} ORDER BY min(rn) LIMIT ?", [MAX_IDS]).fetchall()]
        msg = ctx.message(rule.name, ID, ids=ids, count=int(dup_rows),
                          detail=rule.detail.format(groups=dup_ids))
        out.append((rule.name, msg, int(dup_rows), ids))
    return out


def check_finite_quality(con, ctx: _Context) -> list:
    out = _broken_rows(con, ctx, C.Q_NULL) + _broken_rows(con, ctx, C.Q_FINITE)
    lo, hi = ctx.contract.quality_min, ctx.contract.quality_max
    if lo is not None or hi is not None:
        def found():
            qmin, qmax = con.execute(
                f"SELECT min({Q}), max({Q}) FROM {T} WHERE isfinite({Q})").fetchall()[0]
            return C.Q_RANGE.detail.format(min=qmin, max=qmax)

        out += _broken_rows(con, ctx, C.Q_RANGE, name=rule_quality_range(lo, hi), detail=found,
                            lo=lo, hi=hi)
    return out


def check_embedding_dim(con, ctx: _Context) -> list:
    known = ctx.lengths  # (shortest, longest, non-null embeddings) from prefetch_counts
    if known is not None and known[0] == known[1]:  # one length (or none): no second scan
        lengths = [(known[0], known[2])] if known[2] else []
    else:
        lengths = con.execute(
            f"SELECT len({E}) AS d, count(*) AS c FROM {T} WHERE {E} IS NOT NULL "
            f"GROUP BY d ORDER BY c DESC, d"
        ).fetchall()
    if not lengths:
        return []
    expected = ctx.contract.expected_dim
    if expected is not None:
        expected = int(expected)
        found = sorted({d for d, _ in lengths if d != expected})[:MAX_IDS]
        out = _broken_rows(con, ctx, C.EMB_DIM, name=rule_expected_dim(expected),
                           detail=C.EMB_DIM.detail.format(found=found), d=expected)
        if out:  # as in the engine, a wrong dimension is the one failure reported
            return out
    out = []
    if len(lengths) > 1:  # one length: nothing can be ragged, spare a scan of the embeddings
        d = int(lengths[0][0])  # the most common length, the smallest on a tie
        others = sorted(x for x, _ in lengths[1:])[:MAX_IDS]
        out = _broken_rows(con, ctx, C.EMB_RAGGED, d=d,
                           detail=C.EMB_RAGGED.detail.format(d=d, others=others))
    return out + _broken_rows(con, ctx, C.EMB_EMPTY)


def check_embedding_values(con, ctx: _Context) -> list:
    return (_broken_rows(con, ctx, C.EMB_NULL)
            + _broken_rows(con, ctx, C.EMB_FINITE, detail=C.EMB_FINITE.detail)
            + _broken_rows(con, ctx, C.EMB_ZERO))


RUNNERS = {
    "schema": check_schema,
    "non_empty": check_non_empty,
    "unique_ids": check_unique_ids,
    "finite_quality": check_finite_quality,
    "embedding_dim": check_embedding_dim,
    "finite_nonzero_embeddings": check_embedding_values,
}


def prefetch_counts(con, ctx: _Context) -> None:
    """Count the offending rows of every row rule whose parameters are known up front in ONE
    scan of the file (``count(*) FILTER (WHERE ...)`` per rule) into ``ctx.counts``; the checks
    then query only the rules that are broken, for their first ids. (One scan per rule made
    validation several full passes over the embeddings.)"""
    lo, hi = ctx.contract.quality_min, ctx.contract.quality_max
    rules = [(C.ID_NULL, {}), (C.Q_NULL, {}), (C.Q_FINITE, {}), (C.EMB_NULL, {}),
             (C.EMB_EMPTY, {}), (C.EMB_FINITE, {}), (C.EMB_ZERO, {})]
    if lo is not None or hi is not None:
        rules.append((C.Q_RANGE, {"lo": lo, "hi": hi}))
    if ctx.contract.expected_dim is not None:
        rules.append((C.EMB_DIM, {"d": int(ctx.contract.expected_dim)}))
    preds = [rule.where(q(COLUMN[rule.columns[0]]), **params) for rule, params in rules]
    # each predicate is a contract rule's SQL on a quoted column, values as ? parameters
    conds = ", ".join(f"count(*) FILTER (WHERE {where})" for where, _ in preds)
    args = [a for _, xs in preds for a in xs]
    row = con.execute(f"SELECT {conds}, min(len({E})), max(len({E})), count({E}) FROM {T}",
                      args).fetchall()[0]
    counts, (lo_len, hi_len, n_emb) = row[:-3], row[-3:]
    ctx.counts.update({(where, tuple(xs)): int(n) for (where, xs), n in zip(preds, counts)})
    ctx.lengths = (lo_len, hi_len, int(n_emb))


def run_checks(con, ctx: _Context, prefetch: bool = True) -> dict:
    """Run every rule on a connection where the features table is registered.
    Returns ``{check name: [(rule, message, count, ids), ...]}`` (empty list = passed).
    ``prefetch=False``: one count query per rule (the old way; bench/throughput.py compares)."""
    results = {"schema": RUNNERS["schema"](con, ctx)}
    if prefetch and not results["schema"]:
        prefetch_counts(con, ctx)
    for name, fn in RUNNERS.items():
        if name == "schema":
            continue
        if results["schema"]:
            results[name] = None  # not evaluated
        else:
            results[name] = fn(con, ctx)
    return results


def _result(name: str, failures, ctx: _Context, n_rows, quarantined=None) -> dg.AssetCheckResult:
    """``quarantined``: (rows quarantined at ingestion, rejects file), shown in every check."""
    meta = {"partition": ctx.key, "features_uri": dg.MetadataValue.path(ctx.features_uri)}
    if n_rows is not None:
        meta["rows_checked"] = int(n_rows)
    note = None
    if quarantined is not None:
        meta["rows_quarantined"] = int(quarantined[0])
        if quarantined[0]:
            meta["rejects_uri"] = dg.MetadataValue.path(quarantined[1])
            note = (f"partition {ctx.key!r}: {quarantined[0]} rows quarantined at ingestion "
                    f"(row rules of the text, listed in {quarantined[1]}) are not in the "
                    f"features checked")
    if failures is None:
        return dg.AssetCheckResult(
            check_name=name, asset_key=features.key, passed=False,
            description=f"partition {ctx.key!r}: not evaluated because the schema check failed",
            metadata=meta,
        )
    if not failures:
        return dg.AssetCheckResult(check_name=name, asset_key=features.key, passed=True,
                                   metadata=meta, description=note)
    meta["rules_broken"] = dg.MetadataValue.json([f[0] for f in failures])
    meta["offending_rows"] = sum(int(f[2]) for f in failures)
    meta["offending_ids"] = dg.MetadataValue.json([i for f in failures for i in f[3]][:MAX_IDS])
    return dg.AssetCheckResult(
        check_name=name, asset_key=features.key, passed=False,
        description="\n".join([f[1] for f in failures] + ([note] if note else [])), metadata=meta,
    )


with warnings.catch_warnings():
    # Per-partition checks are preview in Dagster 1.13: one PreviewWarning per spec at every
    # import. Silenced around these specs only, for that class and message.
    warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec",
                            category=dg.PreviewWarning)
    # partitions_def=shards: Dagster records each result under its shard, so every partition
    # keeps its own pass/fail per check (instead of the last shard's overwriting the others').
    # automation_condition: requested with its asset (datamask_pipeline/automation.py).
    SPECS = [dg.AssetCheckSpec(name, asset=features, blocking=True, description=desc,
                               partitions_def=shards, automation_condition=CHECK_CONDITION)
             for name, desc in CHECKS.items()]


@dg.multi_asset_check(specs=SPECS, name="validate_features")
def validate_features(context: dg.AssetCheckExecutionContext, data_root: DataRoot,
                      contract: DataContract, duckdb: DuckDBResource):
    """DuckDB SQL checks of one shard's features parquet (see the module doc)."""
    import pyarrow.dataset as ds

    if duckdb.database != ":memory:":
        raise dg.Failure(
            description=f"the validation DuckDB must be in memory (':memory:'), got "
                        f"{duckdb.database!r}: partitions validated in parallel would fight over one file",
            allow_retries=False,
        )
    key = context.partition_key
    uri = data_root.features(key)
    ctx = _Context(key, data_root.raw_shard(key), uri, contract)
    fs, path = storage.resolve(uri)
    local = storage.is_local(uri)
    try:
        if local:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{path} does not exist")
            dataset = None
        else:
            dataset = ds.dataset(path, filesystem=fs, format="parquet")
    except (OSError, ValueError) as exc:
        msg = f"partition {key!r}: features file {uri} cannot be read ({exc}): materialize features first"
        for name in CHECKS:
            yield dg.AssetCheckResult(check_name=name, asset_key=features.key, passed=False,
                                      description=msg, metadata={"partition": key})
        return
    with duckdb.get_connection() as con:
        if "memory_limit" not in (duckdb.connection_config or {}):
            # DuckDB's buffer pool otherwise grows towards 80% of the machine's memory with the
            # shard size (decompressed row groups it keeps), in every parallel partition
            con.execute(f"SET memory_limit = {sql_string(VALIDATION_MEMORY_LIMIT)}")
        if local:
            # DuckDB's own parquet reader streams row groups: memory stays flat in the shard
            # size. (Through a registered pyarrow dataset the Arrow scan kept the scanned
            # batches alive: ~2.4x the embeddings' bytes at 2M rows.) A view cannot take
            # parameters, so the path is a quoted literal.
            con.execute(f"CREATE TEMP VIEW {T} AS SELECT * FROM read_parquet({sql_string(path)})")
        else:
            con.register(TABLE, dataset)
        results = run_checks(con, ctx)
        n_rows = con.execute(f"SELECT count(*) FROM {T}").fetchall()[0][0]
    try:  # the footer's count, written with the features (never a stale rejects file's)
        quarantined = (quarantined_rows(uri)[0], data_root.rejects(key))
    except (OSError, ValueError, pa.ArrowException):
        quarantined = None
    failed = []
    for name in CHECKS:
        res = _result(name, results[name], ctx, n_rows, quarantined)
        if not res.passed:
            failed.append(name)
            context.log.error(f"check {name} failed: {res.description}")
        yield res
    if not failed:
        context.log.info(f"partition {key}: all {len(CHECKS)} checks passed on {n_rows} rows")
