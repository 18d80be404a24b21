"""Safe names under a root: partition-key rules, the key of a raw file, and
:func:`safe_child`, which joins a relative path to a root and refuses anything that could
leave it (absolute paths, '..', symlinks pointing outside, ...).
"""

from __future__ import annotations

import os
import re

from .uris import StorageError, _basename, _scheme, join, resolve

__all__ = ["validate_partition_key", "partition_key_for", "safe_child"]

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

