"""The ``mask`` step's config: ``MaskConfig`` (every knob of the engine's ``LearnerConfig`` with
the ``pipeline`` profile's defaults and the knobs' ranges) and the check that refuses an
impossible one before any work. Its own module, so that the ingestion step can run the check
without importing the mask asset (which imports the ingestion's)."""

import json

import dagster as dg
from pydantic import Field, ValidationError, create_model

from datamask_pipeline import settings
from datamask_pipeline.engine.config import (
    ConfigError,
    LearnerConfig,
    describe_validation_error,
    knob_constraints,
)


class InvalidMaskConfig(dg.Failure, ValueError):
    """An impossible value of a mask knob: a ValueError where Python builds the config
    (``MaskConfig(select_ratio=1.5)`` before a launch), a Dagster ``Failure`` with one readable
    line and no retries where a step does (the message names the knob and its range)."""

    def __init__(self, message: str):
        super().__init__(description=message, allow_retries=False)


class _MaskConfigBase(dg.Config):
    def __init__(self, **data):
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise InvalidMaskConfig(
                f"invalid mask configuration: {describe_validation_error(exc)}") from None

    def learner_config(self) -> LearnerConfig:
        """The engine's config (raises ConfigError naming the knob for an impossible value)."""
        return LearnerConfig(**{f: getattr(self, f) for f in LearnerConfig.model_fields})


def _mask_config_class():
    """``MaskConfig``: every field of the engine's LearnerConfig (type, description), with the
    ``pipeline`` profile's values as defaults (constants: the environment is not read; the
    other presets are jobs with their run config filled in, ``datamask_pipeline/jobs.py``).
    Each field carries the knob's range (pydantic constraints), so an impossible value is
    refused where the config is built: in Python before a launch, in the run's first step
    (:func:`check_run_mask_config`) for config given as JSON or in the Launchpad."""
    defaults = settings.learner_defaults("pipeline")
    fields = {name: (info.annotation, Field(default=defaults[name], description=info.description,
                                            **knob_constraints(name)))
              for name, info in LearnerConfig.model_fields.items()}
    return create_model("MaskConfig", __base__=_MaskConfigBase,
                        __doc__="The method's knobs (names follow upstream's train_mask.py flags).",
                        **fields)


MaskConfig = _mask_config_class()


def scheduled_config_hash() -> str:
    """The config hash of a run launched with the default config (automation, backfills)."""
    return MaskConfig().learner_config().config_hash()


def default_knobs_hash() -> str:
    """SHA-256 (12 hex digits) of MaskConfig's default knobs, without building the engine's
    config (which would import torch when the definitions load)."""
    import hashlib

    blob = json.dumps(MaskConfig().model_dump(), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def check_run_mask_config(run_config: dict | None, key: str, rows: int | None = None) -> None:
    """Refuse a run whose ``mask`` config is impossible, before any work: the knobs' ranges
    and names (MaskConfig, then the engine's LearnerConfig) and, given the shard's ``rows``,
    the sizes (k, pool, batch). Raises a ``Failure`` with one line naming the knob. A run
    without mask config (the defaults) passes."""
    raw = (((run_config or {}).get("ops") or {}).get("mask") or {}).get("config")
    if raw is None:
        return
    cfg = MaskConfig(**raw)  # InvalidMaskConfig (a Failure) for a value out of its range
    try:
        learner = cfg.learner_config()
        if rows is not None:
            learner.validate(rows)
    except ConfigError as exc:
        raise InvalidMaskConfig(f"partition {key!r}: invalid mask configuration: {exc}") from None
