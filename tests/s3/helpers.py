"""Helpers of the S3 tests: listing and reading the bucket with the test's own client."""

import hashlib
import os

import pyarrow.fs as pafs


def list_objects(fs: pafs.S3FileSystem, bucket: str) -> dict:
    """``{key: FileInfo}`` of every object in ``bucket`` that is a file.

    pyarrow's S3FileSystem keeps "directories" alive with zero-byte marker objects
    (``prefix/``) when it deletes the last object under a prefix; those show up as Directory
    entries and are listed by :func:`list_markers`, not here."""
    infos = fs.get_file_info(pafs.FileSelector(bucket, recursive=True))
    return {i.path[len(bucket) + 1:]: i for i in infos if i.type == pafs.FileType.File}


def list_markers(fs: pafs.S3FileSystem, bucket: str) -> list:
    infos = fs.get_file_info(pafs.FileSelector(bucket, recursive=True))
    return sorted(i.path[len(bucket) + 1:] for i in infos if i.type == pafs.FileType.Directory)


def read_object(fs: pafs.S3FileSystem, bucket: str, key: str) -> bytes:
    with fs.open_input_stream(f"{bucket}/{key}") as fh:
        return fh.read()


def bucket_state(fs: pafs.S3FileSystem, bucket: str) -> dict:
    """``{key: (size, mtime_ns, sha256 of the bytes)}`` of every file object: a key that was
    rewritten shows a new mtime even when its bytes are the same."""
    out = {}
    for key, info in list_objects(fs, bucket).items():
        data = read_object(fs, bucket, key)
        assert len(data) == info.size, key
        out[key] = (info.size, info.mtime_ns, hashlib.sha256(data).hexdigest())
    return out


# Names the pipeline gives its outputs: one of these appearing on local disk means some path
# was not routed through the data root.
OUTPUT_SUFFIXES = (".parquet", ".duckdb", ".duckdb.wal", ".pt", ".png", ".html")


def local_files(root, skip=(".git", ".venv", "__pycache__", ".pytest_cache", "node_modules")) -> set:
    out = set()
    for d, dirs, files in os.walk(root):
        dirs[:] = [x for x in dirs if x not in skip]
        for f in files:
            out.add(os.path.relpath(os.path.join(d, f), root))
    return out


def output_like(paths) -> list:
    return sorted(p for p in paths if p.endswith(OUTPUT_SUFFIXES) or ".tmp-" in p)
