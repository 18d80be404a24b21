"""All file access by URI, through ``pyarrow.fs``, so that object storage works unchanged.
This package only gathers the public API; each submodule holds one responsibility:
:mod:`.uris` (locations), :mod:`.keys` (safe names), :mod:`.publish` (atomic writes),
:mod:`.subset` (copying selected rows), :mod:`.layout` (where each file lives under the data
root).
"""

from .keys import partition_key_for, safe_child, validate_partition_key
from .layout import DataLayout
from .publish import atomic_output, atomic_write_bytes, atomic_write_table
from .subset import write_selected_rows
from .uris import (
    StorageError,
    exists,
    is_local,
    join,
    list_dirs,
    list_file_infos,
    list_files,
    makedirs,
    read_bytes,
    read_column,
    read_table,
    remove,
    resolve,
    sha256,
    size,
)

__all__ = [
    "StorageError",
    "resolve",
    "join",
    "exists",
    "remove",
    "makedirs",
    "read_bytes",
    "read_table",
    "read_column",
    "list_file_infos",
    "list_files",
    "list_dirs",
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
    "DataLayout",
]
