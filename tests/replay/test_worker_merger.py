"""The worker merger: a trace's rows, dealt to several workers, come back in trace order,
every row once, in the chunks they were pushed in, to the results file and to each consumer."""
import numpy as np
import pytest

from replay.runner import RunOptions, replay
from traces.schema import Op
from traces.trace import read_trace, write_trace

ROWS = 1000


class Chunks(list):
    """A consumer that keeps every results chunk it is given."""

    def add(self, chunk):
        self.append(chunk)


@pytest.mark.parametrize("workers,chunk_rows", [(1, 1000), (3, 97), (8, 5)])
def test_rows_dealt_to_workers_come_back_in_trace_order_chunk_by_chunk(tmp_path, workers, chunk_rows):
    # Offsets shuffled and lengths varied, so that a row out of place shows; 1 ms of trace, so
    # no chunk is cut into pieces by time.
    rng = np.random.default_rng(workers)
    cols = {"ts_ns": np.arange(ROWS, dtype=np.int64) * 1000,
            "op": np.where(np.arange(ROWS) % 3 == 0, Op.WRITE, Op.READ).astype(np.uint8),
            "offset": rng.permutation(ROWS).astype(np.int64) * 16384,
            "length": (1 + np.arange(ROWS) % 4).astype(np.int64) * 4096}
    trace = write_trace(tmp_path / "t.parquet", cols, {"name": "t"})
    chunks = Chunks()
    outcome = replay(trace, None, RunOptions(engine="null", workers=workers, chunk_rows=chunk_rows),
                     output=tmp_path / "out.parquet", consumers=[chunks])
    got, meta = read_trace(outcome.output)
    for name, want in cols.items():
        np.testing.assert_array_equal(got[name], want, err_msg=name)
    np.testing.assert_array_equal(got["result"], cols["length"])
    assert outcome.rows == meta["rows_done"] == ROWS and meta["run"]["workers"] == workers
    sizes = [chunk_rows] * (ROWS // chunk_rows) + ([ROWS % chunk_rows] if ROWS % chunk_rows else [])
    assert [len(c["op"]) for c in chunks] == sizes
    for name in ("offset", "issue_ns", "complete_ns"):
        np.testing.assert_array_equal(np.concatenate([c[name] for c in chunks]), got[name])
