"""Install the example plug-in package (tests/plugin_term) into a folder of its own with pip,
as a user would install their term; the folder then goes on PYTHONPATH / sys.path."""

import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent


def install_plugin(target: Path) -> Path:
    # build from a copy: setuptools writes build/ and *.egg-info beside the sources
    src = target.parent / "plugin_src"
    shutil.copytree(PACKAGE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    r = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert any(p.name.startswith("datamask_dispersion") and p.suffix == ".dist-info"
               for p in target.iterdir()), sorted(p.name for p in target.iterdir())
    return target
