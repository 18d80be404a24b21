#!/usr/bin/env bash
# One command, fresh machine: install, generate the sample corpus, materialize every shard
# through Dagster, print where the selected parquet is and a summary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m datamask_pipeline.demo "$@"
