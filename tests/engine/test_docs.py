"""What the README states about the knobs and the solvers comes from the code and the
committed bench results, so it cannot drift."""

import json
from pathlib import Path

from datamask_pipeline.engine import solver_table
from datamask_pipeline.engine.config import LearnerConfig, knobs_markdown, profile_defaults

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def test_readme_knob_table_is_rendered_from_the_config_model():
    assert knobs_markdown() in README
    for name in LearnerConfig.model_fields:
        assert f"| `{name}` |" in README


def test_profiles_upstream_is_paper_and_pipeline_is_auto():
    assert profile_defaults("upstream")["solver"] == "paper"
    assert profile_defaults("pipeline")["solver"] == "auto"


def test_readme_solver_table_is_the_committed_bench_result():
    from bench.solvers import readme_table

    table = solver_table.load()
    results = json.loads((REPO / table["results"]).read_text())
    assert readme_table(results["cells"]) in README
    for line in table["command"].splitlines():
        assert line in README  # the command that produced it is shown
