"""The runner's parts on their own, without a run: the pieces a crash can afford to lose
(replay.merger.pieces), the progress ticker (replay.progress) and the time limit outside the
main thread (replay.timelimit)."""
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from replay.merger import pieces
from replay.options import RunOptions
from replay.output import RESULT_FLUSH_S
from replay.progress import Ticker
from replay.timelimit import Deadline, TimeUp

S = 1_000_000_000


def _chunk(ts_ns):
    ts = np.asarray(ts_ns, np.int64)
    return {"ts_ns": ts, "op": np.zeros(len(ts), np.uint8), "offset": np.arange(len(ts), dtype=np.int64)}


@pytest.mark.parametrize("speed", [1.0, 2.0, 0.5])
def test_a_timed_chunk_is_cut_into_pieces_of_at_most_the_flush_interval_of_replay_time(speed):
    # 12 s of trace, an I/O every 10 ms: at `speed`, 12 / speed s of replay.
    chunk = _chunk(np.arange(1200) * 10_000_000)
    got = list(pieces([chunk], RunOptions(speed=speed), SimpleNamespace(done=0)))
    span_ns = RESULT_FLUSH_S * speed * S
    assert len(got) == int(np.ceil(12 * S / span_ns))
    for piece in got:
        assert piece["ts_ns"][-1] - piece["ts_ns"][0] < span_ns
    for name, col in chunk.items():  # every row once, in order
        np.testing.assert_array_equal(np.concatenate([p[name] for p in got]), col)


def test_a_short_chunk_and_an_empty_one_pass_whole():
    short, empty = _chunk(np.arange(10) * 1000), _chunk([])
    got = list(pieces([short, empty], RunOptions(), SimpleNamespace(done=0)))
    assert got[0] is short and got[1] is empty


def test_as_fast_as_possible_the_first_pieces_are_8192_rows():
    chunk = _chunk(np.zeros(20_000))
    got = list(pieces([chunk], RunOptions(timing="afap"), SimpleNamespace(done=0)))
    assert [len(p["op"]) for p in got] == [8192, 8192, 20_000 - 2 * 8192]


def test_the_ticker_reports_the_rows_done_capped_at_the_total_and_once_more_when_stopped():
    merger = SimpleNamespace(done=0, reps=[])
    calls = []
    ticker = Ticker(lambda done, total, elapsed: calls.append((done, total, elapsed)), merger, total=100)
    ticker.start(time.monotonic_ns())
    merger.done = 150  # more than the total: a generator's estimate, say
    ticker.stop()
    assert calls and calls[-1][:2] == (100, 100) and calls[-1][2] >= 0
    assert all(done <= 100 for done, _, _ in calls)


def test_without_a_callback_the_ticker_starts_no_thread():
    ticker = Ticker(None, SimpleNamespace(done=0, reps=[]), total=None)
    ticker.start(time.monotonic_ns())
    assert ticker.running and not any(t.name == "replay-progress" for t in threading.enumerate())
    ticker.stop()


def test_outside_the_main_thread_the_time_limit_is_checked_between_waits():
    # No interval timer there (signals go to the main thread): each wait checks the clock.
    raised = []

    def run():
        deadline = Deadline(0.05, None)
        deadline.start()
        assert deadline.wait(lambda x: x + 1, 1) == 2  # within the limit: the call's result
        time.sleep(0.1)
        try:
            deadline.wait(lambda: None)
        except TimeUp:
            raised.append(deadline.passed)
        deadline.cancel()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert raised == [True]


def test_a_deadline_without_a_limit_never_ends_the_run():
    deadline = Deadline(None, None)
    deadline.start()
    assert deadline.at is None and deadline.wait(lambda: "done") == "done"
    deadline.check()
