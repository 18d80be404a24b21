"""Declarative automation: every trigger of the per-shard steps and of the catalog, in one place.

Dagster's own automation decides what runs (``AutomationCondition``s, evaluated by the
``datamask_automation`` sensor of the daemon); nothing here lists files or compares
timestamps. What it automates is a setting, ``DATAMASK_AUTOMATION``:

- ``corpus`` (default): a new or rewritten shard gets its ``features`` and their checks, and
  nothing else. The selection is the corpus stage's (``corpus_job``, launched by you or by the
  corpus schedule, ``schedules.py``, daily by default): a new file does not re-select the
  corpus at once, whose budget and rows it shares.
- ``per_shard``: the paper's per-shard chain (``features`` + checks → ``mask`` →
  ``shard_report`` → ``selected_subset``) and the hourly catalog (``corpus_summary``).

One automated key per shard instead of four is also what keeps the daemon's evaluation short
at 10,000 shards (``bench/results/REPORT_orchestration.md``).

Who triggers what (each trigger has one owner, and ``~in_progress`` keeps a shard that is
already running, from any source, from being launched twice):

=====================================  ===========================================================
new shard (registered by               ``eager``: the shard's partition of ``features`` is newly
``raw_shard_sensor`` or ``register``)  missing, so its automated steps are requested. A new shard
                                       needs no ``raw_shard`` observation (``features`` ignores
                                       the source when it asks whether a dependency is missing),
                                       so registering 10,000 shards records no 10,000 events
raw file rewritten (new ``raw_shard``  ``eager``: a dependency updated, so the automated steps
observation: size + mtime changed)     of that shard only are requested
cron refresh (``DATAMASK_REFRESH_CRON``,  at each tick: every shard whose output is missing, or
off by default)                        whose asset's code version changed since its last run
corpus schedule (``DATAMASK_CORPUS_CRON``, ``corpus_schedule`` (``schedules.py``), not automation:
daily by default)                      at each tick, ``corpus_job`` when shards changed since the
                                       last corpus selection and none is in progress
UI / CLI launch                        you; automation will not launch a shard while it runs
corpus catalog (``per_shard`` only)    at each ``DATAMASK_CATALOG_CRON`` tick (hourly by
                                       default) when any shard's selection changed
=====================================  ===========================================================

Requests of one evaluation that cover more than one partition become ONE Dagster backfill
(``emit_backfills=True``), paced by the daemon, the run queue (``max_concurrent_runs``) and
the ``gpu`` pool: never thousands of runs at once. Every per-shard asset states its
``BackfillPolicy`` (``multi_run(1)``: one run per shard, so a failed shard fails alone and
retries alone).

A shard whose blocking DuckDB checks failed is not re-launched by the cron refresh
(``all_deps_blocking_checks_passed``): only a new raw version (or you) restarts it. The method
config is not part of the automation: runs it launches use ``MaskConfig``'s defaults; a code
change of an asset (its ``code_version``) is picked up by the cron refresh only, because a
code change makes every shard stale at once and must not launch 25,000 GPU runs silently
(see ``python -m datamask_pipeline.plan`` for what a refresh would launch and its GPU-hours).

Freshness: no asset carries a freshness policy by default. Dagster 1.13 judges a partitioned
asset's freshness by its latest materialization of any partition, and this pipeline runs only
when shards arrive or change, so a wall-clock window turned ``selected_subset`` and
``corpus_summary`` FAIL after quiet days with nothing wrong. What is out of date is what the
dry run (``python -m datamask_pipeline.plan``) and the UI's stale partitions show. A corpus fed
continuously can opt in: ``DATAMASK_FRESHNESS_HOURS=N`` fails those two assets when no shard
was selected (and no catalog built) for N hours.
"""

from __future__ import annotations

import os
from datetime import timedelta

import dagster as dg

from . import settings

AC = dg.AutomationCondition

