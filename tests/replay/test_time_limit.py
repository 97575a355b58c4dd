"""A run's time limit: it ends the run on time even while the run only waits on the engine
(an interval timer interrupts the wait), as a limited run, not an interrupted one, keeping
the rows done."""
import time

import numpy as np

from replay.runner import RunOptions, replay
from traces.schema import Op
from traces.trace import read_trace, write_trace

GAP_S = 120


def test_a_time_limit_ends_a_run_that_waits_for_an_io_due_minutes_later(tmp_path):
    # Row 0 is due at once, row 1 GAP_S later: once both are pushed the run only waits on the
    # engine, so checks between chunks alone would let it run GAP_S.
    trace = write_trace(tmp_path / "t.parquet", {
        "ts_ns": np.array([0, GAP_S * 10**9], np.int64), "op": np.full(2, Op.READ, np.uint8),
        "offset": np.array([0, 4096], np.int64), "length": np.full(2, 4096, np.int64)}, {"name": "t"})
    out = tmp_path / "out.parquet"
    started = time.monotonic()
    outcome = replay(trace, None, RunOptions(engine="null", time_limit_s=0.5), output=out)
    elapsed = time.monotonic() - started
    assert 0.5 <= elapsed < GAP_S / 4, elapsed  # generous for a loaded machine, far below GAP_S
    assert outcome.time_limited and not outcome.interrupted and outcome.rows == 1
    cols, meta = read_trace(out)
    assert list(cols["ts_ns"]) == [0] and cols["result"][0] == 4096
    assert meta["time_limited"] is True and meta["interrupted"] is False and meta["rows_done"] == 1
