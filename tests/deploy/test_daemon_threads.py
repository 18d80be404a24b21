"""The sensor daemon ticks sensors in threads (issue 20, item 7): with Dagster's default
(``sensors: use_threads: false``) the sensors run one after another, so a long
raw_shard_sensor tick holds up shard_failure_sensor. Checked in both instance files (through
dagster's own instance schema and settings) and in the Helm values, which render the same."""

from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.instance.config import dagster_instance_config
from dagster._core.test_utils import instance_for_test

REPO = Path(__file__).resolve().parents[2]
INSTANCE_DIRS = {"local": REPO, "k8s": REPO / "deploy"}


def _yaml(path: Path) -> dict:
    with open(path) as fh:
        return yaml.safe_load(fh)


def _daemon_sensors() -> list:
    """The sensors the sensor daemon ticks (automation condition sensors run in the asset
    daemon)."""
    from datamask_pipeline.definitions import defs

    return [s for s in defs.sensors if not isinstance(s, dg.AutomationConditionSensorDefinition)]


@pytest.mark.parametrize("where", sorted(INSTANCE_DIRS))
def test_sensors_tick_in_threads(where, monkeypatch):
    for var in ("DAGSTER_PG_HOST", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB"):
        monkeypatch.setenv(var, "x")
    config, _ = dagster_instance_config(str(INSTANCE_DIRS[where]))  # dagster's schema
    sensors = config["sensors"]
    assert sensors["use_threads"] is True
    names = [s.name for s in _daemon_sensors()]
    assert {"raw_shard_sensor", "shard_failure_sensor"} <= set(names)
    assert sensors["num_workers"] >= len(names)  # every sensor its own thread
    # an instance built with the section: what the sensor daemon reads
    with instance_for_test(overrides={"sensors": sensors}) as inst:
        assert inst.get_settings("sensors")["use_threads"] is True
        assert inst.get_settings("sensors")["num_workers"] == sensors["num_workers"]


@pytest.mark.parametrize("where", sorted(INSTANCE_DIRS))
def test_schedules_tick_in_threads(where, monkeypatch):
    """The corpus schedule (issue 26, point 10) is the definitions' one schedule; its
    evaluation reads the raw location and the instance, so it ticks in a thread (Dagster's
    default is serial), in both instance files and the Helm values."""
    from datamask_pipeline.definitions import defs

    for var in ("DAGSTER_PG_HOST", "DAGSTER_PG_USER", "DAGSTER_PG_PASSWORD", "DAGSTER_PG_DB"):
        monkeypatch.setenv(var, "x")
    assert [s.name for s in defs.schedules] == ["corpus_schedule"]
    config, _ = dagster_instance_config(str(INSTANCE_DIRS[where]))  # dagster's schema
    assert config["schedules"]["use_threads"] is True
    assert config["schedules"]["num_workers"] >= len(list(defs.schedules))
    helm = _yaml(REPO / "deploy" / "helm" / "values.yaml")["dagsterDaemon"]["schedules"]
    assert {"use_threads": helm["useThreads"], "num_workers": helm["numWorkers"]} == \
        _yaml(REPO / "deploy" / "dagster.yaml")["schedules"]
    with instance_for_test(overrides={"schedules": config["schedules"]}) as inst:
        assert inst.get_settings("schedules")["use_threads"] is True


def test_helm_values_render_the_same_sensor_settings():
    helm = _yaml(REPO / "deploy" / "helm" / "values.yaml")["dagsterDaemon"]["sensors"]
    assert set(helm) <= {"useThreads", "numWorkers", "numSubmitWorkers"}  # the chart's keys
    k8s = _yaml(REPO / "deploy" / "dagster.yaml")["sensors"]
    assert {"use_threads": helm["useThreads"], "num_workers": helm["numWorkers"]} == k8s


def test_readme_says_sensors_tick_in_threads():
    from tests.doc_pages import flat

    text = flat("operate.md")
    assert ("Sensors and the corpus schedule tick in threads (`sensors:`/`schedules: use_threads` "
            "in both instance files)") in text