AUTOMATION_SENSOR = "datamask_automation"
SCOPES = ("corpus", "per_shard")
DEFAULT_SCOPE = "corpus"
# the per-shard steps each scope automates (the others carry no condition)
AUTOMATED = {"corpus": ("features",),
             "per_shard": ("features", "mask", "shard_report", "selected_subset")}
RAW_SHARD = dg.AssetKey("raw_shard")
BACKFILL_POLICY = dg.BackfillPolicy.multi_run(max_partitions_per_run=1)
DEFAULT_CATALOG_CRON = "0 * * * *"


def env_scope() -> str:
    """What automation launches (env ``DATAMASK_AUTOMATION``): ``corpus`` (default) or
    ``per_shard``; anything else is refused, naming the variable."""
    value = (os.environ.get(settings.ENV_AUTOMATION) or "").strip() or DEFAULT_SCOPE
    if value not in SCOPES:
        raise ValueError(f"{settings.ENV_AUTOMATION}={value!r}: must be one of "
                         f"{', '.join(SCOPES)} (default {DEFAULT_SCOPE})")
    return value


def refresh_cron() -> str | None:
    """The cron of the scheduled refresh (env ``DATAMASK_REFRESH_CRON``); None = off."""
    return (os.environ.get(settings.ENV_REFRESH_CRON) or "").strip() or None


def catalog_cron() -> str:
    return (os.environ.get(settings.ENV_CATALOG_CRON) or "").strip() or DEFAULT_CATALOG_CRON


DEFAULT_CORPUS_CRON = "0 0 * * *"  # daily, 00:00 UTC
OFF = ("off", "none", "false", "0")


def corpus_cron() -> str | None:
    """The cron of the corpus schedule (env ``DATAMASK_CORPUS_CRON``, default daily
    ``0 0 * * *``); ``off`` (or ``none``): no corpus schedule. A value that is not a cron
    string is refused, naming the variable."""
    value = (os.environ.get(settings.ENV_CORPUS_CRON) or "").strip() or DEFAULT_CORPUS_CRON
    if value.lower() in OFF:
        return None
    from dagster._utils.schedules import is_valid_cron_string

    if not is_valid_cron_string(value):
        raise ValueError(f"{settings.ENV_CORPUS_CRON}={value!r}: not a cron string (five "
                         f"fields, e.g. the default {DEFAULT_CORPUS_CRON!r}; 'off': no schedule)")
    return value


def deps_missing() -> dg.AutomationCondition:
    """``any_deps_missing``, where a raw shard that was registered but never observed does not
    count as missing: a new shard needs no observation (the sensor records one only when a
    file is rewritten)."""
    return AC.any_deps_missing().ignore(dg.AssetSelection.assets(RAW_SHARD))


def scheduled_refresh(cron: str) -> dg.AutomationCondition:
    """At each tick of ``cron``: the partition is missing, or its asset's code version changed
    since the partition was last requested or updated; its dependencies are present and idle."""
    return (
        AC.cron_tick_passed(cron).since_last_handled()
        & (AC.missing() | AC.code_version_changed().since_last_handled())
        & ~deps_missing()
        & ~AC.any_deps_in_progress()
        & ~AC.in_progress()
    ).with_label(f"scheduled refresh ({cron})")


def shard_condition(refresh: str | None = None) -> dg.AutomationCondition:
    """The condition of every per-shard asset: ``eager`` (new shard, new raw version, an
    upstream step re-materialized), or the scheduled refresh when a cron is given; never while
    a dependency's blocking check failed."""
    cond = AC.eager().replace("any_deps_missing", deps_missing())
    if refresh:
        cond = cond | scheduled_refresh(refresh)
    return (cond & AC.all_deps_blocking_checks_passed()).with_label(
        "shard chain" + (f" + refresh {refresh}" if refresh else ""))


# A blocking check runs in the same request as the asset it checks, so that the steps after it
# can be requested in that request too (all_deps_blocking_checks_passed counts checks that
# will be requested on this tick).
CHECK_CONDITION = AC.any_deps_match(AC.will_be_requested()).with_label("with its asset")


