"""The corpus's shards as the selection reads them: a :class:`CorpusShard` from a shard's
features file on the data root (row count, version, a loader that pickles for Ray tasks) and,
for token budgets, a loader of its rows' token counts from the raw file, called by the shard's
own tasks (never by the coordinator: it would read, or tokenize, the whole corpus)."""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .. import storage
from ..contract import EMBEDDING, ID, QUALITY
from ..data import Columns, DataContractError, read_shard
from ..id_column import file_columns

if TYPE_CHECKING:  # select imports torch: loading the definitions must not
    from .select import CorpusShard

__all__ = ["features_loader", "open_shard", "read_tokens"]


# the token counts of the last few raw files this process read (tasks read a shard's counts
# once per pass; a text column is tokenized again only when its file left this cache)
TOKEN_CACHE_FILES = 8
_TOKEN_CACHE: OrderedDict = OrderedDict()


def read_tokens(raw_uri: str, *, token_column: str | None, text_column: str | None,
                tokenizer: str) -> np.ndarray:
    """Each row's token count: the raw file's ``token_column`` (non-null integers), else the
    text column counted by ``tokenizer`` (``tokens.count_tokens``). The counts of the last
    ``TOKEN_CACHE_FILES`` files read in this process are kept, keyed by the file's size and
    time, so a shard's task passes do not tokenize it again."""
    fs, path = storage.resolve(raw_uri)
    info = fs.get_file_info(path)
    key = (raw_uri, info.size, info.mtime_ns, token_column, text_column, tokenizer)
    if key in _TOKEN_CACHE:
        _TOKEN_CACHE.move_to_end(key)
        return _TOKEN_CACHE[key].copy()
    counts = _read_tokens(raw_uri, token_column=token_column, text_column=text_column,
                          tokenizer=tokenizer)
    _TOKEN_CACHE[key] = counts.copy()
    while len(_TOKEN_CACHE) > TOKEN_CACHE_FILES:
        _TOKEN_CACHE.popitem(last=False)
    return counts


def _read_tokens(raw_uri: str, *, token_column, text_column, tokenizer) -> np.ndarray:
    if token_column:
        col = storage.read_column(raw_uri, token_column)
        if col is None:
            raise DataContractError(raw_uri, "column present", column=token_column,
                                    detail=f"token_column; available columns: "
                                           f"{file_columns(raw_uri)}")
        if not pa.types.is_integer(col.type) or col.null_count:
            raise DataContractError(raw_uri, "token counts are non-null integers",
                                    column=token_column)
        return col.to_numpy().astype(np.int64)
    text = storage.read_column(raw_uri, text_column) if text_column else None
    if text is None:
        raise DataContractError(raw_uri, "column present", column=text_column or "text",
                                detail="select_tokens without token_column counts tokens "
                                       f"from the text; available columns: "
                                       f"{file_columns(raw_uri)}")
    from .tokens import count_tokens

    return count_tokens(text, tokenizer)


def features_loader(uri: str, expected_dim=None, quality_range=None):
    """A shard's features reader that pickles (engine functions and plain values only), so
    a Ray task can read the shard where it runs; re-checked against the contract as
    ``read_features`` does."""
    return functools.partial(read_shard, uri,
                             columns=Columns(id=ID, quality=(QUALITY,), embedding=EMBEDDING),
                             expected_dim=expected_dim, quality_range=quality_range)


def open_shard(layout: storage.DataLayout, key: str, *, expected_dim=None, quality_range=None,
               tokens: Callable[[str], np.ndarray] | None = None) -> CorpusShard | None:
    """Shard ``key`` of the corpus, read from its features file (None when there is none):
    its rows, its version (the file's size and time) and its loader; ``tokens(raw_uri)``
    gives its rows' token counts for a token budget (a picklable function, e.g. a
    ``functools.partial`` of :func:`read_tokens`): the shard keeps ``tokens`` bound to its raw
    file, unread, and its tasks call it where they run."""
    uri = layout.features(key)
    if not storage.exists(uri):
        return None
    fs, path = storage.resolve(uri)
    with fs.open_input_file(path) as fh:
        n = pq.ParquetFile(fh).metadata.num_rows
    counts = functools.partial(tokens, layout.raw_shard(key)) if tokens is not None else None
    info = fs.get_file_info(path)
    from .select import CorpusShard

    return CorpusShard(key=key, n=int(n), tokens=counts, version=f"{info.size}:{info.mtime_ns}",
                       load=features_loader(uri, expected_dim, quality_range))
