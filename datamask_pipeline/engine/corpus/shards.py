"""The corpus's shards as the selection reads them: a :class:`CorpusShard` from a shard's
features file on the data root (row count, version, a loader that pickles for Ray tasks, which
centers the vectors by the corpus's language means: :func:`open_shards`) and, for token
budgets, a loader of its rows' token counts from the raw file, called by the shard's own tasks
(never by the coordinator: it would read, or tokenize, the whole corpus)."""

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
from ..embed import LanguageSums
from ..id_column import file_columns

if TYPE_CHECKING:  # select imports torch: loading the definitions must not
    from .select import CorpusShard

__all__ = ["features_loader", "open_shard", "open_shards", "read_tokens"]


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


def features_loader(uri: str, expected_dim=None, quality_range=None,
                    language_sums: LanguageSums | None = None):
    """A shard's features reader that pickles (engine functions and plain values only), so
    a Ray task can read the shard where it runs; re-checked against the contract as
    ``read_features`` does. ``language_sums``: the sums whose language means center the
    vectors (the corpus's; None: the shard's own, ``read_shard``)."""
    return functools.partial(read_shard, uri,
                             columns=Columns(id=ID, quality=(QUALITY,), embedding=EMBEDDING),
                             expected_dim=expected_dim, quality_range=quality_range,
                             language_sums=language_sums)


def _footer(layout: storage.DataLayout, key: str) -> tuple | None:
    """(rows, language sums or None, the file's size and time) of shard ``key``'s features,
    from their footer; None when there are none."""
    uri = layout.features(key)
    if not storage.exists(uri):
        return None
    fs, path = storage.resolve(uri)
    with fs.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        n, sums = pf.metadata.num_rows, LanguageSums.from_footer(pf.schema_arrow.metadata)
    info = fs.get_file_info(path)
    return int(n), sums, f"{info.size}:{info.mtime_ns}"


def _shard(layout, key: str, footer: tuple, expected_dim, quality_range, tokens,
           language_sums: LanguageSums | None) -> CorpusShard:
    from .select import CorpusShard

    n, own, version = footer
    if own is not None and language_sums is not None:
        version += f":lang-{language_sums.digest()}"  # its vectors change with the corpus's means
    counts = functools.partial(tokens, layout.raw_shard(key)) if tokens is not None else None
    return CorpusShard(key=key, n=n, tokens=counts, version=version,
                       load=features_loader(layout.features(key), expected_dim, quality_range,
                                            language_sums if own is not None else None))


def open_shard(layout: storage.DataLayout, key: str, *, expected_dim=None, quality_range=None,
               tokens: Callable[[str], np.ndarray] | None = None,
               language_sums: LanguageSums | None = None) -> CorpusShard | None:
    """Shard ``key`` of the corpus, read from its features file (None when there is none):
    its rows, its version (the file's size and time) and its loader; ``tokens(raw_uri)``
    gives its rows' token counts for a token budget (a picklable function, e.g. a
    ``functools.partial`` of :func:`read_tokens`): the shard keeps ``tokens`` bound to its raw
    file, unread, and its tasks call it where they run. ``language_sums``: the corpus's, by
    whose language means the loader centers the vectors (None: the shard's own)."""
    footer = _footer(layout, key)
    return None if footer is None else _shard(layout, key, footer, expected_dim, quality_range,
                                              tokens, language_sums)


def open_shards(layout: storage.DataLayout, keys, *, expected_dim=None, quality_range=None,
                tokens: Callable[[str], np.ndarray] | None = None) -> dict:
    """{key: :func:`open_shard`, or None without features} for the corpus of shards ``keys``,
    each loader centering the vectors by the corpus's language means: the sum of the language
    sums their features' footers record (``engine.embed.LanguageSums``; one footer read per
    shard, no row), so the vectors do not depend on how the corpus was cut into files."""
    footers = {key: _footer(layout, key) for key in keys}
    corpus = LanguageSums.total(f[1] for f in footers.values() if f is not None)
    return {key: None if f is None else _shard(layout, key, f, expected_dim, quality_range,
                                               tokens, corpus)
            for key, f in footers.items()}
