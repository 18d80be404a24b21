"""Fixtures of the reliability tests (issue 5).

The pipeline fixtures of ``tests/pipeline/conftest.py`` (a temporary data root, a tmpfs
Dagster instance, the resources, ``run_chain``) are reused as they are. Tests marked ``slow``
are skipped unless the marker expression selects them::

    scripts/test.sh tests/reliability -m slow        # the slow variants only
    scripts/test.sh tests/reliability -m "slow or not slow"   # everything
"""

import os
import tempfile

import pytest

from tests.pipeline.conftest import (  # noqa: F401 - fixtures reused by name
    corpus,
    data_root,
    instance,
    registered,
    resources,
    run_chain,
)

from .helpers import FAST_TMP, init_home

_HERE = os.path.dirname(os.path.abspath(__file__))


def pytest_collection_modifyitems(config, items):
    if "slow" in (config.getoption("-m") or ""):
        return
    skip = pytest.mark.skip(reason="slow variant: run with `scripts/test.sh tests/reliability -m slow`")
    for item in items:
        if "slow" in item.keywords and str(item.fspath).startswith(_HERE):
            item.add_marker(skip)


@pytest.fixture
def fast_dir():
    """A scratch directory on tmpfs (falls back to the default temp dir)."""
    with tempfile.TemporaryDirectory(dir=FAST_TMP, prefix="datamask-rel-") as d:
        yield d


@pytest.fixture
def dagster_home(fast_dir):
    """A fresh DAGSTER_HOME on tmpfs holding the repository's dagster.yaml."""
    return init_home(os.path.join(fast_dir, "dagster_home"))
