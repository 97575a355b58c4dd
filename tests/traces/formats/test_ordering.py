"""The shortcuts of the import's time ordering (traces.formats.ordering) against the long way:
Ordered's rows in order, and Outliers' chunks with no gap beyond the limit, give what the full
passes give, on generated chunks with disorder and damaged times."""
from pathlib import Path
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.errors import TraceFormatError
from traces.formats import ordering, reading

CHUNKS = st.lists(st.lists(st.tuples(st.integers(-60, 100), st.sampled_from([0, 0, 0, 0, 1])), max_size=30),
                  min_size=1, max_size=6)


def chunks_of(parts, far):
    """Chunks of times rising by the drawn steps (some back), every row marked 1 moved `far`."""
    t, row, out = 1000, 0, []
    for part in parts:
        ts, rows = [], []
        for step, damaged in part:
            t = max(0, t + step)
            ts.append(t + far if damaged else t)
            rows.append(row)
            row += 1
        out.append((rows[0] if rows else row, {"ts_ns": np.array(ts, np.int64), "x": np.array(rows, np.int64)}))
    return out


def run(parts, window, far, drop):
    log = ordering.OutlierLog(drop)
    try:
        got = list(ordering.ordered_chunks(Path("t"), iter(chunks_of(parts, far)), window, 0, log, scale=1))
    except TraceFormatError as e:
        return "error", str(e)
    rows = np.concatenate([c["x"] for c in got]) if got else np.zeros(0, np.int64)
    ts = np.concatenate([c["ts_ns"] for c in got]) if got else np.zeros(0, np.int64)
    return rows.tolist(), ts.tolist(), log.count


@settings(max_examples=300, deadline=None)
@given(parts=CHUNKS, window=st.sampled_from([0, 40, 1000]), drop=st.booleans(),
       far=st.sampled_from([10**6, 2 * ordering.MAX_GAP_NS]))
def test_shortcuts_give_what_the_full_passes_give(parts, window, far, drop):
    # Errors name line -1: there is no file to find lines in, the same both ways.
    with mock.patch.object(reading, "iter_lines", lambda path, skip_rows=0: iter(())):
        fast = run(parts, window, far, drop)
        # The long way: Outliers never quiet, Ordered never sure its rows are in order.
        with mock.patch.object(ordering.Outliers, "_quiet", lambda self, chunk, n, limit: None), \
                mock.patch.object(ordering.Ordered, "_in_order", lambda self, ts, newest: False):
            slow = run(parts, window, far, drop)
    assert fast == slow


def test_a_quiet_chunk_is_passed_whole():
    outliers = ordering.Outliers(Path("t"), ordering.OutlierLog(), line_of=lambda row: row)
    chunk = {"ts_ns": np.arange(100, dtype=np.int64), "_row": np.arange(100)}
    kept, n = outliers._judge(chunk, 95)
    assert n == 95 and np.shares_memory(kept["ts_ns"], chunk["ts_ns"])
    assert (outliers.before, outliers.before_gap) == (94.0, 1.0)
