"""Token counts per row from the text, with a named tokenizer (for token budgets).

* ``whitespace``: words separated by whitespace (pyarrow, vectorised);
* ``wordllama``: the subword tokenizer shipped inside the wordllama wheel (the default
  embedding model's, l2_supercat), every token of the text counted (no truncation).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..config import ConfigError

__all__ = ["TOKENIZERS", "count_tokens"]

TOKENIZERS = ("wordllama", "whitespace")


def count_tokens(texts, tokenizer: str = "wordllama", batch: int = 4096) -> np.ndarray:
    """Tokens of each text (int64; a null text counts 0)."""
    arr = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(texts, pa.string())
    if tokenizer == "whitespace":
        words = pc.list_value_length(pc.utf8_split_whitespace(pc.utf8_trim_whitespace(arr)))
        empty = pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(arr)), 0)
        return pc.fill_null(pc.if_else(empty, 0, words), 0).to_numpy(zero_copy_only=False) \
            .astype(np.int64)
    if tokenizer == "wordllama":
        from ..embed import WordLlamaEmbedder

        tok = WordLlamaEmbedder()._tok  # the shipped tokenizer, truncation off
        values = [t or "" for t in arr.to_pylist()]
        out = np.empty(len(values), dtype=np.int64)
        for s in range(0, len(values), batch):
            enc = tok.encode_batch(values[s:s + batch], add_special_tokens=False)
            out[s:s + len(enc)] = [len(e.ids) for e in enc]
        return out
    raise ConfigError(f"tokenizer={tokenizer!r}: one of {TOKENIZERS}")
