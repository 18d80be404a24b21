"""Peak-memory probe: run one pipeline step body on a partition in a fresh process and report
how much the process's resident-set high-water mark (``ru_maxrss``) rose during it.

    python -m tests.reliability.probe_memory {validate|select} DATA_ROOT WARM_KEY SMALL_KEY LARGE_KEY

``validate``: the blocking DuckDB checks of ``features/KEY.parquet`` (the real
``validate_features`` multi-check, invoked directly). ``select``: the real ``selected_subset``
asset body (streams the raw shard, writes ``selected/KEY.parquet``). The same step runs first
on the tiny partition WARM_KEY so that imports, DuckDB's and Arrow's allocators and code paths
are warm; then on SMALL_KEY, then on LARGE_KEY. For each, a sampler thread reads the resident
set size (/proc/self/statm) every 2 ms: reported is the highest RSS during the run minus the RSS
at its start (``ru_maxrss`` alone would hide a rise below an earlier peak). Prints JSON.
"""

import gc
import json
import os
import resource
import sys
import threading
import time


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RssSampler:
    """Highest RSS seen while the block runs, minus the RSS when it started."""

    def __enter__(self):
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        self.rise = self.peak - self.start
        return False


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
    gc.collect()
    with RssSampler() as small_mem:
        n_small = run(small)
    gc.collect()
    with RssSampler() as large_mem:
        n_large = run(large)
    print(json.dumps({"mode": mode, "results": [n_small, n_large], "small": small_mem.rise,
                      "large": large_mem.rise, "maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
