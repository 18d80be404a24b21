#!/usr/bin/env bash
# One command, fresh machine: install, then run the demo (python -m datamask_pipeline.demo):
# without --data-root it generates the sample corpus into data/raw on the first run (and uses
# it again after), registers the shards, runs the corpus selection through Dagster and prints
# where every output is. Arguments go to the demo: --data-root DIR runs on your own parquet
# files (a folder without any is refused); --shards/--rows/--dim/--seed shape the sample and are
# refused when data/raw already holds one (remove data/raw first).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh
exec .venv/bin/python -m datamask_pipeline.demo "$@"
