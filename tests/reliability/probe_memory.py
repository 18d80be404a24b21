"""Peak-memory probe: run one pipeline step body on a partition in a fresh process and report
how much the process's resident-set high-water mark (``ru_maxrss``) rose during it.

    python -m tests.reliability.probe_memory {validate|select} DATA_ROOT WARM_KEY SMALL_KEY LARGE_KEY

``validate``: the blocking DuckDB checks of ``features/KEY.parquet`` (the real
``validate_features`` multi-check, invoked directly). ``select``: the real ``selected_subset``
asset body (streams the raw shard, writes ``selected/KEY.parquet``). The same step runs first
on the tiny partition WARM_KEY so that imports, DuckDB's and Arrow's allocators and code paths
are warm; then on SMALL_KEY, then on LARGE_KEY. Reported: ``small``, the rise of the peak during
the SMALL_KEY run, and ``large``, the rise during SMALL_KEY and LARGE_KEY together (the peak the
large shard needs over the warm process). Prints JSON.
"""

import json
import resource
import sys


def _peak() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main(argv=None) -> int:
    mode, root, warm, small, large = (argv or sys.argv[1:])[:5]
    import dagster as dg
    from dagster_duckdb import DuckDBResource

    from assets.select import selected_subset
    from assets.validate import validate_features
    from resources.contract import DataContract
    from resources.storage import DataRoot

    data_root = DataRoot(root=root)
    contract = DataContract()

    def run(k):
        if mode == "validate":
            out = list(validate_features(dg.build_op_context(partition_key=k), data_root=data_root,
                                         contract=contract, duckdb=DuckDBResource(database=":memory:")))
            assert out and all(r.passed for r in out), [r.description for r in out if not r.passed]
            return len(out)
        res = selected_subset(dg.build_asset_context(partition_key=k), data_root=data_root,
                              contract=contract)
        return res.metadata["dagster/row_count"]

    run(warm)
    base = _peak()
    n_small = run(small)
    after_small = _peak()
    n_large = run(large)
    after_large = _peak()
    print(json.dumps({"mode": mode, "results": [n_small, n_large],
                      "small": after_small - base, "large": after_large - base}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
