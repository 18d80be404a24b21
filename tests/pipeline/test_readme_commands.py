"""Issue 20, items 3, 8 and 19: the documented sensor and backfill commands, run as written
(from the fenced blocks of README.md and of every page under docs/, where docs/operate.md holds
them) against a temporary DAGSTER_HOME, and the documented ``dagster``/``dg`` commands from a
new shell without DAGSTER_HOME (a warning naming the fix).

* item 3: every ``dagster sensor`` command of the README runs, and starts or stops the sensor
  in the code location ``dagster dev -w workspace.yaml`` runs (``datamask``), not in one named
  after the module, which no daemon of ours would run;
* item 8: the docs' way of re-running many shards queues one run per shard in the
  ``datamask`` location (for the daemon) from a list, and ``plan --launch`` records one asset
  backfill of exactly the shards the dry run lists;
* item 19: without DAGSTER_HOME, ``dagster asset materialize`` and ``dg launch`` say which
  ``export`` line to run.
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import dagster as dg
import pytest

from datamask_pipeline import settings
from datamask_pipeline.engine.sample import generate_corpus
from tests.doc_pages import page, site_pages

REPO = settings.repo_root()
BIN = Path(sys.executable).parent
# the front page and the site's pages, each page's blocks in order
README = "\n".join(page(name) for name in ["README.md", *site_pages()])
_FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def readme_commands(word: str) -> list:
    """The command lines of the docs' fenced bash blocks that contain ``word``
    (backslash continuations joined), with ``.venv/bin/`` pointing at this interpreter's."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if word in line:
                out.append(line.replace(".venv/bin/", f"{BIN}/"))
    return out


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATAMASK_", "DAGSTER_"))}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return env


def _sh(line: str, env: dict, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], cwd=str(REPO), env=env, capture_output=True,
                          text=True, timeout=timeout)


def _ok(line: str, env: dict) -> str:
    out = _sh(line, env)
    assert out.returncode == 0, f"{line}\n{out.stdout[-3000:]}\n{out.stderr[-4000:]}"
    return out.stdout


@pytest.fixture
def home_env(tmp_path):
    """A user's shell: DAGSTER_HOME exported (a temporary one), two registered shards."""
    with tempfile.TemporaryDirectory(dir=_FAST_TMP, prefix="datamask-readme-home-") as home:
        env = _env(DAGSTER_HOME=home, DATAMASK_DATA_ROOT=str(tmp_path / "data"),
                   DATAMASK_DEVICE="cpu", DATAMASK_EMBEDDING_DIM="16")
        generate_corpus(str(tmp_path / "data" / "raw"), n_shards=2, rows_per_shard=200, dim=16,
                        seed=1)
        _ok(f"{BIN}/python -m datamask_pipeline.register", env)
        yield env


def _states(listing: str) -> dict:
    return dict(re.findall(r"Sensor: (\w+) \[(\w+)\]", listing))


def test_readme_sensor_commands_run_and_reach_the_daemons_location(home_env):
    lines = readme_commands("dagster sensor ")
    assert [ln.split()[2] for ln in lines] == ["start", "start", "list", "stop"], lines
    assert "sensor start -m" not in README and "sensor stop -m" not in README
    outputs = [_ok(line, home_env) for line in lines]
    # `sensor list` ran after both starts
    assert _states(outputs[2]) == {"raw_shard_sensor": "RUNNING",
                                   "datamask_automation": "RUNNING",
                                   "shard_failure_sensor": "RUNNING"}
    # the states belong to the location `dagster dev -w workspace.yaml` runs
    with dg.DagsterInstance.from_config(home_env["DAGSTER_HOME"]) as inst:
        states = {s.name: (s.origin.repository_origin.code_location_origin.location_name,
                           s.status.value) for s in inst.all_instigator_state()}
    assert states == {"raw_shard_sensor": ("datamask", "RUNNING"),
                      "datamask_automation": ("datamask", "STOPPED")}


def test_readme_backfill_commands_queue_one_run_per_shard(home_env):
    """docs/operate.md's "Re-run many shards": the job backfill of the shards named queues one
    run per shard; ``plan --launch`` records ONE asset backfill of exactly the shards the dry
    run lists (here both: never ingested), of the default scope's step (``features``), for the
    daemon to run."""
    lines = readme_commands("dagster job backfill")
    assert len(lines) == 1 and "-w workspace.yaml" in lines[0], lines
    launch = readme_commands("datamask_pipeline.plan --launch")
    assert len(launch) == 1, launch
    out = _ok(launch[0].split(" #")[0], home_env)
    assert "launched backfill" in out, out
    # with every listed shard in progress (the backfill holds them), nothing more is launched
    again = _ok(launch[0].split(" #")[0], home_env)
    assert "launched nothing" in again and "in progress" in again, again
    _ok(lines[0], home_env)
    with dg.DagsterInstance.from_config(home_env["DAGSTER_HOME"]) as inst:
        backfills = {b.tags.get("datamask/launched_by", "cli"): b for b in inst.get_backfills()}
        runs = inst.get_runs()
    assert sorted(backfills) == ["cli", "plan"], backfills
    assert sorted(backfills["cli"].partition_names) == ["shard_000", "shard_001"]
    target = backfills["plan"].asset_backfill_data.target_subset
    assert {(k.to_user_string(), p) for k, p in target.iterate_asset_partitions()} == {
        ("features", "shard_000"), ("features", "shard_001")}
    # the job backfill's runs are queued for the daemon (not run in the shell); the asset
    # backfill's runs are the daemon's to create
    assert sorted(r.job_name for r in runs) == ["datamask_job"] * 2
    for run in runs:
        assert run.status == dg.DagsterRunStatus.QUEUED
        assert run.tags["dagster/code_location"] == "datamask"


@pytest.mark.parametrize("word", ["dagster asset materialize", "dg launch --assets"])
def test_a_new_shell_without_dagster_home_is_told_the_fix(word, tmp_path):
    line = next(ln for ln in readme_commands(word) if "--partition shard_000" in ln)
    env = _env(DATAMASK_DATA_ROOT=str(tmp_path / "data"))
    out = _sh(line.split(" #")[0], env)
    assert out.returncode != 0
    text = " ".join((out.stdout + out.stderr).split())
    assert "DAGSTER_HOME is not set" in text
    assert f"export DAGSTER_HOME={REPO / '.dagster_home'}" in text
