"""Row subsets: copy the rows of a raw parquet shard whose ids were selected to a new file,
streaming batch by batch, every column unchanged, published atomically. Every way the raw
file or the selection can break the data contract raises :class:`DataContractError`.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import DataContractError
from . import publish
from .uris import StorageError, _sha256_path, resolve

__all__ = ["write_selected_rows"]


def _open_parquet(uri, fs, path) -> pq.ParquetFile:
    try:
        src = fs.open_input_file(path)
        # buffer_size: read pages through a buffered stream, so memory does not scale with
        # the row-group size; pre_buffer off for the same reason.
        return pq.ParquetFile(src, buffer_size=1 << 20, pre_buffer=False)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise DataContractError(file=str(uri), rule="not a readable parquet file",
                                detail=str(exc)) from exc


def write_selected_rows(raw_uri, out_uri, selected_ids, id_column: str,
                        batch_size: int = 8192) -> dict:
    """Copy the rows of ``raw_uri`` whose ``id_column`` is in ``selected_ids`` to ``out_uri``
    (parquet, same schema, every column unchanged, input order), streaming one batch at a
    time; published atomically. Every selected id must occur exactly once in the raw file.

    Memory stays about one input batch plus one output row group, whatever the input size:
    pages are read through a 1 MiB buffered stream (no pre-buffering of whole row groups),
    selected rows are gathered into row groups of ~``batch_size`` rows and written at once.
    ``rows``/``bytes``/``sha256`` are taken from the temp file before it is published, so
    they describe exactly the bytes at ``out_uri``. Every failure publishes nothing.

    Returns ``{"rows": int, "bytes": int, "sha256": str}`` of the published file."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    fs, path = resolve(raw_uri)
    pf = _open_parquet(raw_uri, fs, path)
    schema = pf.schema_arrow
    if id_column not in schema.names:
        raise DataContractError(file=str(raw_uri), column=id_column, rule="column present",
                                detail=f"available columns: {schema.names}")
    id_type = schema.field(id_column).type
    value_set = _value_set(selected_ids, id_type, raw_uri, id_column)
    n_wanted = len(value_set)
    if value_set.null_count:
        raise DataContractError(file=str(raw_uri), column=id_column, rule="selected ids non-null")
    if len(pc.unique(value_set)) != n_wanted:
        raise DataContractError(file=str(raw_uri), column=id_column, rule="selected ids unique",
                                ids=_dup_values(value_set))

    rows = 0
    try:
        with publish._atomic_target(out_uri) as (ofs, tmp, _final):
            with publish._open_tmp(ofs, tmp) as fh:
                writer = pq.ParquetWriter(fh, schema)
                try:
                    pending, pending_rows = [], 0
                    for batch in _batches(pf, raw_uri, batch_size):
                        _check_utf8(batch, raw_uri, id_column)
                        mask = pc.is_in(batch.column(id_column), value_set=value_set)
                        kept = batch.filter(mask)
                        if kept.num_rows:
                            pending.append(kept)
                            pending_rows += kept.num_rows
                            rows += kept.num_rows
                        if pending_rows >= batch_size:
                            # one row group per ~batch_size selected rows, not per input batch
                            writer.write_table(pa.Table.from_batches(pending, schema=schema))
                            pending, pending_rows = [], 0
                        del batch, mask, kept
                    if pending:
                        writer.write_table(pa.Table.from_batches(pending, schema=schema))
                    pending = None
                finally:
                    writer.close()
            if rows != n_wanted:
                raise _missing_or_duplicate(pf, raw_uri, id_column, value_set, batch_size)
            nbytes = int(ofs.get_file_info(tmp).size)
            digest = _sha256_path(ofs, tmp)
    except StorageError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise StorageError(f"{out_uri}: cannot write the selected rows ({exc})") from exc
    return {"rows": rows, "bytes": nbytes, "sha256": digest}


