"""The ``data_root`` resource: the data root's URI and the raw shards' location, configured
per deployment (env ``DATAMASK_DATA_ROOT`` / ``DATAMASK_RAW_ROOT``). The locations under it
(``features/<key>.parquet``, ``corpus/``, ...) are the storage layer's
:class:`~datamask_pipeline.engine.storage.DataLayout`, which this resource is.
"""

from __future__ import annotations

from typing import Optional

import dagster as dg
from pydantic import Field

from datamask_pipeline import settings
from datamask_pipeline.engine import storage


class DataRoot(dg.ConfigurableResource, storage.DataLayout):
    """Owns the data root URI and the raw location; its locations are ``DataLayout``'s."""

    root: str = Field(
        default_factory=settings.default_data_root,
        description="Data root: a local path or URI (s3://, gs://, file://). Default: <repo>/data; "
        "from_env() reads env DATAMASK_DATA_ROOT when a run starts.",
    )
    raw: Optional[str] = Field(
        default=None,
        description="Where raw shards (*.parquet, one partition each) are read. Default: "
        "<root>/raw; from_env() reads env DATAMASK_RAW_ROOT when a run starts.",
    )

    @classmethod
    def from_env(cls) -> "DataRoot":
        """``DATAMASK_DATA_ROOT`` / ``DATAMASK_RAW_ROOT`` as ``dg.EnvVar`` fields when they are
        set now (read again when each run starts), the defaults otherwise."""
        kw = {field: dg.EnvVar(name) for field, name in
              (("root", settings.ENV_DATA_ROOT), ("raw", settings.ENV_RAW_ROOT))
              if settings.is_set(name)}
        kw.setdefault("root", settings.default_data_root())  # spelled out: the UI shows it
        return cls(**kw)
