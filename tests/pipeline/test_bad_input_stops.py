"""Where bad input stops (issue 20 item 18, docs/contract.md "Where each kind of bad input stops"): a
file that cannot be mapped fails the ``features`` step once, as a ``Failure`` with a readable
description and no chained second trace; value rules are the blocking checks."""

import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.partitions import register_shards
from datamask_pipeline.engine import contract as C
from datamask_pipeline.engine.sample import make_table
from tests.doc_pages import page

from .helpers import DIM, ROWS

CONTRACT = page("contract.md")


def _drop_quality(t):
    # without a text column too: a text would have its quality scored (engine.quality)
    return t.drop_columns(["quality_score", "text"]), "quality_score", C.PRESENT.name


def _string_quality(t):
    q = pa.array([str(v) for v in t.column("quality_score").to_pylist()])
    return t.set_column(1, "quality_score", q), "quality_score", C.QUALITY_TYPE.name


def _uint64_ids(t):
    ids = np.arange(t.num_rows, dtype=np.uint64)
    ids[3] = 2**63
    return t.set_column(0, "chunk_id", pa.array(ids)), "chunk_id", C.ID_INT64.name


def _unreadable(t):
    return None, None, C.READABLE.name


CASES = [_drop_quality, _string_quality, _uint64_ids, _unreadable]


@pytest.mark.parametrize("defect", CASES, ids=[c.__name__.strip("_") for c in CASES])
def test_unmappable_input_fails_the_features_step_once(defect, instance, data_root, run_chain):
    key = "bad_input"
    table, column, rule = defect(make_table(ROWS, dim=DIM, seed=5))
    os.makedirs(data_root.raw_root, exist_ok=True)
    raw = data_root.raw_shard(key)
    if table is None:
        with open(raw, "wb") as fh:
            fh.write(b"PAR1 this is not parquet PAR1")
    else:
        pq.write_table(table, raw)
    register_shards(instance, data_root.raw_root)

    result = run_chain(key, raise_on_error=False)
    assert not result.success
    failures = [e for e in result.all_events if e.is_step_failure]
    assert [e.step_key for e in failures] == ["features"]
    data = failures[0].step_failure_data
    desc = data.user_failure_data.description  # a dagster Failure, with its description
    assert desc.startswith(f"partition '{key}': ingestion failed: {raw}: ")
    assert f"rule '{rule}' broken" in desc
    if column:
        assert f"column '{column}'" in desc
    md = {k: v.value for k, v in data.user_failure_data.metadata.items()}
    assert md["rule"] == rule and md.get("column") == column and md["raw_uri"] == raw
    # printed once: the engine's exception is not chained under it (no second message+trace)
    assert data.error.cause is None and data.error.context is None
    assert data.error.to_string().count(f"rule '{rule}'") == 1
    # not retried, nothing written, nothing downstream ran
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert not os.path.exists(data_root.features(key))
    assert not result.get_asset_materialization_events()
    assert not result.get_asset_check_evaluations()


def _stops_paragraph() -> str:
    start = CONTRACT.index("**Where each kind of bad input stops.**")
    return CONTRACT[start:CONTRACT.index("\n\n", CONTRACT.index("- **An impossible", start))]


def test_readme_says_where_each_rule_stops():
    text = _stops_paragraph()
    features, checks, config = re.split(r"\n- \*\*", text)[1:]
    assert features.startswith("The `features` step") and "`Failure`" in features
    assert checks.startswith("The blocking checks")
    assert config.startswith("An impossible mask config")
    stop_at_features = {r.name for r in C.RULES if r.scope in ("file", "type")} | {C.ID_INT64.name}
    for rule in stop_at_features:
        assert f"`{rule}`" in " ".join(features.split()), rule
    # every rule of the contract table is on the page, and the rest are check rules
    for rule in C.RULES:
        assert rule.name.split(" [")[0].split(" {")[0] in CONTRACT
    assert "invalid mask configuration: select_ratio must be in (0, 1), got 1.5" in " ".join(
        config.split())
