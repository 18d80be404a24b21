"""Which column of a raw file holds the row ids: the one rule that ``train_mask`` and the demo
(and through it the pipeline's ``DATAMASK_ID_COLUMN``) both follow.

* a column named on the command line (``--id-column``) or in the environment is used as it is
  (and must exist);
* else ``chunk_id`` (the default, upstream's name) when the file has it;
* else ``id`` when the file has it, and the command says so;
* else the file has no id column: the data contract's error (rule 'column present', as
  ``read_shard`` and the pipeline's ingestion word it) listing the file's columns and the flag.
"""

from __future__ import annotations

from .contract import DEFAULT_NAMES, ID
from .errors import DataContractError

DEFAULT = DEFAULT_NAMES[ID]  # chunk_id
FALLBACKS = ("id",)


class IdColumnError(DataContractError):
    """The file has no column the ids can come from (the contract's rule 'column present')."""


def detect_id_column(names, given: str | None = None, *, where: str = "the file",
                     flag: str = "--id-column") -> tuple:
    """(the id column, a note for the user or None) for a file whose columns are ``names``.
    ``given``: a column the user named (it must be among ``names``); ``where``: the file, as
    the messages name it. Raises IdColumnError."""
    names = list(names)
    cols = ", ".join(names)
    if given:
        if given not in names:
            raise IdColumnError(where, "column present", column=given,
                                detail=f"{flag} {given} names no column of it (its columns: "
                                       f"{cols})")
        return given, None
    if DEFAULT in names:
        return DEFAULT, None
    for name in FALLBACKS:
        if name in names:
            return name, (f"id column: {name!r} ({where} has no {DEFAULT!r}; {flag} names "
                          "another)")
    raise IdColumnError(where, "column present", column=DEFAULT,
                        detail=f"no id column: expected {DEFAULT!r} or "
                               f"{' or '.join(repr(n) for n in FALLBACKS)} (its columns: {cols}); "
                               f"{flag} NAME names it")


def file_columns(uri: str) -> list:
    """The column names of a parquet file (path or URI), from its footer."""
    import pyarrow.parquet as pq

    from . import storage

    fs, path = storage.resolve(uri)
    with fs.open_input_file(path) as fh:
        return list(pq.ParquetFile(fh).schema_arrow.names)