def _batches(pf: pq.ParquetFile, raw_uri, batch_size: int, columns=None):
    """iter_batches, with read failures (truncated / corrupt pages) as DataContractError."""
    it = pf.iter_batches(batch_size=batch_size, columns=columns, use_threads=False)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as exc:
            raise DataContractError(file=str(raw_uri), rule="not a readable parquet file",
                                    detail=str(exc)) from exc
        yield batch


def _value_set(selected_ids, id_type, raw_uri, id_column) -> pa.Array:
    if isinstance(selected_ids, (pa.Array, pa.ChunkedArray)):
        arr = selected_ids
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.combine_chunks()
    else:
        try:
            import numpy as np

            ids = np.asarray(selected_ids)
            if ids.dtype.kind in "US":
                ids = ids.astype(object)
            arr = pa.array(ids)
        except (pa.ArrowException, ValueError, TypeError) as exc:
            raise DataContractError(file=str(raw_uri), column=id_column,
                                    rule="selected ids match the id column type",
                                    detail=str(exc)) from exc
    if len(arr) == 0:
        return pa.array([], type=id_type)
    if arr.type != id_type:
        ok = (pa.types.is_integer(arr.type) and pa.types.is_integer(id_type)) or (
            (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type))
            and (pa.types.is_string(id_type) or pa.types.is_large_string(id_type))
        )
        if not ok:
            raise DataContractError(
                file=str(raw_uri), column=id_column, rule="selected ids match the id column type",
                detail=f"selected ids are {arr.type}, column is {id_type}")
        try:
            arr = arr.cast(id_type)
        except pa.ArrowException as exc:
            raise DataContractError(file=str(raw_uri), column=id_column,
                                    rule="selected ids match the id column type",
                                    detail=str(exc)) from exc
    return arr


def _check_utf8(batch: pa.RecordBatch, raw_uri, id_column: str) -> None:
    """Parquet readers do not validate string bytes; a copied invalid string would break every
    reader of the output. Full validation is one linear pass over the string buffers; the
    offending rows are located (Python, error path only) to name their ids."""
    for i, field in enumerate(batch.schema):
        t = field.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            continue
        col = batch.column(i)
        try:
            col.validate(full=True)
        except pa.ArrowInvalid:
            raw = col.cast(pa.large_binary() if pa.types.is_large_string(t) else pa.binary())
            bad = []
            for r, v in enumerate(raw.to_pylist()):
                if v is None:
                    continue
                try:
                    v.decode("utf-8")
                except UnicodeDecodeError:
                    bad.append(r)
            ids = batch.column(id_column).take(pa.array(bad[:10])).to_pylist()
            raise DataContractError(file=str(raw_uri), column=field.name, rule="valid UTF-8 text",
                                    ids=ids, count=len(bad),
                                    detail="the string holds bytes that are not UTF-8") from None


def _dup_values(arr: pa.Array) -> list:
    vc = pc.value_counts(arr)
    vals = vc.field("values")
    counts = vc.field("counts")
    return vals.filter(pc.greater(counts, 1)).to_pylist()[:10]


def _missing_or_duplicate(pf, raw_uri, id_column, value_set, batch_size):
    """Second pass, only on failure: which selected ids are missing or repeated."""
    found = []
    for batch in _batches(pf, raw_uri, batch_size, columns=[id_column]):
        col = batch.column(0)
        found.append(col.filter(pc.is_in(col, value_set=value_set)))
    found_arr = pa.concat_arrays(found) if found else pa.array([], type=value_set.type)
    dups = _dup_values(found_arr) if len(found_arr) else []
    if dups:
        return DataContractError(file=str(raw_uri), column=id_column, rule="unique ids",
                                 ids=dups, count=len(dups), unit="duplicated ids")
    missing_mask = pc.invert(pc.is_in(value_set, value_set=found_arr))
    missing = value_set.filter(missing_mask)
    return DataContractError(file=str(raw_uri), column=id_column,
                             rule="selected ids present in raw file",
                             ids=missing.to_pylist()[:10], count=len(missing), unit="selected ids")
