"""Ingestion: raw shard -> canonical features parquet (``id``, ``quality``, ``embedding``).

The raw file is read with pyarrow, one batch at a time, and only its id, quality and embedding
columns; text and every other column stay in the raw file (the selected subset copies them
from there). Only the structure is enforced here (the columns exist and have usable types,
``engine.data``'s schema rules); the value rules (unique ids, finite values, one dimension ...)
are the blocking checks of :mod:`assets.validate`, which read the features file this step wrote.
"""


from datetime import timedelta

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.data import (
    RULE_ID_INT64,
    RULE_READABLE,
    Columns,
    DataContractError,
    check_schema,
)
from resources.contract import DataContract
from resources.storage import DataRoot

from .partitions import shards

GROUP = "datamask"
# Who answers for these assets in the UI, and the pipeline step each one is (a tag to filter by).
OWNERS = ["team:data-selection"]


# The catalog and the selected rows should follow the daily refresh (DATAMASK_SCHEDULE_CRON's
# default): warn after a day without a fresh materialization, fail after two.
FRESHNESS = dg.FreshnessPolicy.time_window(fail_window=timedelta(days=2), warn_window=timedelta(days=1))


def stage(name: str) -> dict:
    """The tags of an asset of pipeline step ``name`` (ingest, validate, learn, select, report)."""
    return {"datamask/stage": name}


CODE_VERSION = "features-1"
BATCH_ROWS = 65536
# Row groups of the features file. Readers (the DuckDB checks) hold about one row group per
# thread: 8192 rows of 768-d float32 embeddings are 25 MB, 65536 rows were 200 MB.
ROW_GROUP_ROWS = 8192

ID, QUALITY, EMBEDDING = "id", "quality", "embedding"
EMBEDDING_TYPE = pa.list_(pa.float32())

raw_shard = dg.AssetSpec(
    "raw_shard",
    partitions_def=shards,
    group_name=GROUP,
    kinds={"parquet"},
    owners=OWNERS,
    tags=stage("ingest"),
    description="A raw parquet shard under the raw location (one file per partition): an id "
    "column, numeric quality column(s), an embedding column (list of floats) and any other "
    "columns (text, source ...). Written by you, not by Dagster.",
)


def features_schema(id_type: pa.DataType) -> pa.Schema:
    return pa.schema([(ID, id_type), (QUALITY, pa.float64()), (EMBEDDING, EMBEDDING_TYPE)])


def _canonical_id_type(t: pa.DataType) -> pa.DataType:
    return pa.int64() if pa.types.is_integer(t) else pa.string()


def canonical_batch(batch: pa.RecordBatch, columns: Columns, path: str, id_type) -> pa.RecordBatch:
    """Map one raw batch to the canonical schema. Nulls, NaN and Inf pass through unchanged
    (the validation checks report them); float64 embeddings become float32 (values beyond
    float32's range become Inf, which the checks catch)."""
    raw_id = batch.column(columns.id)
    try:
        ids = pc.cast(raw_id, id_type)
    except pa.ArrowInvalid as exc:
        too_big = pc.greater(raw_id, pa.scalar(2**63 - 1, raw_id.type)) if pa.types.is_unsigned_integer(raw_id.type) else None
        bad = raw_id.filter(too_big).to_pylist()[:10] if too_big is not None else []
        raise DataContractError(path, RULE_ID_INT64, column=columns.id, ids=bad, detail=str(exc)) from exc
    q = None
    for name, w in zip(columns.quality, columns.weights):
        col = pc.cast(batch.column(name), pa.float64(), safe=False)
        term = col if w == 1.0 else pc.multiply(col, pa.scalar(float(w)))
        q = term if q is None else pc.add(q, term)
    emb = pc.cast(batch.column(columns.embedding), EMBEDDING_TYPE, safe=False)
    return pa.RecordBatch.from_arrays([ids, q, emb], schema=features_schema(id_type))


