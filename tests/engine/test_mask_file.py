"""The mask file's selection record is what was decided, not how the run went: two runs that
differ only in wall times, the polish trace and a resumed step write the same bytes."""

import dataclasses

import numpy as np
import pyarrow.parquet as pq

from datamask_pipeline.engine.storage import mask_file


def _record(**changes):
    base = mask_file.SelectionRecord(
        n=4, k=2, term="DiSF", lamb=0.5, solver="auto", route="topk+polish", device="cpu",
        steps=3, config_hash="abc", config={"algorithm": "DiSF"},
        scores={"datamask": {"f": 1.0, "f_qua": 0.5, "f_div": 0.5}},
        history=[{"step": 1, "mean_f": 0.9, "elapsed_s": 0.1}], timings={"total_s": 1.0},
        resumed_from=0,
        polish={"f_start": 0.9, "f_end": 1.0, "swaps": 2, "elapsed_s": 0.3,
                "history": [(0.1, 0.95, 1)], "converged": True})
    return dataclasses.replace(base, **changes)


def test_run_facts_stay_out_of_the_file(tmp_path):
    a = _record()
    b = _record(history=[{"step": 1, "mean_f": 0.9, "elapsed_s": 7.0}], timings={"total_s": 9.0},
                resumed_from=1, polish={**a.polish, "elapsed_s": 5.0, "history": [(2.0, 0.95, 1)]})
    assert a.to_json() == b.to_json()
    # what was decided does change the bytes
    assert a.to_json() != _record(scores={"datamask": {"f": 1.5, "f_qua": 0.5, "f_div": 1.0}}).to_json()
    back = mask_file.SelectionRecord.from_json(a.to_json())
    assert back.scores == a.scores and back.timings == {} and back.resumed_from == 0
    assert "elapsed_s" not in back.history[0] and "history" not in back.polish

    t = mask_file.mask_table(np.arange(4), np.zeros(4), np.arange(4), np.array([1, 1, 0, 0], bool), a)
    pq.write_table(t, tmp_path / "m.parquet")
    assert pq.read_schema(tmp_path / "m.parquet").metadata[mask_file.METADATA_KEY] == a.to_json()
