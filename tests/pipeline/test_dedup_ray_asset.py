"""corpus_dedup with engine "ray" through dg.materialize: the same corpus/duplicates.parquet
as the local engine on the tiny corpus plus a shard of copies, with Ray started by the `ray`
resource (dagster-ray) only for the ray-engine step and stopped after it; a wrong engine name
fails naming the choices."""

import math
import os

import dagster as dg
import pyarrow.parquet as pq
import ray

from assets.corpus import corpus_dedup
from assets.partitions import register_shards

from .helpers import ALL_ASSETS, KEYS
from .test_corpus_stage import _dup_shard, _features, _meta

ASSETS = ALL_ASSETS + [corpus_dedup]
KNOBS = {"rows_per_cluster": 200}


def _dedup(instance, resources, raise_on_error=True, **config):
    return dg.materialize(ASSETS, instance=instance, resources=resources,
                          selection=dg.AssetSelection.assets("corpus_dedup"),
                          run_config=dg.RunConfig({"corpus_dedup": {"config": {**KNOBS, **config}}}),
                          raise_on_error=raise_on_error)


def _duplicates(data_root):
    t = pq.read_table(os.path.join(data_root.corpus_dir(), "duplicates.parquet"))
    return t.sort_by([("partition_key", "ascending"), ("row", "ascending")])


def _rows(t):
    """The table's rows with NaN as None (NaN != NaN would fail any comparison)."""
    return [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in t.to_pylist()]


def test_ray_engine_writes_the_local_engines_duplicates(instance, corpus, data_root, resources):
    _dup_shard(data_root, "shard_copy", KEYS[0], list(range(0, 40, 4)), 50_000)
    register_shards(instance, data_root.raw_root)
    for key in KEYS + ["shard_copy"]:
        _features(instance, resources, key)

    local = _dedup(instance, resources)
    assert not ray.is_initialized()  # the local engine starts no Ray
    want = _duplicates(data_root)
    distributed = _dedup(instance, resources, engine="ray", ray_partitions=2)
    assert not ray.is_initialized()  # the resource stopped the Ray it started
    got = _duplicates(data_root)

    assert got.num_rows == want.num_rows > 10 and got.schema == want.schema
    assert _rows(got) == _rows(want)
    # the evidence, the same in both engines: every drop's kind, both measures, its kept row
    assert {"kind", "containment", "cosine", "kept_partition_key", "kept_row",
            "kept_id"} <= set(got.column_names)
    assert not any(math.isnan(r["cosine"]) or math.isnan(r["containment"]) for r in got.to_pylist())
    assert set(got.column("kind").to_pylist()) <= {"exact", "fuzzy", "semantic"}
    copies = {r: (k, o) for p, r, k, o in zip(*(got.column(c).to_pylist() for c in (
        "partition_key", "row", "dup_of_partition_key", "dup_of_row"))) if p == "shard_copy"}
    assert copies == {i: (KEYS[0], 4 * i) for i in range(10)}
    m_local, m_ray = _meta(local, "corpus_dedup"), _meta(distributed, "corpus_dedup")
    assert m_local["engine"].value == "local" and m_ray["engine"].value == "ray"
    for key in ("dropped", "dropped_exact", "dropped_fuzzy", "dropped_near", "clusters"):
        assert m_ray[key].value == m_local[key].value, key
    assert m_ray["clusters"].value > 1


def test_an_unknown_engine_fails_naming_the_choices(instance, corpus, data_root, resources):
    r = _dedup(instance, resources, raise_on_error=False, engine="spark")
    assert not r.success
    msg = [e for e in r.all_events if e.is_step_failure][0].step_failure_data.error.message
    assert "engine must be one of ['local', 'ray']" in msg and "'spark'" in msg
    assert not ray.is_initialized()
