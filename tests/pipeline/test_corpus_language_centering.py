"""The product rule through dg.materialize: the same corpus of text-only shards in six
languages, cut by language (one file each) or at random (3 files), gives the corpus stage the
same selection (features, checks, corpus_dedup, corpus_selection in gather mode, corpus_subset):
its vectors are centered by the corpus's language means, summed from the features' footers."""

import os
import tempfile

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from assets.corpus import CorpusConfig, corpus_dedup, corpus_selection, corpus_subset
from assets.partitions import register_shards
from resources.contract import DataContract
from resources.storage import DataRoot
from tests.engine.test_language_centering_corpus import (CUTS, OffsetEmbedder, TaggedScorer,
                                                         _corpus)

from .helpers import ALL_ASSETS

ASSETS = ALL_ASSETS + [corpus_dedup, corpus_selection, corpus_subset]


class TaggedContract(DataContract):
    """The default contract with the tests' language-offset model and tagged scorer."""

    def embedder(self):
        return OffsetEmbedder()

    def scorer(self):
        return TaggedScorer()


def _selected(root: str, files: dict, resources: dict) -> list:
    """The corpus stage on ``files`` (key: rows of the corpus) under ``root``: the ids it
    selected."""
    ids, texts, _ = _corpus()
    data_root = DataRoot(root=root)
    os.makedirs(data_root.raw_root)
    for key, rows in files.items():
        pq.write_table(pa.table({"chunk_id": ids[rows], "text": [texts[i] for i in rows]}),
                       data_root.raw_shard(key))
    res = {**resources, "data_root": data_root,
           "contract": TaggedContract(quality_min=0.0, quality_max=1.0)}
    with tempfile.TemporaryDirectory() as home, dg.instance_for_test(temp_dir=home) as inst:
        register_shards(inst, data_root.raw_root)
        for key in files:
            r = dg.materialize(ASSETS, partition_key=key, instance=inst, resources=res,
                               selection=dg.AssetSelection.assets("features"))
            assert all(e.passed for e in r.get_asset_check_evaluations())
        cfg = CorpusConfig(algorithm="Pair_simi", select_rows=25, mode="gather")
        r = dg.materialize(ASSETS, instance=inst, resources=res,
                           selection=dg.AssetSelection.assets("corpus_dedup",
                                                              "corpus_selection",
                                                              "corpus_subset"),
                           run_config=dg.RunConfig({"corpus_selection": cfg}))
        assert r.success
    return sorted(i for key in files if os.path.exists(data_root.corpus_selected(key))
                  for i in pq.read_table(data_root.corpus_selected(key)).column("chunk_id")
                  .to_pylist())


def test_the_corpus_selection_does_not_depend_on_the_cut(tmp_path, resources):
    _, _, langs = _corpus()
    got = {cut: _selected(str(tmp_path / cut), files_of(langs), resources)
           for cut, files_of in CUTS.items()}
    assert len(got["random"]) == 25 and len(set(got["random"])) == 25
    assert got["by_language"] == got["random"]
    # every language has a place in it (the model's regions are not read as diversity)
    assert len({langs[i] for i in got["random"]} & {"en", "de", "fr", "es"}) == 4
