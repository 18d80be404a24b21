"""``--help`` of every console script declared in pyproject.toml, and of the ``python -m``
command lines the README names, run as subprocesses: each exits 0 and prints its usage."""

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from datamask_pipeline.engine.config import LearnerConfig, knob_flags

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# the README's `python -m` command lines that take arguments
MODULES = ["datamask_pipeline.engine.cli", "datamask_pipeline.register",
           "datamask_pipeline.recover", "datamask_pipeline.plan",
           "datamask_pipeline.reporting.tradeoff", "datamask_pipeline.demo",
           "datamask_pipeline.jobs"]
# the command lines whose help names the command as it was invoked (issue 26, point 5)
NAMED = ["datamask_pipeline.engine.cli", "datamask_pipeline.register", "datamask_pipeline.demo",
         "datamask_pipeline.jobs"]


def _run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "COLUMNS": "100"})


def test_pyproject_declares_the_console_scripts():
    assert {"train_mask", "datamask"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_help(name):
    """The entry point as the installed script calls it (``module:function`` with argv
    ``[name, --help]``), and the installed script itself when it is on this venv's bin."""
    module, func = SCRIPTS[name].split(":")
    code = (f"import sys; sys.argv = [{name!r}, '--help']; "
            f"from {module} import {func}; sys.exit({func}())")
    cmds = [[sys.executable, "-c", code]]
    installed = Path(sys.executable).parent / name
    if installed.exists():
        cmds.append([str(installed), "--help"])
    for cmd in cmds:
        r = _run(cmd)
        assert r.returncode == 0, (cmd, r.stderr[-2000:])
        assert r.stdout.startswith(f"usage: {name} "), r.stdout[:200]  # not another CLI's name
        assert "Traceback" not in r.stderr
        assert "==SUPPRESS==" not in r.stdout
        # every method knob has its flag, and the help names the upstream profile's default
        for knob in LearnerConfig.model_fields:
            assert knob_flags(knob)[0] in r.stdout, knob
        assert "prunes 40–50%;" in " ".join(r.stdout.split())
        assert "(default 0.1; upstream profile)" in " ".join(r.stdout.split())


@pytest.mark.parametrize("module", MODULES)
def test_module_help(module):
    r = _run([sys.executable, "-m", module, "--help"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("usage:") and "Traceback" not in r.stderr
    assert "==SUPPRESS==" not in r.stdout
    if module in NAMED:
        assert r.stdout.startswith(f"usage: python -m {module} "), r.stdout[:200]
        assert r.stdout.count("\n\n") >= 2  # a description and the flags, not a usage line
