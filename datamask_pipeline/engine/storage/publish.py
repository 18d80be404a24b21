"""Atomic publishing: a reader of the target sees either the previous object or the complete
new one, never a partial file (temp file + rename locally, temp key + server-side copy on
object stores). Nothing is published when the writer fails.

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
  the temp key is deleted. Temp names start with ``.`` and :func:`~.uris.list_files` skips
  such names, so listings never show them. Limits of object stores: one CopyObject copies at
  most 5 GiB (AWS S3), so a single output object must stay below that (a larger one fails to
  publish with a :class:`StorageError` saying so, and nothing is published); and pyarrow
  keeps a "directory" alive after deleting the last object under a prefix by writing a
  zero-byte marker object ``<prefix>/`` (never a file: ``list_files`` does not return it).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from typing import Iterator

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from .uris import StorageError, resolve

__all__ = ["atomic_output", "atomic_write_bytes", "atomic_write_table"]


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
