"""Where things live by default, and the environment variables that move them.

Every default is a local path under the repository, so a newcomer needs no configuration:

==========================  ==============================================================
``DATAMASK_DATA_ROOT``      data root (path or URI); default ``<repo>/data``
``DATAMASK_RAW_ROOT``       raw shards (``*.parquet``, one partition each); default
                            ``<data root>/raw``
``DAGSTER_HOME``            Dagster instance directory; default ``<repo>/.dagster_home``
                            (our commands create it and copy ``dagster.yaml`` into it)
``DATAMASK_DEVICE``         ``auto`` (default), ``cpu`` or ``cuda:N``
``DATAMASK_PRECISION``      ``fp32`` (default), ``tf32`` or ``bf16``
``DATAMASK_CPU_THREADS``    torch CPU threads of the mask step (default: torch's choice)
``DATAMASK_EMBEDDING_DIM``  required embedding dimension (unset: any, but one per shard)
``DATAMASK_QUALITY_MIN``    declared quality range, either end optional
``DATAMASK_QUALITY_MAX``
``DATAMASK_ID_COLUMN``      raw column names (defaults: chunk_id, quality_score,
``DATAMASK_QUALITY_COLUMNS``  feature_arr; quality columns comma-separated, summed, with
``DATAMASK_QUALITY_WEIGHTS``  optional comma-separated weights)
``DATAMASK_EMBEDDING_COLUMN``
``DATAMASK_QUALITY_SCORER``  the scorer of shards without a quality column (default
                            ``heuristic``; ``''``: quality required; see ``engine.quality``)
``DATAMASK_AUTOMATION``    what automation launches for a new or rewritten shard: ``corpus``
                            (default: its features and checks) or ``per_shard`` (the paper's
                            per-shard chain and the catalog); see ``automation``
``DATAMASK_REFRESH_CRON``  cron of the scheduled refresh of missing / code-changed shards
                            (one backfill per tick); unset (default): off
``DATAMASK_CATALOG_CRON``  cron of the catalog rebuild when shards changed (default hourly)
``DATAMASK_CORPUS_CRON``   cron of the corpus schedule (``corpus_schedule``: ``corpus_job`` when
                            shards changed since the last selection and none is in progress;
                            on by default, daily at 00:00 UTC: ``0 0 * * *``); ``off``: no
                            schedule
``DATAMASK_SENSOR_INTERVAL_S``  seconds between raw-shard sensor evaluations (default 30)
``DATAMASK_AUTOMATION_INTERVAL_S``  seconds between automation evaluations (default 30; what
                            one evaluation costs at 10,000 shards: README, "Scale")
``DATAMASK_FAILURE_WEBHOOK``  optional http(s) URL: every failed run is POSTed there as JSON
                            (shard, run id, job, reason) by ``shard_failure_sensor``
``DATAMASK_FRESHNESS_HOURS``  opt-in freshness policy of ``selected_subset`` and
                            ``corpus_summary``: fail after N hours without a materialization
                            (unset, default: none; see ``automation``)
``DATAMASK_RAY_ADDRESS``    the Ray cluster of ``corpus_dedup`` with ``engine: ray``
                            (``ray://<head>:10001``, ``auto``); unset (default): a local Ray
                            started in the run's process (``resources/ray.py``)
``DATAMASK_PRESET``         no longer read. The method knobs' presets are jobs with their run
                            config filled in: ``datamask_job`` (``pipeline``),
                            ``datamask_upstream_job``, ``datamask_cpu_demo_job``. When it is set,
                            loading the definitions warns once and names the job to launch.
==========================  ==============================================================

How the resources use them (``resources/*.py``, ``from_env``): a setting that is set when the
code location loads becomes a ``dg.EnvVar`` field, which Dagster reads when a run starts (a
changed value reaches the next run without a reload) and the UI shows as the variable's name,
never its value. A setting that is not set gets its documented default as a plain value, so the
definitions load with an empty environment and no run waits on a variable nobody set (a variable
first set after loading is read at the next reload). We do not ``os.environ.setdefault`` the
defaults instead: ``DATAMASK_RAW_ROOT`` and the contract's rules have no value to default to
(unset means ``<data root>/raw`` or "no rule"), and a ``dg.EnvVar`` of an unset variable fails
the run.
``dg.EnvVar`` fills text fields and ``dg.EnvVar.int`` integer fields; Dagster 1.13 has no float
source and one variable cannot fill a list, so the quality columns, weights and range travel as
strings (``DataContract.string_settings``) that the resource parses when the run starts.

Dagster-free and cheap to import.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from pathlib import Path

ENV_DATA_ROOT = "DATAMASK_DATA_ROOT"
ENV_RAW_ROOT = "DATAMASK_RAW_ROOT"
ENV_PRESET = "DATAMASK_PRESET"
ENV_DEVICE = "DATAMASK_DEVICE"
ENV_PRECISION = "DATAMASK_PRECISION"
ENV_CPU_THREADS = "DATAMASK_CPU_THREADS"
ENV_EMBEDDING_DIM = "DATAMASK_EMBEDDING_DIM"
ENV_QUALITY_MIN = "DATAMASK_QUALITY_MIN"
ENV_QUALITY_MAX = "DATAMASK_QUALITY_MAX"
ENV_ID_COLUMN = "DATAMASK_ID_COLUMN"
ENV_QUALITY_COLUMNS = "DATAMASK_QUALITY_COLUMNS"
ENV_QUALITY_WEIGHTS = "DATAMASK_QUALITY_WEIGHTS"
ENV_EMBEDDING_COLUMN = "DATAMASK_EMBEDDING_COLUMN"
ENV_QUALITY_SCORER = "DATAMASK_QUALITY_SCORER"
ENV_AUTOMATION = "DATAMASK_AUTOMATION"
ENV_REFRESH_CRON = "DATAMASK_REFRESH_CRON"
ENV_CATALOG_CRON = "DATAMASK_CATALOG_CRON"
ENV_CORPUS_CRON = "DATAMASK_CORPUS_CRON"
ENV_AUTOMATION_INTERVAL = "DATAMASK_AUTOMATION_INTERVAL_S"
ENV_SENSOR_INTERVAL = "DATAMASK_SENSOR_INTERVAL_S"
ENV_FAILURE_WEBHOOK = "DATAMASK_FAILURE_WEBHOOK"
ENV_FRESHNESS_HOURS = "DATAMASK_FRESHNESS_HOURS"
ENV_RAY_ADDRESS = "DATAMASK_RAY_ADDRESS"

PRESETS = ("pipeline", "upstream", "cpu-demo")


def repo_root() -> Path:
    """The checkout this package lives in (the directory holding ``pyproject.toml``); the
    current directory when the package is installed elsewhere."""
    here = Path(__file__).resolve().parent.parent
    if (here / "pyproject.toml").is_file():
        return here
    return Path.cwd()


def default_data_root() -> str:
    """``<repo>/data``: the data root when ``DATAMASK_DATA_ROOT`` is not set."""
    return str(repo_root() / "data")


def data_root() -> str:
    return os.environ.get(ENV_DATA_ROOT) or default_data_root()


def raw_root(root: str | None = None) -> str:
    env = os.environ.get(ENV_RAW_ROOT)
    if env:
        return env
    from .engine import storage

    return storage.join(root or data_root(), "raw")


def dagster_home() -> str:
    return os.environ.get("DAGSTER_HOME") or str(repo_root() / ".dagster_home")


def ensure_dagster_home() -> str:
    """Set ``DAGSTER_HOME`` (default ``<repo>/.dagster_home``), create the directory and copy
    the repository's ``dagster.yaml`` template into it when it has none. Returns the path."""
    home = os.path.abspath(dagster_home())
    os.environ["DAGSTER_HOME"] = home
    os.makedirs(home, exist_ok=True)
    target = os.path.join(home, "dagster.yaml")
    template = repo_root() / "dagster.yaml"
    if not os.path.exists(target) and template.is_file() and template.resolve() != Path(target).resolve():
        shutil.copyfile(template, target)
    return home


