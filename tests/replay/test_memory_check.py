"""The memory check before a run: workers whose buffers cannot fit in the memory available are
refused in one sentence naming what to lower, before anything is opened or written."""
import numpy as np
import pytest

from replay.runner import RunOptions, replay
from traces.errors import ReplayError
from traces.schema import Op
from traces.trace import write_trace


def test_workers_whose_buffers_do_not_fit_in_memory_are_refused():
    # 10,000 workers were OOM-killed without a word; each holds up to ~17 MB.
    from traces.errors import ReplayError
    from replay.engines import check_memory

    check_memory(8, 1024, 64 << 10, available=1 << 30)  # 8 x 17 MiB fit in 1 GiB
    with pytest.raises(ReplayError, match=r"^100 workers need about 1\.7 GiB of buffers \(up to 17\.0 MiB each\) "
                                          r"but 1\.0 GiB is available; use fewer --workers"):
        check_memory(100, 1024, 64 << 10, available=1 << 30)


def test_a_run_whose_workers_cannot_fit_is_refused_before_anything_is_written(tmp_path):
    # Each worker holds room for two of the trace's largest I/O, 1 GiB here, and a pool twice
    # that: 256 workers need about 1 TiB, more than any machine that runs the suite has.
    trace = write_trace(tmp_path / "t.parquet", {
        "ts_ns": np.array([0, 1000], np.int64), "op": np.full(2, Op.READ, np.uint8),
        "offset": np.array([0, 1 << 30], np.int64), "length": np.full(2, 1 << 30, np.int64)},
        {"name": "t"})
    with pytest.raises(ReplayError, match=r"^256 workers need about [\d.]+ TiB of buffers \(up to [\d.]+ GiB "
                                          r"each\) but .* is available; use fewer --workers"):
        replay(trace, None, RunOptions(engine="null", workers=256), output=tmp_path / "out.parquet")
    assert list(tmp_path.iterdir()) == [trace]
