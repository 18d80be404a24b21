"""Configuration the Dagster way: resources take ``dg.EnvVar`` fields that Dagster reads when a
run starts, and the presets of the method knobs are jobs with their run config filled in."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import dagster as dg
import pytest

from assets.learn import MaskConfig
from datamask_pipeline import settings
from datamask_pipeline.definitions import defs, resources_from_env
from datamask_pipeline.engine.config import LEARNING_SOLVERS, CPU_DEMO_PRESET, profile_defaults
from datamask_pipeline.engine.sample import generate_corpus
from datamask_pipeline.engine.select import route_for
from datamask_pipeline.jobs import PRESET_JOBS, warn_preset_env
from resources.contract import DataContract

from .helpers import DIM, ROWS

REPO = settings.repo_root()
PRESET_JOB_NAMES = {"pipeline": "datamask_job", "upstream": "datamask_upstream_job",
                    "cpu-demo": "datamask_cpu_demo_job"}


def _clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATAMASK_", "DAGSTER_"))}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", **extra)
    return env


def _python(code: str, env: dict, timeout: int = 240) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(REPO), env=env,
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"exit {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
    return out


def _last_json(out: subprocess.CompletedProcess) -> dict:
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ presets as jobs
def _mask_config_of(job_name: str, key: str = "shard_000") -> dict:
    """The ``mask`` op's config a launch of ``job_name`` gets without a run config of its own
    (what the Launchpad fills in): MaskConfig's defaults, updated by the job's config."""
    job = defs.resolve_job_def(job_name)
    run_config = job.partitioned_config.get_run_config_for_partition_key(key)
    given = run_config.get("ops", {}).get("mask", {}).get("config", {})
    return MaskConfig(**given).model_dump()


def test_each_preset_job_carries_its_presets_knobs():
    assert {p: j.name for p, j in PRESET_JOBS.items()} == PRESET_JOB_NAMES
    assert _mask_config_of("datamask_job") == profile_defaults("pipeline")
    assert _mask_config_of("datamask_upstream_job") == profile_defaults("upstream")
    assert _mask_config_of("datamask_cpu_demo_job") == {**profile_defaults("pipeline"),
                                                        **CPU_DEMO_PRESET}
    assert _mask_config_of("datamask_upstream_job")["solver"] == "paper"
    chain = sorted(defs.resolve_job_def("datamask_job").asset_layer.executable_asset_keys)
    for name in PRESET_JOB_NAMES.values():
        job = defs.resolve_job_def(name)
        assert sorted(job.asset_layer.executable_asset_keys) == chain, name
        assert job.partitions_def is not None and job.partitions_def.name == "shards"


def test_mask_config_defaults_are_constants_of_the_pipeline_profile(monkeypatch):
    monkeypatch.setenv(settings.ENV_PRESET, "upstream")
    assert MaskConfig().model_dump() == settings.learner_defaults("pipeline")
    # on the tests' 400-row shards the defaults run no learner (the suite's speed relies on it)
    route, _ = route_for(MaskConfig().learner_config(), ROWS, "cpu")
    assert route not in LEARNING_SOLVERS


def test_preset_env_warns_and_names_the_job(monkeypatch):
    monkeypatch.delenv(settings.ENV_PRESET, raising=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_preset_env()  # unset: silent
    for value, job in (("upstream", "datamask_upstream_job"), ("paper", "datamask_upstream_job"),
                       ("CPU-demo", "datamask_cpu_demo_job"), ("pipeline", "datamask_job")):
        monkeypatch.setenv(settings.ENV_PRESET, value)
        with pytest.warns(UserWarning, match=f"DATAMASK_PRESET=.* is ignored.*'{job}'"):
            warn_preset_env()
    monkeypatch.setenv(settings.ENV_PRESET, "bogus")
    with pytest.warns(UserWarning, match="launch one of 'datamask_job' \\(pipeline\\)"):
        warn_preset_env()


def test_loading_with_a_preset_env_warns_once_and_keeps_the_defaults():
    out = _python("""
        import json
        from datamask_pipeline.definitions import defs
        from assets.learn import MaskConfig
        print(json.dumps(MaskConfig().model_dump()))
    """, _clean_env(DATAMASK_PRESET="upstream"))
    assert _last_json(out) == settings.learner_defaults("pipeline")
    assert out.stderr.count("DATAMASK_PRESET=upstream is ignored") == 1, out.stderr
    assert "launch job 'datamask_upstream_job' instead" in out.stderr


# ------------------------------------------------------------------ resources from the environment
def test_definitions_load_with_an_empty_environment():
    """No DATAMASK_* variable: every resource field is its documented default (plain values,
    no EnvVar that could fail a run), nothing warns about presets, torch stays unloaded."""
    out = _python("""
        import json, sys
        from datamask_pipeline.definitions import defs
        res = defs.get_repository_def().get_top_level_resources()
        print(json.dumps({"torch": "torch" in sys.modules,
                          "config": {k: res[k].config_schema.as_field().default_value
                                     for k in ("data_root", "contract", "learner")}}))
    """, _clean_env())
    got = _last_json(out)
    assert got["torch"] is False
    assert "DATAMASK_PRESET" not in out.stderr
    cfg = got["config"]
    assert cfg["data_root"] == {"root": str(REPO / "data"), "raw": None}
    assert cfg["learner"]["device"] == "auto" and cfg["learner"]["precision"] == "fp32"
    assert cfg["learner"]["cpu_threads"] == 0
    assert cfg["contract"]["quality_columns"] == ["quality_score"]
    assert cfg["contract"]["expected_dim"] is None and cfg["contract"]["string_settings"] == {}
    assert "env" not in json.dumps(cfg)


def test_set_variables_become_env_vars_the_ui_shows_by_name(monkeypatch):
    for name in list(os.environ):
        if name.startswith("DATAMASK_"):
            monkeypatch.delenv(name)
    values = {"DATAMASK_DATA_ROOT": "/secret/root", "DATAMASK_DEVICE": "cpu",
              "DATAMASK_CPU_THREADS": "2", "DATAMASK_EMBEDDING_DIM": "16",
              "DATAMASK_QUALITY_COLUMNS": "a,b", "DATAMASK_QUALITY_MAX": "1"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    resources = resources_from_env()
    shown = {k: dg.Definitions(resources=resources).get_repository_def().get_top_level_resources()[k]
             .config_schema.as_field().default_value for k in ("data_root", "contract", "learner")}
    assert shown["data_root"]["root"] == {"env": "DATAMASK_DATA_ROOT"}
    assert shown["learner"]["device"] == {"env": "DATAMASK_DEVICE"}
    assert shown["learner"]["cpu_threads"] == {"env": "DATAMASK_CPU_THREADS"}
    assert shown["learner"]["precision"] == "fp32"  # not set: the default, as a value
    assert shown["contract"]["expected_dim"] == {"env": "DATAMASK_EMBEDDING_DIM"}
    assert shown["contract"]["string_settings"] == {
        "quality_columns": {"env": "DATAMASK_QUALITY_COLUMNS"},
        "quality_max": {"env": "DATAMASK_QUALITY_MAX"}}
    assert "/secret/root" not in json.dumps(shown)  # names only, never the values


def test_contract_string_settings_parse_and_name_the_variable():
    c = DataContract(string_settings={"quality_columns": " dclm, edu ,", "quality_weights": "1,0.5",
                                    "quality_min": "0", "quality_max": " "})
    assert c.quality_columns == ["dclm", "edu"] and c.quality_weights == [1.0, 0.5]
    assert c.quality_min == 0.0 and c.quality_max is None
    assert c.columns().quality == ("dclm", "edu")
    with pytest.raises(ValueError, match=r"quality_min \(env DATAMASK_QUALITY_MIN\) = 'low'.*expected numbers"):
        DataContract(string_settings={"quality_min": "low"})
    with pytest.raises(ValueError, match=r"quality_max .*'1,2'.*expected one number"):
        DataContract(string_settings={"quality_max": "1,2"})
    with pytest.raises(ValueError, match=r"quality_columns .*expected one or more column names"):
        DataContract(string_settings={"quality_columns": " , "})
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['id_column'\]"):
        DataContract(string_settings={"id_column": "x"})


def test_env_vars_are_read_when_the_run_starts_through_the_upstream_job(tmp_path):
    """The definitions load with wrong values (another data root, a missing GPU, a wrong
    dimension, a quality column and range that the shard breaks); the variables are then
    corrected in the same process and the upstream job's run uses the corrected values, with
    the upstream preset's knobs from the job's own config (fewer steps, as a user edits the
    Launchpad's config)."""
    EPOCHS = 40
    wrong, right = tmp_path / "wrong", tmp_path / "right"
    wrong.mkdir()
    (tmp_path / "home").mkdir()
    generate_corpus(str(right / "raw"), n_shards=1, rows_per_shard=ROWS, dim=DIM, seed=3)
    at_load = dict(DATAMASK_DATA_ROOT=str(wrong), DATAMASK_DEVICE="cuda:9",
                   DATAMASK_EMBEDDING_DIM="99", DATAMASK_QUALITY_COLUMNS="no_such_column",
                   DATAMASK_QUALITY_MAX="0.01", DATAMASK_CPU_THREADS="1")
    at_run = dict(DATAMASK_DATA_ROOT=str(right), DATAMASK_DEVICE="cpu",
                  DATAMASK_EMBEDDING_DIM=str(DIM), DATAMASK_QUALITY_COLUMNS="quality_score",
                  DATAMASK_QUALITY_MAX="1")
    out = _python(f"""
        import json, os
        import dagster as dg
        from datamask_pipeline.definitions import defs  # loads with the wrong values
        from assets.partitions import register_shards

        os.environ.update({at_run!r})
        with dg.instance_for_test(temp_dir={str(tmp_path / "home")!r}) as instance:
            register_shards(instance, os.path.join(os.environ["DATAMASK_DATA_ROOT"], "raw"))
            job = defs.resolve_job_def("datamask_upstream_job")
            # the job's own config, as the Launchpad fills it in, with fewer steps (a run
            # config given at launch replaces the job's, so it starts from the job's)
            run_config = job.partitioned_config.get_run_config_for_partition_key("shard_000")
            run_config["ops"]["mask"]["config"]["n_epochs"] = {EPOCHS}
            result = job.execute_in_process(
                partition_key="shard_000", instance=instance, raise_on_error=False,
                run_config=run_config,
                asset_selection=[dg.AssetKey("features"), dg.AssetKey("mask")])
            md = {{}}
            for ev in result.get_asset_materialization_events():
                if ev.asset_key == dg.AssetKey("mask"):
                    md = {{k: v.value for k, v in ev.materialization.metadata.items()
                          if k in ("device", "route", "steps", "config")}}
            errors = [ev.step_failure_data.error.message for ev in result.all_events
                      if ev.is_step_failure and ev.step_failure_data.error]
            print(json.dumps({{"success": result.success, "mask": md, "errors": errors}}))
    """, _clean_env(**at_load))
    got = _last_json(out)
    assert got["success"], got["errors"]
    assert got["mask"]["device"] == "cpu"
    assert got["mask"]["route"] == "paper" and got["mask"]["steps"] == EPOCHS
    assert got["mask"]["config"] == {**settings.learner_defaults("upstream"), "n_epochs": EPOCHS}
    assert (right / "features" / "shard_000.parquet").is_file()
    assert (right / "masks" / "shard_000.parquet").is_file()
    assert not any(wrong.iterdir())  # nothing was written under the load-time data root


def test_dg_launch_runs_a_preset_job_with_the_printed_preset_config(tmp_path):
    """The README's command: ``dg launch --job NAME --partition KEY --config-json "$(python -m
    datamask_pipeline.jobs PRESET)"`` (Dagster 1.13's ``dg launch`` drops a partitioned job's
    own config, dagster-io/dagster#34045). The run is the preset's job, with its knobs."""
    from pathlib import Path

    from assets.partitions import register_shards

    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    generate_corpus(str(data / "raw"), n_shards=1, rows_per_shard=ROWS, dim=DIM, seed=3)
    env = _clean_env(DAGSTER_HOME=str(home), DATAMASK_DATA_ROOT=str(data), DATAMASK_DEVICE="cpu",
                     DATAMASK_CPU_THREADS="1", DATAMASK_EMBEDDING_DIM=str(DIM))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        register_shards(instance, str(data / "raw"))
    printed = subprocess.run([sys.executable, "-m", "datamask_pipeline.jobs", "cpu-demo"],
                             cwd=str(REPO), env=env, capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert json.loads(printed.stdout) == {"ops": {"mask": {"config": settings.learner_defaults("cpu-demo")}}}
    out = subprocess.run([str(Path(sys.executable).parent / "dg"), "launch", "--job",
                          "datamask_cpu_demo_job", "--partition", "shard_000",
                          "--config-json", printed.stdout.strip()],
                         cwd=str(REPO), env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-6000:]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs(dg.RunsFilter(job_name="datamask_cpu_demo_job"))
        assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS]
        rec = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("mask"), asset_partitions=["shard_000"]),
            limit=1).records[0]
    assert rec.run_id == runs[0].run_id
    assert rec.asset_materialization.metadata["config"].value == settings.learner_defaults("cpu-demo")


def test_an_env_var_nobody_set_fails_the_run_so_unset_settings_stay_plain_defaults(monkeypatch):
    """Why ``from_env`` spells unset settings out as values: Dagster resolves a ``dg.EnvVar``
    when the run starts and fails it when the variable is not set."""
    from resources.storage import DataRoot

    monkeypatch.delenv("DATAMASK_TEST_NEVER_SET", raising=False)

    @dg.asset
    def where(data_root: DataRoot) -> str:
        return data_root.root

    with pytest.raises(Exception, match="DATAMASK_TEST_NEVER_SET.*not set"):
        dg.materialize([where], resources={"data_root": DataRoot(root=dg.EnvVar("DATAMASK_TEST_NEVER_SET"))})
    monkeypatch.delenv(settings.ENV_DATA_ROOT, raising=False)
    assert DataRoot.from_env().root == str(REPO / "data")  # a plain value, nothing to resolve