def write_features(raw_uri: str, out_uri: str, columns: Columns) -> dict:
    """Stream ``raw_uri``'s id/quality/embedding columns into the canonical ``out_uri``
    (published atomically). Returns rows, bytes, sha256, embedding dimension counts."""
    fs, path = storage.resolve(raw_uri)
    try:
        src = fs.open_input_file(path)
        pf = pq.ParquetFile(src, buffer_size=1 << 20, pre_buffer=False)
    except FileNotFoundError as exc:
        raise storage.StorageError(f"{raw_uri}: raw shard does not exist") from exc
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise DataContractError(raw_uri, RULE_READABLE, detail=str(exc)) from exc
    try:
        check_schema(pf.schema_arrow, str(raw_uri), columns)
        id_type = _canonical_id_type(pf.schema_arrow.field(columns.id).type)
        schema = features_schema(id_type)
        rows = 0
        dims: dict = {}
        with storage.atomic_output(out_uri) as fh:
            writer = pq.ParquetWriter(fh, schema, compression="zstd")
            try:
                it = pf.iter_batches(batch_size=BATCH_ROWS, columns=columns.needed(), use_threads=False)
                while True:
                    try:
                        batch = next(it)
                    except StopIteration:
                        break
                    except (OSError, pa.ArrowException) as exc:
                        raise DataContractError(raw_uri, RULE_READABLE, detail=str(exc)) from exc
                    out = canonical_batch(batch, columns, str(raw_uri), id_type)
                    writer.write_batch(out, row_group_size=ROW_GROUP_ROWS)
                    rows += out.num_rows
                    vc = pc.value_counts(pc.list_value_length(out.column(EMBEDDING)))
                    for v, c in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()):
                        dims[v] = dims.get(v, 0) + c
            finally:
                writer.close()
    finally:
        src.close()
    return {"rows": rows, "bytes": storage.size(out_uri), "sha256": storage.sha256(out_uri),
            "dims": dims, "id_type": str(id_type)}


@dg.asset(
    key="features",
    partitions_def=shards,
    deps=[raw_shard],
    group_name=GROUP,
    kinds={"parquet", "pyarrow"},
    owners=OWNERS,
    tags=stage("ingest"),
    code_version=CODE_VERSION,
)
def features(context: dg.AssetExecutionContext, data_root: DataRoot,
             contract: DataContract) -> dg.MaterializeResult:
    """Canonical features of one shard: ``id`` (int64 or string), ``quality`` (float64, the
    weighted sum of the raw quality columns) and ``embedding`` (list<float32>), row for row as
    in the raw file. Text and other raw columns are not copied. Data version: the SHA-256 of
    the written parquet."""
    key = context.partition_key
    raw_uri = data_root.raw_shard(key)
    out_uri = data_root.features(key)
    columns = contract.columns()
    try:
        info = write_features(raw_uri, out_uri, columns)
    except (DataContractError, storage.StorageError) as exc:
        raise dg.Failure(
            description=f"partition {key!r}: ingestion failed: {exc}",
            metadata={"raw_uri": dg.MetadataValue.path(str(raw_uri))},
            allow_retries=False,
        ) from exc
    context.log.info(f"partition {key}: {info['rows']} rows, {info['bytes']} bytes -> {out_uri}")
    dims = {str(k): v for k, v in sorted(info["dims"].items(), key=lambda kv: (kv[0] is None, kv[0] or 0))}
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": info["rows"],
            "dagster/column_schema": dg.TableSchema(columns=[
                dg.TableColumn(ID, info["id_type"], description=f"raw column {columns.id!r}"),
                dg.TableColumn(QUALITY, "double", description=(
                    " + ".join(f"{w:g}*{c}" for c, w in zip(columns.quality, columns.weights)))),
                dg.TableColumn(EMBEDDING, "list<float>", description=f"raw column {columns.embedding!r}"),
            ]),
            "bytes": info["bytes"],
            "sha256": info["sha256"],
            "embedding_dims": dg.MetadataValue.json(dims),
            "raw_uri": dg.MetadataValue.path(str(raw_uri)),
            "features_uri": dg.MetadataValue.path(str(out_uri)),
        },
        data_version=dg.DataVersion(info["sha256"]),
    )
