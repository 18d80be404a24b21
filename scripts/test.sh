#!/usr/bin/env bash
# One command, fresh machine: install (with the test extra and Debian's chromium), run the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh test
exec .venv/bin/python -m pytest -q "$@"
