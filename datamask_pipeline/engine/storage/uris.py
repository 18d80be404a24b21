"""Locations: turn a path or URI into a ``pyarrow.fs`` file system and path, and the plain
file operations on it (join, exists, size, makedirs, remove, list_files, sha256).
S3 file systems are cached per endpoint and region; :class:`StorageError` is raised here.

Accepted locations:

* plain local paths (``/data/x.parquet``, ``rel/x.parquet``; made absolute),
* ``file://`` URIs,
* ``s3://bucket/key`` through :class:`pyarrow.fs.S3FileSystem`; when the environment variable
  ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) is set it becomes ``endpoint_override``
  (MinIO, Ceph, LocalStack ...); credentials come from the usual AWS chain,
* any other scheme :meth:`pyarrow.fs.FileSystem.from_uri` understands (``gs://``, ``hdfs://``).

S3 without ``AWS_ENDPOINT_URL``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` (plain AWS, region
unknown): the bucket's region is looked up once per bucket, as ``FileSystem.from_uri`` does.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = ["StorageError", "resolve", "join", "exists", "remove", "makedirs", "list_files",
           "read_bytes", "read_table", "read_column",
           "sha256", "size", "is_local"]

_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_HASH_CHUNK = 1 << 20
_FS_CACHE: dict = {}
_FS_LOCK = threading.Lock()


class StorageError(OSError):
    """A location that cannot be used: unsupported URI, unsafe path, missing directory ..."""


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


def read_bytes(uri) -> bytes:
    """The whole object (the twin of ``atomic_write_bytes``)."""
    fs, path = resolve(uri)
    with fs.open_input_file(path) as fh:
        return fh.read()


def read_table(uri, columns=None) -> pa.Table:
    """A parquet file, or some of its columns."""
    import pyarrow.parquet as pq

    fs, path = resolve(uri)
    with fs.open_input_file(path) as fh:
        return pq.read_table(fh, columns=columns)


def read_column(uri, column: str):
    """One column of a parquet file (a ChunkedArray), or None when the file has no such column;
    only the footer and that column are read."""
    import pyarrow.parquet as pq

    fs, path = resolve(uri)
    with fs.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        if column not in pf.schema_arrow.names:
            return None
        return pf.read(columns=[column]).column(0)


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


def list_file_infos(dir_uri, suffix: str | None = ".parquet") -> dict:
    """Files directly inside ``dir_uri`` whose name ends with ``suffix`` (``None``/"" = all),
    from one listing: {URI in the style of ``dir_uri``: (size, mtime ns)} in name order. Hidden
    names (``.x``: temp files of in-flight atomic writes) are skipped. The listing already
    carries size and mtime (LIST on S3), so no file is stat'ed one by one."""
    fs, path = resolve(dir_uri)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise StorageError(f"{dir_uri}: directory does not exist")
    if info.type != pafs.FileType.Directory and not isinstance(fs, pafs.S3FileSystem):
        raise StorageError(f"{dir_uri}: not a directory")
    sel = pafs.FileSelector(path, recursive=False, allow_not_found=True)
    found = {}
    for fi in fs.get_file_info(sel):
        if fi.type != pafs.FileType.File:
            continue
        name = fi.base_name
        if name.startswith("."):
            continue
        if suffix and not name.endswith(suffix):
            continue
        found[name] = (int(fi.size or 0), int(fi.mtime_ns or 0))
    return {join(dir_uri, n): found[n] for n in sorted(found)}


def list_files(dir_uri, suffix: str | None = ".parquet") -> list[str]:
    """The URIs of :func:`list_file_infos`, sorted."""
    return list(list_file_infos(dir_uri, suffix))


def list_dirs(dir_uri) -> list[str]:
    """The URIs of the directories directly inside ``dir_uri`` (none when it does not exist),
    sorted; hidden names skipped. On object storage a "directory" is a common key prefix."""
    fs, path = resolve(dir_uri)
    sel = pafs.FileSelector(path, recursive=False, allow_not_found=True)
    names = sorted(fi.base_name for fi in fs.get_file_info(sel)
                   if fi.type == pafs.FileType.Directory and not fi.base_name.startswith("."))
    return [join(dir_uri, n) for n in names]


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