def catalog_condition(cron: str) -> dg.AutomationCondition:
    """At most once per tick of ``cron``, and only when a selected subset changed since the last
    catalog build."""
    return (
        AC.cron_tick_passed(cron).since_last_handled()
        & AC.any_deps_updated().since_last_handled()
        & ~AC.in_progress()
    ).with_label(f"catalog ({cron}, when shards changed)")


def automation_sensor(target: dg.AssetSelection) -> dg.AutomationConditionSensorDefinition:
    return dg.AutomationConditionSensorDefinition(
        AUTOMATION_SENSOR,
        target=target,
        emit_backfills=True,
        # an evaluation's cost grows with the shards and the automated keys
        # (bench/results/REPORT_orchestration.md): raise the interval (env
        # DATAMASK_AUTOMATION_INTERVAL_S) when it nears the interval
        minimum_interval_seconds=settings.env_int(settings.ENV_AUTOMATION_INTERVAL) or 30,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Evaluates the automation conditions of the per-shard chain and the catalog "
        "(datamask_pipeline/automation.py); requests that cover several shards become one "
        "backfill.",
    )


def freshness_policy() -> dg.FreshnessPolicy | None:
    """The opt-in freshness policy (env ``DATAMASK_FRESHNESS_HOURS``): fail when the asset was
    not materialized (any partition) for that many hours; None (default) = no policy."""
    hours = settings.env_int(settings.ENV_FRESHNESS_HOURS)
    if hours is None or hours <= 0:
        return None
    return dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=hours))


def automate(assets: list, scope: str | None = None) -> list:
    """``automate_with`` the crons of the environment (``DATAMASK_REFRESH_CRON``,
    ``DATAMASK_CATALOG_CRON``), its freshness setting (``DATAMASK_FRESHNESS_HOURS``) and
    ``scope`` (default: ``DATAMASK_AUTOMATION``).
    Called once when the definitions load: in a ``dagster``/``dg`` command without
    ``DAGSTER_HOME`` it also warns and names the fix (``settings.warn_without_dagster_home``)."""
    settings.warn_without_dagster_home()
    return automate_with(assets, refresh=refresh_cron(), catalog=catalog_cron(),
                         freshness=freshness_policy(), scope=scope or env_scope())


def _with_freshness(a: dg.AssetsDefinition, policy: dg.FreshnessPolicy | None):
    """``a`` with ``policy`` instead of the freshness policy it declares (if it declares one)."""
    if a.specs_by_key[a.key].freshness_policy is None:
        return a
    return dg.map_asset_specs(lambda s: s.replace_attributes(freshness_policy=policy), [a])[0]


def automate_with(assets: list, refresh: str | None = None,
                  catalog: str = DEFAULT_CATALOG_CRON,
                  freshness: dg.FreshnessPolicy | None = None,
                  scope: str = DEFAULT_SCOPE) -> list:
    """``assets`` with their automation conditions and backfill policies: the shard condition
    on the partitioned assets that ``scope`` automates (``AUTOMATED``) and ``BACKFILL_POLICY``
    on every partitioned asset; the catalog condition on the unpartitioned ones when the scope
    is ``per_shard``; source assets (``raw_shard``) unchanged. An asset that declares a
    freshness policy gets ``freshness`` instead (None: no policy; see the module doc)."""
    automated = AUTOMATED[scope]
    out = []
    for a in assets:
        if not isinstance(a, dg.AssetsDefinition) or not a.is_executable or a.is_observable:
            out.append(a)
            continue
        a = _with_freshness(a, freshness)
        if a.partitions_def is not None:
            if a.key.to_user_string() in automated:
                a = a.with_attributes(automation_condition=shard_condition(refresh))
            out.append(a.with_attributes(backfill_policy=BACKFILL_POLICY))
        elif scope == "per_shard":
            out.append(a.with_attributes(automation_condition=catalog_condition(catalog)))
        else:
            out.append(a)
    return out
