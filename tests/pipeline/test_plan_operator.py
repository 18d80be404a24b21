"""Issue 26, points 2 and 9: the dry run (``python -m datamask_pipeline.plan``) is safe to act
on and says true things.

Point 2: with nothing due, ``--keys`` printed an empty line and ``dagster job backfill
--partitions ""`` then backfilled every shard. Now ``--keys`` prints nothing and exits 1, and
``--launch`` launches exactly the shards listed, as ONE Dagster asset backfill, or nothing.

Point 9: on an empty instance it said "up to date (nothing new since the last
corpus_selection)"; while a backfill was queued it said "4 shard(s) of the last selection are
gone … over 0 shard(s)". Now: an empty instance is said to be empty, shards a backfill or a
queued run has are in progress (not gone, not listed twice), and a removed shard is gone.
"""

import os
from contextlib import contextmanager

import dagster as dg
import pyarrow.parquet as pq
import pytest
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import create_test_daemon_workspace_context
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

from assets.corpus import corpus_dedup, corpus_selection, corpus_subset
from assets.partitions import register_shards
from datamask_pipeline import plan
from datamask_pipeline.plan import cli as plan_cli
from datamask_pipeline.engine.sample import make_table

from .helpers import ALL_ASSETS, DIM, KEYS, ROWS

ASSETS = ALL_ASSETS + [corpus_dedup, corpus_selection, corpus_subset]
DEFS_FILE = os.path.join(os.path.dirname(__file__), "schedule_defs.py")
QUEUED = {"run_coordinator": {"module": "dagster._core.run_coordinator",
                              "class": "QueuedRunCoordinator"}}


@pytest.fixture
def queued_instance(tmp_path):
    """An instance whose runs wait in the run queue (no queue daemon here): what a user sees
    while a backfill's runs are queued."""
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home"), overrides=QUEUED) as inst:
        yield inst


def features_of(instance, resources, key):
    r = dg.materialize(ASSETS, partition_key=key, instance=instance, resources=resources,
                       selection=dg.AssetSelection.assets("features"))
    assert r.success


def corpus_run(instance, resources):
    """The corpus job's three steps, dedup off (faster; the plan reads only the selection)."""
    r = dg.materialize(ASSETS, instance=instance, resources=resources,
                       selection=dg.AssetSelection.assets(corpus_dedup, corpus_selection,
                                                          corpus_subset),
                       run_config=dg.RunConfig({
                           "corpus_dedup": {"config": {"enabled": False}},
                           "corpus_selection": {"config": {"algorithm": "Pair_simi",
                                                           "select_rows": 60}}}))
    assert r.success


def rewrite(data_root, key, seed):
    """A new version of a raw shard (new rows, newer mtime)."""
    pq.write_table(make_table(ROWS, dim=DIM, seed=seed, id_offset=seed * ROWS),
                   data_root.raw_shard(key))


def dry_run(instance, capsys, *argv) -> tuple:
    """(exit code, stdout, stderr) of ``python -m datamask_pipeline.plan ARGV`` on ``instance``."""
    rc = plan_cli.main(list(argv), instance=instance)
    out = capsys.readouterr()
    return rc, out.out, out.err


@contextmanager
def workspace(instance):
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(python_file=DEFS_FILE, attribute="defs",
                             working_directory=os.getcwd()), location_name="datamask")
    with create_test_daemon_workspace_context(InProcessWorkspaceLoadTarget([origin]),
                                              instance) as ctx:
        yield ctx


def backfill_daemon_iteration(ctx):
    """One iteration of Dagster's backfill daemon (what ``dagster dev`` runs): it creates the
    backfill's runs, which the queued run coordinator leaves QUEUED."""
    import logging

    import dagster._daemon  # noqa: F401  (import order of the daemon modules)
    from dagster._daemon.backfill import execute_backfill_iteration

    for err in execute_backfill_iteration(ctx, logging.getLogger("backfill")):
        assert err is None, err


# ------------------------------------------------------------------ point 9: empty instance
def test_an_empty_instance_is_said_to_be_empty(instance, data_root, capsys):
    rc, out, _ = dry_run(instance, capsys)
    assert rc == 0
    assert "up to date" not in out  # was: "up to date (nothing new since the last corpus_selection)"
    assert "no shard is registered" in out
    assert "0 of 0 registered shard(s)" in out
    c = plan.corpus_plan(instance, data_root)
    assert c["state"] == "no shards" and not c["due"] and c["last_selection"] is None


def test_registered_shards_without_features_are_no_input_yet(instance, registered, data_root,
                                                             capsys):
    rc, out, _ = dry_run(instance, capsys)
    assert "up to date" not in out
    assert "none of the 3 registered shard(s) has features that passed their checks" in out
    assert "3 of 3 registered shard(s) need a run of features" in out


# ------------------------------------------------------------------ point 2: keys and launch
def test_nothing_due_prints_no_keys_and_launches_nothing(instance, data_root, capsys):
    rc, out, err = dry_run(instance, capsys, "--keys")
    assert rc == 1 and out == ""  # was: exit 0 and an empty line, which backfills every shard
    assert "nothing to run" in err
    rc, out, _ = dry_run(instance, capsys, "--launch")
    assert rc == 0 and "launched nothing" in out
    assert instance.get_backfills() == []


