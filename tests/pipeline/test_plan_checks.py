"""Issue 20, item 5: the dry run (``python -m datamask_pipeline.plan``) agrees with automation
on a shard whose blocking checks failed: automation does not launch it, so the plan neither
lists nor prices it (it shows it apart, as blocked), until its raw file is rewritten."""

import os
import time
from datetime import timedelta

import pyarrow.parquet as pq

from datamask_pipeline import plan
from datamask_pipeline.plan import cli as plan_cli
from datamask_pipeline.engine.sample import make_table

from .helpers import DIM, ROWS
from .test_automation import FULL, T0, Evaluator, _apply, _defs, _tick

CRON = "0 3 * * *"


def _launched(ev, at) -> set:
    """The shards automation requests at ``at`` (any per-shard asset)."""
    got = ev(at)
    got.pop("corpus_summary", None)
    return {k for keys in got.values() for k in keys}


def test_a_shard_with_failed_checks_is_blocked_in_the_plan_as_in_automation(
        instance, corpus, data_root, run_chain, resources, monkeypatch):
    monkeypatch.setenv("DATAMASK_AUTOMATION", "per_shard")  # _defs: the per-shard scope
    a, b, c = corpus
    # c's raw file breaks a blocking check (duplicated ids)
    table = make_table(ROWS, dim=DIM, seed=9, id_offset=7 * ROWS)
    ids = table.column("chunk_id").to_pylist()
    ids[1] = ids[0]
    pq.write_table(table.set_column(0, "chunk_id", [ids]), data_root.raw_shard(c))
    first = _tick(instance, data_root)
    _apply(instance, first)  # registered and observed, as the raw-shard sensor does
    for key in (a, b):
        run_chain(key, selection=FULL, mask_config=None)
    assert not run_chain(c, selection=FULL, raise_on_error=False, mask_config=None).success

    # automation, even with the refresh cron due: nothing for c (nor for a and b: up to date)
    ev = Evaluator(instance, _defs(resources, refresh=CRON))
    ev(T0)
    assert _launched(ev, T0 + timedelta(hours=2, minutes=1)) == set()  # past the 03:00 tick
    p = plan.plan(instance, data_root)
    assert p.reasons == {}  # was {c: "missing: no selected subset yet"}, priced
    assert p.blocked == {c: ["unique_ids"]}
    assert p.total_rows == 0 and c not in p.rows
    text = plan.render(p)
    assert "0 of 3 registered shard(s) need a run" in text and "blocked" in text and c in text
    assert p.as_dict()["to_run"] == 0
    # under the corpus scope too: c has its features, is listed apart, and is not relaunched
    pc = plan.plan(instance, data_root, scope="corpus")
    assert pc.reasons == {} and pc.blocked == {c: ["unique_ids"]}

    # the raw file fixed: automation relaunches c, and the plan lists and prices it again
    pq.write_table(make_table(ROWS, dim=DIM, seed=10, id_offset=9 * ROWS), data_root.raw_shard(c))
    stamp = time.time() + 30
    os.utime(data_root.raw_shard(c), (stamp, stamp))
    _apply(instance, _tick(instance, data_root, first.cursor))
    assert _launched(ev, T0 + timedelta(hours=2, minutes=2)) == {c}
    p = plan.plan(instance, data_root)
    assert list(p.reasons) == [c] and p.blocked == {}
    assert p.rows[c] == ROWS


def test_keys_output_is_what_a_backfill_takes(registered, run_chain, instance, data_root, capsys,
                                              monkeypatch):
    a, b, c = registered
    run_chain(a, selection=FULL, mask_config=None)
    p = plan.plan(instance, data_root)
    assert sorted(p.reasons) == [b, c]
    monkeypatch.setattr(plan.dg.DagsterInstance, "get", staticmethod(lambda: instance))
    monkeypatch.setenv("DAGSTER_HOME", instance.root_directory)
    assert plan_cli.main(["--keys"]) == 0
    assert capsys.readouterr().out.strip() == f"{b},{c}"
