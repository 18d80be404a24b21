"""The Ray cluster that ``corpus_dedup`` runs on with ``engine: ray``: a dagster-ray resource.

``RayCluster`` is dagster-ray's ``RayResource`` (the interface its ``LocalRay`` and KubeRay
resources share) for a cluster that already exists: ``address`` names it (``ray://head:10001``
for the Ray Client, or ``auto`` / ``host:6379`` from a node of the cluster; env
``DATAMASK_RAY_ADDRESS``); unset, a local Ray is started inside the run's process.

It is lazy: loading the definitions, or a step that does not use Ray, starts nothing.
:meth:`RayCluster.session` connects (``ray.init``) when a ray-engine dedup runs and disconnects
afterwards, which stops a local Ray it started; a Ray this process had already joined is used as
it is and left running. The resource's setup never connects, whatever its ``lifecycle`` says
(``yield_for_execution`` is overridden): dagster-ray's default lifecycle connects at every step
start, and a ``default_factory`` lifecycle of ours did not reach the resource's config schema
(Dagster took dagster-ray's default from it), so every corpus run started a local Ray (~8 s)
even with engine ``local`` (issue 26, point 7).

Without the ``ray`` extra (``pip install 'datamask-pipeline[ray]'``) the resource still
loads, with the same fields, and a ray-engine run fails naming the extra.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import dagster as dg
from pydantic import Field

from datamask_pipeline import settings

try:
    from dagster_ray import Lifecycle, RayResource
    from dagster_ray.configs import RayDataExecutionOptions
except ImportError:  # the ray extra is not installed
    RayResource = None

MISSING = ("corpus_dedup engine 'ray' needs Ray Data and dagster-ray: "
           "pip install 'datamask-pipeline[ray]'")
ADDRESS_HELP = ("Ray cluster address: ray://<head>:10001 (Ray Client), auto or <head>:6379 "
                "(from a cluster node). Unset: a local Ray started in the run's process. "
                f"Env {settings.ENV_RAY_ADDRESS}.")


def _address(ray_address: Optional[str]) -> Optional[str]:
    return (ray_address or "").strip() or None


if RayResource is not None:

    class RayCluster(RayResource):
        """An existing Ray cluster by address, or a local one started for the step."""

        address: Optional[str] = Field(default=None, description=ADDRESS_HELP)
        # plain defaults, not default_factory: Dagster builds the resource's config schema from
        # them (a default_factory value is not carried into it)
        lifecycle: Lifecycle = Field(
            default=Lifecycle(create=True, wait=True, connect=False, cleanup="never"),
            description="Connect only when a ray-engine step asks (session()), not at every "
                        "step start; never delete the cluster (it is not ours).")
        data_execution_options: RayDataExecutionOptions = Field(
            default=RayDataExecutionOptions(verbose_progress=False, use_polars=False))

        @contextlib.contextmanager
        def yield_for_execution(self, context: dg.InitResourceContext):
            """No connection at step start, whatever ``lifecycle`` says: a step connects through
            :meth:`session` only; one left connected is disconnected at the end."""
            try:
                yield self
            finally:
                self._disconnect()

        def _disconnect(self) -> None:
            """Disconnect from the cluster this resource connected to, if it did."""
            if self._context is not None:
                self._context.disconnect()
                self._context = None

        @property
        def host(self) -> str:
            addr = _address(self.address)
            if not addr or addr == "auto":
                return "127.0.0.1"
            return addr.split("://")[-1].rsplit(":", 1)[0]

        @property
        def name(self) -> str:
            addr = _address(self.address)
            return f"Ray cluster {addr}" if addr else "local Ray"

        @property
        def ray_address(self) -> Optional[str]:  # type: ignore[override]
            return _address(self.address)

        @property
        def created(self) -> bool:
            return True

        @property
        def ready(self) -> bool:
            return True

        @contextlib.contextmanager
        def session(self, context):
            """Connected to the cluster for the block (ray.init), disconnected after."""
            import ray

            if ray.is_initialized():
                yield self
                return
            self.connect(context)
            try:
                yield self
            finally:
                self._disconnect()

else:

    class RayCluster(dg.ConfigurableResource):
        """Stand-in without the ``ray`` extra: same fields, fails when a session is asked."""

        address: Optional[str] = Field(default=None, description=ADDRESS_HELP)
        ray_init_options: dict[str, Any] = Field(default_factory=dict)

        @contextlib.contextmanager
        def session(self, context):
            from datamask_pipeline.engine.config import ConfigError

            raise ConfigError(MISSING)
            yield self  # pragma: no cover


def ray_from_env() -> RayCluster:
    """``DATAMASK_RAY_ADDRESS`` as a ``dg.EnvVar`` field when it is set now, else unset
    (a local Ray)."""
    if settings.is_set(settings.ENV_RAY_ADDRESS):
        return RayCluster(address=dg.EnvVar(settings.ENV_RAY_ADDRESS))
    return RayCluster()