def test_launch_backfills_exactly_what_the_dry_run_lists_once(instance, registered, data_root,
                                                               resources, capsys):
    a, b, c = registered
    features_of(instance, resources, a)
    listed = sorted(plan.plan(instance, data_root).reasons)
    assert listed == [b, c]
    rc, keys, _ = dry_run(instance, capsys, "--keys")
    assert rc == 0 and keys.strip() == f"{b},{c}"

    rc, out, _ = dry_run(instance, capsys, "--launch")
    assert rc == 0 and "launched backfill" in out
    [backfill] = instance.get_backfills()
    target = backfill.asset_backfill_data.target_subset
    assert set(target.asset_keys) == {dg.AssetKey("features")}  # the scope's steps (corpus)
    assert sorted(target.get_partitions_subset(dg.AssetKey("features")).get_partition_keys()) \
        == listed
    assert backfill.tags[plan.LAUNCH_TAG] == "plan"

    # the backfill has them now: listed as in progress, not again, and not launched twice
    p = plan.plan(instance, data_root)
    assert p.reasons == {} and sorted(p.in_progress) == listed
    assert backfill.backfill_id in p.in_progress[b]
    rc, out, _ = dry_run(instance, capsys, "--keys")
    assert rc == 1 and out == ""
    rc, out, _ = dry_run(instance, capsys, "--launch")
    assert "launched nothing" in out and len(instance.get_backfills()) == 1
    assert "2 shard(s) in progress" in out


# ------------------------------------------------------------------ point 9: during backfills
def test_during_a_queued_backfill_its_shards_are_in_progress_not_gone(
        queued_instance, corpus, data_root, resources, capsys):
    inst = queued_instance
    register_shards(inst, data_root.raw_root)
    for key in KEYS:
        features_of(inst, resources, key)
    corpus_run(inst, resources)
    assert plan.corpus_plan(inst, data_root)["state"] == "up to date"

    # two shards rewritten: the dry run lists them, then launches them as one backfill
    for i, key in enumerate(KEYS[:2]):
        rewrite(data_root, key, 20 + i)
    assert sorted(plan.plan(inst, data_root).reasons) == KEYS[:2]
    plan_cli.main(["--launch"], instance=inst)
    capsys.readouterr()

    def check(what):
        p = plan.plan(inst, data_root)
        assert p.reasons == {} and sorted(p.in_progress) == KEYS[:2], what
        c = plan.corpus_plan(inst, data_root)
        assert c["removed"] == [] and c["changed"] == [], (what, c)  # was: 2 "gone"
        assert c["waiting"] and not c["due"] and sorted(c["in_progress"]) == KEYS[:2], what
        assert c["shards"] == 1, what  # the idle one; the two others are in progress
        rc, out, _ = dry_run(inst, capsys)
        assert "are gone" not in out and "removed:" not in out, out
        assert "corpus selection waits: 2 shard(s) in progress" in out, out
        return p

    check("backfill requested, no run yet")
    # the daemon creates the backfill's runs; they wait in the queue (checks planned)
    with workspace(inst) as ctx:
        backfill_daemon_iteration(ctx)
    runs = inst.get_runs()
    queued = [r for r in runs if r.status == dg.DagsterRunStatus.QUEUED]
    assert len(queued) == 2, [(r.status, r.tags) for r in runs]
    p = check("runs queued")
    assert all("queued or running" in p.in_progress[k] or "backfill" in p.in_progress[k]
               for k in KEYS[:2])


# ------------------------------------------------------------------ point 9: after removals
def test_after_removals_a_gone_shard_is_gone_and_a_failing_one_is_left_out(
        instance, registered, data_root, resources, capsys):
    for key in KEYS:
        features_of(instance, resources, key)
    corpus_run(instance, resources)
    a, b, c = KEYS

    os.remove(data_root.raw_shard(a))  # removed from the raw location
    instance.delete_dynamic_partition("shards", b)  # unregistered
    c_plan = plan.corpus_plan(instance, data_root)
    assert c_plan["removed"] == [a, b] and c_plan["due"]
    assert c_plan["shards"] == 1 and c_plan["state"] == "changed"
    rc, out, _ = dry_run(instance, capsys)
    assert "2 shard(s) of the last selection are gone" in out
    assert f"removed: {a}" in out and f"removed: {b}" in out
    assert "over 1 shard(s)" in out

    # c now fails a blocking check: left out, said so, and not "gone"
    table = make_table(ROWS, dim=DIM, seed=9, id_offset=7 * ROWS)
    ids = table.column("chunk_id").to_pylist()
    ids[1] = ids[0]
    pq.write_table(table.set_column(0, "chunk_id", [ids]), data_root.raw_shard(c))
    r = dg.materialize(ASSETS, partition_key=c, instance=instance, resources=resources,
                       selection=dg.AssetSelection.assets("features"), raise_on_error=False)
    assert not r.success
    c_plan = plan.corpus_plan(instance, data_root)
    assert c_plan["removed"] == [a, b] and c_plan["failing"] == [c] and c_plan["shards"] == 0
    assert not c_plan["due"] and c_plan["state"] == "no input"  # nothing left to select from
    rc, out, _ = dry_run(instance, capsys)
    assert f"removed: {c}" not in out and f"checks failed: {c}" in out
    assert "not launched: none of the 2 registered shard(s) now has features that passed" in out
