"""The name a run gives its results when no -o is given: the trace's, the target's and the
start time, in the working directory, so runs of one trace on several targets sit side by side."""
import re

import numpy as np

from replay.runner import RunOptions, replay
from traces.schema import Op
from traces.trace import write_trace


def test_results_without_a_name_are_named_after_the_trace_the_target_and_the_time(tmp_path, monkeypatch):
    trace = write_trace(tmp_path / "oltp-morning.parquet", {
        "ts_ns": np.arange(4, dtype=np.int64), "op": np.full(4, Op.WRITE, np.uint8),
        "offset": np.arange(4, dtype=np.int64) * 4096, "length": np.full(4, 4096, np.int64)},
        {"name": "oltp-morning"})
    target = tmp_path / "disk.img"
    target.write_bytes(bytes(1 << 20))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    outcome = replay(trace, target, RunOptions(engine="psync"))
    assert re.fullmatch(r"oltp-morning-disk\.img-\d{8}-\d{6}\.parquet", str(outcome.output)), outcome.output
    assert [p.name for p in work.iterdir()] == [outcome.output.name]
    null = replay(trace, None, RunOptions(engine="null"))
    assert re.fullmatch(r"oltp-morning-null-engine-\d{8}-\d{6}\.parquet", str(null.output)), null.output
