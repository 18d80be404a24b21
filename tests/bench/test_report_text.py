"""The committed bench reports do not contradict what the repository has measured since:
no report says an outside peer is "not installed" when results_peers.json records its
version, or that the multiprocess executor was not measured anywhere while
results_overhead.json holds its timings, or cites an engine name that no longer exists."""

import json
import re
from pathlib import Path

import pytest

from datamask_pipeline.engine import config

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
REPORTS = sorted(RESULTS.glob("REPORT*.md"))


def _peers() -> dict:
    return json.loads((RESULTS / "results_peers.json").read_text())["peers"]


def test_the_peers_were_measured():
    peers = _peers()
    assert peers.get("apricot") and peers.get("submodlib")
    assert json.loads((RESULTS / "results_overhead.json").read_text())["multiprocess"]


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: p.name)
def test_report_does_not_contradict_later_measurements(report):
    text = report.read_text()
    for line in text.splitlines():
        low = line.lower()
        if "not installed" in low:
            for peer in _peers():
                assert peer not in low, f"{report.name}: {line.strip()[:160]}"
        if "not measured here" in low:
            assert "multiprocess executor" not in low, f"{report.name}: {line.strip()[:160]}"
    # an engine.config name a report cites exists, unless that line says it no longer does
    for line in text.splitlines():
        for name in re.findall(r"engine\.config\.([A-Z_]{3,})", line):
            assert hasattr(config, name) or "no longer exists" in line, (
                f"{report.name} cites engine.config.{name}")
