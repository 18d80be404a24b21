"""DATAMASK benchmark suite: ``python -m bench.run --mode quick|full`` (see bench/run.py)."""
