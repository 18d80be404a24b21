"""All file access by URI, through ``pyarrow.fs``, so that object storage works unchanged.

Accepted locations:

* plain local paths (``/data/x.parquet``, ``rel/x.parquet``; made absolute),
* ``file://`` URIs,
* ``s3://bucket/key`` through :class:`pyarrow.fs.S3FileSystem`; when the environment variable
  ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) is set it becomes ``endpoint_override``
  (MinIO, Ceph, LocalStack ...); credentials come from the usual AWS chain,
* any other scheme :meth:`pyarrow.fs.FileSystem.from_uri` understands (``gs://``, ``hdfs://``).

Publishing is atomic everywhere: a reader sees either the previous object or the complete new
one, never a partial file.

* Local: the bytes go to ``.<name>.tmp-<uuid>`` in the target's own directory (same file
  system, so the rename cannot turn into a copy), are flushed and ``fsync``-ed, then
  ``os.replace`` renames them over the target (atomic on POSIX) and the directory is fsync-ed
  so the rename survives a crash. On any error the temp file is deleted.
* Object stores: a single PUT / completed multipart upload is already atomic, but pyarrow's
  output stream *completes* the upload when it is closed, also when the writer failed half-way
  (closing happens in ``__exit__``), so writing straight to the final key could publish a
  truncated object. We therefore write the temp key ``.<name>.tmp-<uuid>`` beside the target
  and, only after the writer finished, ``move`` it to the final key (S3: server-side
  CopyObject, which creates the final key atomically, then DeleteObject of the temp). On error
  the temp key is deleted. Temp names start with ``.`` and :func:`list_files` skips such
  names, so listings never show them. Limits of object stores: one CopyObject copies at most
  5 GiB (AWS S3), so a single output object must stay below that (a larger one fails to
  publish with a :class:`StorageError` saying so, and nothing is published); and pyarrow
  keeps a "directory" alive after deleting the last object under a prefix by writing a
  zero-byte marker object ``<prefix>/`` (never a file: :func:`list_files` does not return it).

S3 without ``AWS_ENDPOINT_URL``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (plain AWS, region
unknown): the bucket's region is looked up once per bucket, as ``FileSystem.from_uri`` does.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
import uuid
from typing import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

__all__ = [
    "StorageError",
    "resolve",
    "join",
    "exists",
    "remove",
    "makedirs",
    "list_files",
    "sha256",
    "size",
    "is_local",
    "safe_child",
    "validate_partition_key",
    "partition_key_for",
    "atomic_write_bytes",
    "atomic_write_table",
    "atomic_output",
    "write_selected_rows",
]

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_HASH_CHUNK = 1 << 20
_FS_CACHE: dict = {}
_FS_LOCK = threading.Lock()


class StorageError(OSError):
    """A location that cannot be used: unsupported URI, unsafe path, missing directory ..."""


# ------------------------------------------------------------------ locations
def _scheme(uri: str) -> str | None:
    m = _SCHEME_RE.match(uri)
    return m.group(1).lower() if m else None


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def _env_region() -> str | None:
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def _bucket_region(bucket: str) -> str | None:
    """AWS only (no endpoint, no region in the environment): the bucket's own region, as
    ``FileSystem.from_uri`` would find it; a client pinned to another region gets HTTP 301
    for every request. None when it cannot be found (the SDK's default chain decides)."""
    key = ("region", bucket)
    with _FS_LOCK:
        if key in _FS_CACHE:
            return _FS_CACHE[key]
    try:
        region = pafs.resolve_s3_region(bucket)
    except (OSError, pa.ArrowException, ValueError):
        region = None
    with _FS_LOCK:
        _FS_CACHE[key] = region
    return region


def _s3_filesystem(bucket: str | None = None) -> pafs.FileSystem:
    """One cached S3FileSystem per (endpoint, region). Credentials are not passed: the AWS
    SDK's default chain reads ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
    ``AWS_SESSION_TOKEN``, web identity (IRSA) or instance metadata and refreshes them."""
    endpoint = _endpoint()
    region = _env_region()
    if region is None and endpoint is None and bucket:
        region = _bucket_region(bucket)
    key = ("s3", endpoint, region)
    with _FS_LOCK:
        fs = _FS_CACHE.get(key)
        if fs is None:
            kwargs = {}
            if endpoint:
                ep = endpoint.strip().rstrip("/")
                if ep.lower().startswith("http://"):
                    kwargs["scheme"] = "http"
                    ep = ep[len("http://"):]
                elif ep.lower().startswith("https://"):
                    kwargs["scheme"] = "https"
                    ep = ep[len("https://"):]
                kwargs["endpoint_override"] = ep
            if region:
                kwargs["region"] = region
            fs = pafs.S3FileSystem(**kwargs)
            _FS_CACHE[key] = fs
    return fs


def resolve(uri) -> tuple[pafs.FileSystem, str]:
    """``uri`` -> (file system, path inside it). Local paths come back absolute."""
    if isinstance(uri, os.PathLike):
        uri = os.fspath(uri)
    if not isinstance(uri, str) or not uri:
        raise StorageError(f"not a location: {uri!r}")
    if "\x00" in uri:
        raise StorageError(f"location contains a NUL byte: {uri!r}")
    scheme = _scheme(uri)
    if scheme is None:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    if scheme == "s3":
        path = uri[len("s3://"):].split("?", 1)[0].strip("/")
        if not path:
            raise StorageError(f"{uri}: no bucket in S3 URI")
        return _s3_filesystem(path.split("/", 1)[0]), path
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise StorageError(f"{uri}: unsupported or malformed location ({exc})") from exc
    return fs, path


def is_local(uri) -> bool:
    fs, _ = resolve(uri)
    return isinstance(fs, pafs.LocalFileSystem)


def join(base_uri, *parts: str) -> str:
    """Append path parts to a path or URI (no normalisation; see :func:`safe_child`)."""
    base = os.fspath(base_uri)
    if _scheme(base) is None:
        return os.path.join(base, *parts)
    out = base
    for p in parts:
        p = str(p)
        if not p:
            continue
        out = out.rstrip("/") + "/" + p.lstrip("/")
    return out


def _basename(uri: str) -> str:
    return os.fspath(uri).rstrip("/").rsplit("/", 1)[-1]


def _info(uri) -> pafs.FileInfo:
    fs, path = resolve(uri)
    return fs.get_file_info(path)


def exists(uri) -> bool:
    return _info(uri).type != pafs.FileType.NotFound


def size(uri) -> int:
    info = _info(uri)
    if info.type != pafs.FileType.File:
        raise StorageError(f"{uri}: not a file")
    return int(info.size)


def makedirs(uri) -> None:
    fs, path = resolve(uri)
    try:
        fs.create_dir(path, recursive=True)
    except (OSError, pa.ArrowException) as exc:
        raise StorageError(f"{uri}: cannot create directory ({exc})") from exc


def remove(uri, missing_ok: bool = True, recursive: bool = False) -> None:
    """Delete a file (a directory only with ``recursive=True``)."""
    fs, path = resolve(uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        if missing_ok:
            return
        raise StorageError(f"{uri}: does not exist")
    if info.type == pafs.FileType.Directory:
        if not recursive:
            raise StorageError(f"{uri}: is a directory (pass recursive=True to delete it)")
        fs.delete_dir(path)
        return
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        if not missing_ok:
            raise StorageError(f"{uri}: does not exist") from None


def list_files(dir_uri, suffix: str | None = ".parquet") -> list[str]:
    """Files directly inside ``dir_uri`` whose name ends with ``suffix`` (``None``/"" = all),
    as sorted URIs in the same style as ``dir_uri``. Hidden names (``.x``: temp files of
    in-flight atomic writes) are skipped."""
    fs, path = resolve(dir_uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise StorageError(f"{dir_uri}: directory does not exist")
    if info.type != pafs.FileType.Directory and not isinstance(fs, pafs.S3FileSystem):
        raise StorageError(f"{dir_uri}: not a directory")
    sel = pafs.FileSelector(path, recursive=False, allow_not_found=True)
    names = []
    for fi in fs.get_file_info(sel):
        if fi.type != pafs.FileType.File:
            continue
        name = fi.base_name
        if name.startswith("."):
            continue
        if suffix and not name.endswith(suffix):
            continue
        names.append(name)
    return [join(dir_uri, n) for n in sorted(names)]


def _sha256_path(fs: pafs.FileSystem, path: str) -> str:
    h = hashlib.sha256()
    with fs.open_input_stream(path) as fh:
        while True:
            chunk = fh.read(_HASH_CHUNK)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def sha256(uri) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB chunks."""
    fs, path = resolve(uri)
    try:
        return _sha256_path(fs, path)
    except FileNotFoundError as exc:
        raise StorageError(f"{uri}: does not exist") from exc


# ------------------------------------------------------------------ safe paths
_KEY_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_KEY_MAX = 128


def validate_partition_key(key) -> str:
    """Return ``key`` if it is a safe partition key, else raise ValueError naming the rule.

    Rules: a non-empty string of [A-Za-z0-9._-], at most 128 characters, no '..', not
    starting with '.'."""
    if not isinstance(key, str):
        raise ValueError(f"partition key {key!r}: must be a string")
    if not key:
        raise ValueError("partition key '': must not be empty")
    if len(key) > _KEY_MAX:
        raise ValueError(f"partition key {key!r}: longer than {_KEY_MAX} characters ({len(key)})")
    if not _KEY_RE.match(key):
        bad = sorted({c for c in key if not re.match(r"[A-Za-z0-9._-]", c)})
        raise ValueError(
            f"partition key {key!r}: only letters, digits, '.', '_' and '-' are allowed "
            f"(found {''.join(bad)!r})"
        )
    if ".." in key:
        raise ValueError(f"partition key {key!r}: must not contain '..'")
    if key.startswith("."):
        raise ValueError(f"partition key {key!r}: must not start with '.'")
    return key


def partition_key_for(filename) -> str:
    """Partition key of a raw file: its name without directory and last suffix, validated.

    ``shard_000.parquet`` -> ``shard_000``; ``s3://b/raw/part-7.parquet`` -> ``part-7``."""
    name = _basename(os.fspath(filename))
    stem = name.rsplit(".", 1)[0] if "." in name[1:] else name
    return validate_partition_key(stem)


def _within(child: str, root: str) -> bool:
    return child == root or child.startswith(root.rstrip(os.sep) + os.sep)


def safe_child(root_uri, relative, *, allow_subdirs: bool = True) -> str:
    """``join(root_uri, relative)``, refusing anything that could leave ``root_uri``.

    Refused (StorageError): empty or non-string ``relative``, absolute paths, a drive or URI
    scheme, '..' or '.' components, empty components, NUL bytes, backslashes, any '/' when
    ``allow_subdirs=False`` (one plain component only) and, for local roots, a path whose
    symlinks resolve outside the root."""
    if isinstance(relative, os.PathLike):
        relative = os.fspath(relative)
    if not isinstance(relative, str) or not relative:
        raise StorageError(f"unsafe path {relative!r} under {root_uri}: must be a non-empty string")
    if "\x00" in relative:
        raise StorageError(f"unsafe path {relative!r} under {root_uri}: contains a NUL byte")
    if "\\" in relative:
        raise StorageError(f"unsafe path {relative!r} under {root_uri}: contains a backslash")
    if relative.startswith("/") or os.path.isabs(relative) or _scheme(relative) or re.match(
        r"^[A-Za-z]:", relative
    ):
        raise StorageError(f"unsafe path {relative!r} under {root_uri}: absolute path or URI")
    parts = relative.split("/")
    if not allow_subdirs and len(parts) > 1:
        raise StorageError(
            f"unsafe path {relative!r} under {root_uri}: path separator in a single component"
        )
    for p in parts:
        if p in ("", ".", ".."):
            raise StorageError(
                f"unsafe path {relative!r} under {root_uri}: component {p!r} is not allowed"
            )
    out = join(root_uri, *parts)
    if _scheme(os.fspath(root_uri)) in (None, "file"):
        _, root_path = resolve(root_uri)
        _, child_path = resolve(out)
        real_root = os.path.realpath(root_path)
        real_child = os.path.realpath(child_path)
        if not _within(real_child, real_root):
            raise StorageError(
                f"unsafe path {relative!r} under {root_uri}: resolves outside the root "
                f"(to {real_child}) through a symlink"
            )
    return out


# ------------------------------------------------------------------ atomic publish
def _tmp_name(name: str) -> str:
    return f".{name}.tmp-{uuid.uuid4().hex}"


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def _atomic_target(uri) -> Iterator[tuple[pafs.FileSystem, str, str]]:
    """Yield (fs, temp path, final path); publish the temp on success, delete it on error."""
    fs, path = resolve(uri)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if not name:
        raise StorageError(f"{uri}: no file name")
    parent = path.rstrip("/")[: -len(name)].rstrip("/")
    local = isinstance(fs, pafs.LocalFileSystem)
    if local:
        parent = os.path.dirname(path)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as exc:
            raise StorageError(f"{uri}: cannot create the parent directory ({exc})") from exc
        if os.path.isdir(path):
            raise StorageError(f"{uri}: is a directory")
        tmp = os.path.join(parent, _tmp_name(name))
    else:
        if parent and fs.type_name not in ("s3", "gcs"):  # object stores: no directories
            try:
                fs.create_dir(parent, recursive=True)
            except (OSError, pa.ArrowException):
                pass
        tmp = (parent + "/" if parent else "") + _tmp_name(name)
    published = False
    try:
        yield fs, tmp, path
        if local:
            os.replace(tmp, path)
            _fsync_dir(parent)
        else:
            _publish_object(fs, tmp, path, uri)
        published = True
    finally:
        if not published:
            try:
                if local:
                    os.unlink(tmp)
                else:
                    fs.delete_file(tmp)
            except (OSError, pa.ArrowException):
                pass


_COPY_LIMIT = 5 * 2**30  # S3 CopyObject: at most 5 GiB in one request


def _publish_object(fs: pafs.FileSystem, tmp: str, path: str, uri) -> None:
    """Server-side move of the finished temp object to its final key (S3: CopyObject, then
    DeleteObject of the temp). A failure leaves the final key as it was."""
    try:
        fs.move(tmp, path)
    except (OSError, pa.ArrowException) as exc:
        hint = ""
        try:
            nbytes = fs.get_file_info(tmp).size
        except (OSError, pa.ArrowException):
            nbytes = None
        if nbytes and nbytes > _COPY_LIMIT:
            hint = (f"; the object is {nbytes / 2**30:.1f} GiB and S3's CopyObject, which "
                    f"publishes it atomically, copies at most 5 GiB: use smaller shards")
        raise StorageError(f"{uri}: the finished object could not be published ({exc}){hint}") from exc


@contextlib.contextmanager
def _open_tmp(fs: pafs.FileSystem, tmp: str):
    if isinstance(fs, pafs.LocalFileSystem):
        fh = open(tmp, "xb")
        try:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        finally:
            fh.close()
    else:
        with fs.open_output_stream(tmp) as fh:
            yield fh


@contextlib.contextmanager
def atomic_output(uri):
    """Yield a writable binary stream whose bytes appear at ``uri`` only if the block
    finishes without an exception (then all at once); on error nothing is published and the
    temp is deleted. Local: a python file object (``torch.save(obj, fh)`` works); object
    stores: a pyarrow output stream."""
    with _atomic_target(uri) as (fs, tmp, _final):
        with _open_tmp(fs, tmp) as fh:
            yield fh


def atomic_write_bytes(uri, data: bytes) -> None:
    with atomic_output(uri) as fh:
        fh.write(bytes(data))


def atomic_write_table(table: pa.Table, uri, **pq_kwargs) -> None:
    """``pyarrow.parquet.write_table`` to ``uri``, published atomically."""
    with atomic_output(uri) as fh:
        pq.write_table(table, fh, **pq_kwargs)


# ------------------------------------------------------------------ row selection
def _contract_error(**kw):
    from .data import DataContractError

    return DataContractError(**kw)


def _open_parquet(uri, fs, path) -> pq.ParquetFile:
    try:
        src = fs.open_input_file(path)
        # buffer_size: read pages through a buffered stream, so memory does not scale with
        # the row-group size; pre_buffer off for the same reason.
        return pq.ParquetFile(src, buffer_size=1 << 20, pre_buffer=False)
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise _contract_error(file=str(uri), rule="not a readable parquet file",
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
        raise _contract_error(file=str(raw_uri), column=id_column, rule="column present",
                              detail=f"available columns: {schema.names}")
    id_type = schema.field(id_column).type
    value_set = _value_set(selected_ids, id_type, raw_uri, id_column)
    n_wanted = len(value_set)
    if value_set.null_count:
        raise _contract_error(file=str(raw_uri), column=id_column, rule="selected ids non-null")
    if len(pc.unique(value_set)) != n_wanted:
        raise _contract_error(file=str(raw_uri), column=id_column, rule="selected ids unique",
                              ids=_dup_values(value_set))

    rows = 0
    try:
        with _atomic_target(out_uri) as (ofs, tmp, _final):
            with _open_tmp(ofs, tmp) as fh:
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
            raise _contract_error(file=str(raw_uri), rule="not a readable parquet file",
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
            raise _contract_error(file=str(raw_uri), column=id_column,
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
            raise _contract_error(
                file=str(raw_uri), column=id_column, rule="selected ids match the id column type",
                detail=f"selected ids are {arr.type}, column is {id_type}")
        try:
            arr = arr.cast(id_type)
        except pa.ArrowException as exc:
            raise _contract_error(file=str(raw_uri), column=id_column,
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
            raise _contract_error(file=str(raw_uri), column=field.name, rule="valid UTF-8 text",
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
        return _contract_error(file=str(raw_uri), column=id_column, rule="unique ids",
                               ids=dups, count=len(dups), unit="duplicated ids")
    missing_mask = pc.invert(pc.is_in(value_set, value_set=found_arr))
    missing = value_set.filter(missing_mask)
    return _contract_error(file=str(raw_uri), column=id_column,
                           rule="selected ids present in raw file",
                           ids=missing.to_pylist()[:10], count=len(missing), unit="selected ids")
