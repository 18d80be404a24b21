"""The selected subset: the raw rows DATAMASK kept, with every raw column (text included).

``storage.write_selected_rows`` streams the raw shard one batch at a time and keeps the rows
whose id is selected, so memory stays about one input batch plus one output row group whatever
the shard size; the file is published atomically.
"""

import dagster as dg
import numpy as np
import pyarrow.parquet as pq

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.data import DataContractError
from resources.contract import DataContract
from resources.storage import DataRoot

from .ingest import (FRESHNESS, GROUP, ID, OWNERS, QUALITY,
                     retry_transient_io, features, raw_shard, stage)
from .learn import mask
from .partitions import shards

CODE_VERSION = "selected-1"


def _read(uri: str, columns: list):
    return storage.read_table(uri, columns)


def raw_schema(uri: str):
    fs, path = storage.resolve(uri)
    with fs.open_input_file(path) as fh:
        return pq.ParquetFile(fh).schema_arrow


@dg.asset(
    key="selected_subset",
    partitions_def=shards,
    deps=[raw_shard, features, mask],
    group_name=GROUP,
    kinds={"parquet", "pyarrow"},
    owners=OWNERS,
    tags=stage("select"),
    freshness_policy=FRESHNESS,
    code_version=CODE_VERSION,
)
@retry_transient_io
def selected_subset(context: dg.AssetExecutionContext, data_root: DataRoot,
                    contract: DataContract) -> dg.MaterializeResult:
    """The selected raw rows of one shard, every raw column unchanged, in raw order
    (``selected/<key>.parquet``). Metadata: row count, schema, column lineage to the raw
    shard, kept fraction, mean quality before and after selection."""
    key = context.partition_key
    raw_uri = data_root.raw_shard(key)
    out_uri = data_root.selected(key)
    try:
        masks = _read(data_root.mask(key), [ID, "selected"])
        feats = _read(data_root.features(key), [ID, QUALITY])
    except FileNotFoundError as exc:
        raise dg.Failure(description=f"partition {key!r}: upstream output missing ({exc}): "
                                     "materialize features and mask first",
                         allow_retries=False) from exc
    ids = feats.column(ID).to_numpy(zero_copy_only=False)
    if masks.num_rows != feats.num_rows or not np.array_equal(
            masks.column(ID).to_numpy(zero_copy_only=False), ids):
        raise dg.Failure(
            description=f"partition {key!r}: {data_root.mask(key)} does not match "
                        f"{data_root.features(key)} row for row (the features changed after "
                        "the mask was learned): re-materialize mask",
            allow_retries=False)
    sel = masks.column("selected").to_numpy(zero_copy_only=False).astype(bool)
    quality = feats.column(QUALITY).to_numpy(zero_copy_only=False)
    try:
        info = storage.write_selected_rows(raw_uri, out_uri, ids[sel], contract.id_column)
    except (DataContractError, storage.StorageError) as exc:
        raise dg.Failure(description=f"partition {key!r}: cannot write the selected rows: {exc}",
                         allow_retries=False) from exc
    schema = raw_schema(out_uri)
    n = int(len(ids))
    q_before = float(quality.mean()) if n else float("nan")
    q_after = float(quality[sel].mean()) if sel.any() else float("nan")
    context.log.info(f"partition {key}: kept {info['rows']} of {n} rows -> {out_uri}")
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": int(info["rows"]),
            "dagster/column_schema": dg.TableSchema(columns=[
                dg.TableColumn(f.name, str(f.type)) for f in schema]),
            "dagster/column_lineage": dg.TableColumnLineage(deps_by_column={
                f.name: [dg.TableColumnDep(asset_key=raw_shard.key, column_name=f.name)]
                for f in schema}),
            "rows_raw": n,
            "kept_fraction": float(info["rows"] / n) if n else 0.0,
            "quality_mean_before": q_before,
            "quality_mean_after": q_after,
            "bytes": int(info["bytes"]),
            "sha256": info["sha256"],
            "selected_uri": dg.MetadataValue.path(str(out_uri)),
        },
        data_version=dg.DataVersion(info["sha256"]),
    )