def in_dagster_cli() -> bool:
    """Whether this process is one of Dagster's command lines (``dagster``, ``dg``, or a
    ``python -m dagster ...`` child such as the code server ``dagster dev`` starts)."""
    argv0 = sys.argv[0] if sys.argv else ""
    name = os.path.basename(argv0)
    return name in ("dagster", "dg") or argv0.replace(os.sep, "/").endswith(
        ("dagster/__main__.py", "dagster_dg_cli/__main__.py"))


def missing_dagster_home_message() -> str | None:
    """When ``DAGSTER_HOME`` is not set: what that means for a ``dagster``/``dg`` command and
    the line that fixes it; None when it is set."""
    if is_set("DAGSTER_HOME"):
        return None
    home = str(repo_root() / ".dagster_home")
    made = "" if os.path.isdir(home) else (
        " (it is created by `.venv/bin/python -m datamask_pipeline.register`)")
    return ("DAGSTER_HOME is not set: this Dagster command uses a throwaway instance, which has "
            f"none of the shards registered in {home} and forgets its runs when the command "
            f"ends. Run `export DAGSTER_HOME={home}` in this shell first{made}, then this "
            "command again.")


def warn_without_dagster_home() -> None:
    """Warn, naming the fix, when a Dagster command line loads the definitions without
    ``DAGSTER_HOME`` (it would then fail with "partition key ... not found" and no hint)."""
    msg = missing_dagster_home_message()
    if msg and in_dagster_cli():
        warnings.warn(msg, UserWarning, stacklevel=3)


def is_set(name: str) -> bool:
    """Whether environment variable ``name`` holds a non-blank value (blank counts as unset)."""
    return bool(os.environ.get(name, "").strip())


def env_int(name: str) -> int | None:
    v = os.environ.get(name, "").strip()
    if not v:
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r}: expected an integer") from None


def preset_env() -> str | None:
    """The value of the retired ``DATAMASK_PRESET`` (lower case), or None when it is unset;
    ``jobs.warn_preset_env`` turns it into a warning naming the job to launch instead."""
    v = os.environ.get(ENV_PRESET, "").strip().lower()
    return v or None


def _deprecated_presets() -> dict:
    from .engine.config import DEPRECATED_PROFILES

    return DEPRECATED_PROFILES


def learner_defaults(preset_name: str = "pipeline") -> dict:
    """Every method knob's value in a preset: an engine profile (``pipeline``, ``upstream``;
    deprecated names warn), or ``cpu-demo`` = ``pipeline`` with ``CPU_DEMO_PRESET``. The
    values live in ``engine.config``; nothing here reads the environment."""
    from .engine.config import CPU_DEMO_PRESET, profile_defaults

    name = str(preset_name).strip().lower()
    if name == "cpu-demo":
        return {**profile_defaults("pipeline"), **CPU_DEMO_PRESET}
    if name not in PRESETS and name not in _deprecated_presets():
        raise ValueError(f"unknown preset {preset_name!r}: choose one of {PRESETS}")
    return profile_defaults(name)
