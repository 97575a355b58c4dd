"""Pacing, measured: rows are issued at their absolute deadlines (start + ts / speed), so one
late I/O never shifts the ones after it, and workers share one start instant. Bounds are
generous enough for a loaded 2-CPU machine, yet a replay that chains each deadline to the
previous issue (deadline = previous issue + trace gap) fails them: its lateness grows row by
row. The exact rule, on a fake clock, is engine/src/run.rs's
each_io_is_issued_at_its_deadline_or_when_the_engine_is_free.
"""
import time

import numpy as np
import pytest

from native import _engine
from replay.runner import RunOptions, replay
from traces.schema import Op
from traces.trace import read_trace, write_trace


def test_a_two_second_null_replay_keeps_to_the_trace_clock(tmp_path):
    n, gap = 100_000, 20_000  # 50k IOPS for 2 s
    ts = np.arange(n, dtype=np.int64) * gap
    write_trace(tmp_path / "t.parquet", {"ts_ns": ts, "op": np.full(n, Op.READ, np.uint8),
                                         "offset": (np.arange(n, dtype=np.int64) % 4096) * 4096,
                                         "length": np.full(n, 4096, np.int64)}, {"name": "paced"})
    outcome = replay(tmp_path / "t.parquet", None, RunOptions(engine="null"), output=tmp_path / "out.parquet")
    cols, _ = read_trace(outcome.output)
    assert len(cols["op"]) == n
    np.testing.assert_array_equal(cols["intended_ns"], ts)
    lateness = cols["issue_ns"] - cols["intended_ns"]
    assert (lateness >= 0).all()
    # Lateness never accumulates: some row of the last tenth (0.2 s) goes on time, however
    # late rows before it were. Chained deadlines carry every earlier overshoot (>= ~100 ns a
    # row, 90,000 rows) into all of them.
    assert lateness[-n // 10:].min() < 1_000_000, f"lowest late {lateness[-n // 10:].min() / 1e3:.0f} us"
    # A loaded 2-CPU machine (load 14 while this was written) holds the engine thread off
    # the CPU for ms at a time: median lateness 1-5 ms then, 0.1 us idle.
    assert np.median(lateness) < 10_000_000, f"median lateness {np.median(lateness) / 1e3:.0f} us"
    # End-time error: how late the run's last rows went, over the trace's length (the median
    # of the last 1,000, so one stall at the very end does not decide it).
    end_error = np.median(lateness[-1000:]) / (ts[-1] - ts[0])
    assert end_error < 0.01, f"end-time error {end_error:+.2%}"


def _one_row():
    return (np.zeros(1, np.int64), np.zeros(1, np.uint8), np.zeros(1, np.int64),
            np.full(1, 4096, np.int64))


def test_workers_given_one_start_instant_issue_from_it():
    reps = [_engine.Replayer(None, engine="null") for _ in range(3)]
    start = time.monotonic_ns() + 100_000_000  # every engine is built: start together
    for rep in reps:
        rep.start_at(start)
    for rep in reps:
        rep.push(*_one_row())
        rep.close()
    for rep in reps:
        (intended, issue, complete, result, issued) = rep.take()
        summary = rep.join()
        assert summary["start_monotonic_ns"] == start
        assert issued == 1 and intended[0] == 0 and 0 <= issue[0] < 50_000_000
    assert time.monotonic_ns() >= start


@pytest.mark.parametrize("rows", [1, 0])
def test_start_at_after_the_first_push_is_refused(rows):
    # Even an empty chunk: its arrival fixes the engine's start.
    rep = _engine.Replayer(None, engine="null")
    rep.push(*(col[:rows] for col in _one_row()))
    with pytest.raises(RuntimeError, match="after the first push"):
        rep.start_at(time.monotonic_ns())
    rep.close()
    rep.join()
