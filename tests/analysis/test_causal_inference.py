"""Causal inference (analysis.causal): the dependencies and think times of a captured trace,
checked against closed-loop workloads generated from a known model.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import causal
from tests.cli_process import replay_cli
from traces.errors import TraceFormatError
from traces.schema import Op
from traces.trace import open_trace, write_trace


def closed_loop(threads, ios, think, latency, start=None, seed=0):
    """A known model: `threads` threads, each issuing `ios` I/Os one at a time, I/O j of a
    thread `think(rng)` ns after the thread's previous I/O completed, taking `latency(rng)`.
    Returns the trace columns (sorted by issue time) and, per row, the model's parent row
    (-1 for a thread's first I/O) and think time."""
    rows = []
    rng = np.random.default_rng(seed)
    for k in range(threads):
        t = int(start[k]) if start is not None else int(rng.integers(0, 1_000_000))
        for j in range(ios):
            lat = int(latency(rng))
            rows.append((t, k, j, lat))
            t = t + lat + int(think(rng))
    rows.sort(key=lambda r: (r[0], r[1]))
    ts = np.array([r[0] for r in rows], np.int64)
    pid = np.array([r[1] + 100 for r in rows], np.int32)
    lat = np.array([r[3] for r in rows], np.int64)
    index = {(r[1], r[2]): i for i, r in enumerate(rows)}
    parent = np.array([index.get((r[1], r[2] - 1), -1) for r in rows], np.int64)
    think_ns = np.array([ts[i] - (ts[p] + lat[p]) if p >= 0 else 0 for i, p in enumerate(parent)], np.int64)
    n = len(rows)
    cols = {"ts_ns": ts - ts.min(), "op": np.full(n, Op.READ, np.uint8),
            "offset": np.arange(n, dtype=np.int64) * 4096, "length": np.full(n, 4096, np.int64),
            "latency_ns": lat, "pid": pid, "comm": np.array(["app"] * n, dtype=object)}
    return cols, parent, think_ns


model = st.fixed_dictionaries({
    "threads": st.integers(1, 6),
    "ios": st.integers(1, 40),
    "think_max": st.sampled_from([0, 1_000, 50_000, 2_000_000]),
    "latency": st.tuples(st.integers(1_000, 200_000), st.integers(0, 300_000)),
    "seed": st.integers(0, 2**31),
})


@settings(max_examples=150, deadline=None)
@given(model, st.integers(1, 50))
def test_chains_recover_a_closed_loop_model_exactly_in_any_chunking(m, step):
    lo, spread = m["latency"]
    cols, parent, think = closed_loop(
        m["threads"], m["ios"], think=lambda r: r.integers(0, m["think_max"] + 1),
        latency=lambda r: r.integers(lo, lo + spread + 1), seed=m["seed"])
    ann = causal.Annotator("chains")
    got = {"parent": [], "parent2": [], "think_ns": []}
    for s in range(0, len(cols["ts_ns"]), step):
        part = ann.add({k: v[s:s + step] for k, v in cols.items()})
        for k in got:
            got[k].append(part[k])
    got = {k: np.concatenate(v) for k, v in got.items()}
    rows = np.arange(len(parent))
    chained = parent >= 0
    np.testing.assert_array_equal(got["parent"][chained], (rows - parent)[chained])
    np.testing.assert_array_equal(got["think_ns"][chained], think[chained])
    np.testing.assert_array_equal(got["parent2"], 0)
    # A thread's first I/O follows the last I/O of any thread completed before it, if any.
    done = cols["ts_ns"] + cols["latency_ns"]
    for i in np.flatnonzero(~chained):
        before = np.flatnonzero(done[:i] <= cols["ts_ns"][i])
        if len(before):
            assert done[i - got["parent"][i]] == done[before].max(), i
            assert got["think_ns"][i] == cols["ts_ns"][i] - done[before].max()
        else:
            assert got["parent"][i] == 0 and got["think_ns"][i] == 0


def test_a_flush_waits_for_every_earlier_io_or_the_last_write_before_it():
    # pid 1 writes (done at 100), pid 2 reads (done at 150), pid 3 flushes at 200 with nothing
    # in flight: it waits for every earlier I/O (a barrier), and follows the read, the last
    # completion, as pid 3's first I/O.
    cols = {"ts_ns": np.array([0, 10, 200], np.int64), "op": np.array([Op.WRITE, Op.READ, Op.FLUSH], np.uint8),
            "latency_ns": np.array([100, 140, 5], np.int64), "pid": np.array([1, 2, 3], np.int32),
            "comm": np.array(["a", "b", "c"], dtype=object)}
    a = causal.annotate(cols, "chains")
    assert list(a["parent"]) == [0, 0, 1] and list(a["parent2"]) == [0, 0, causal.BARRIER]
    assert list(a["think_ns"]) == [0, 0, 50]
    # With a read of pid 2 still in flight at 200, the flush waits for the last write only.
    cols = {"ts_ns": np.array([0, 10, 190, 200], np.int64),
            "op": np.array([Op.WRITE, Op.READ, Op.READ, Op.FLUSH], np.uint8),
            "latency_ns": np.array([100, 140, 1000, 5], np.int64), "pid": np.array([1, 2, 2, 3], np.int32),
            "comm": np.array(["a", "b", "b", "c"], dtype=object)}
    a = causal.annotate(cols, "chains")
    assert list(a["parent"]) == [0, 0, 1, 2] and list(a["parent2"]) == [0, 0, 0, 3]
    assert list(a["think_ns"]) == [0, 0, 40, 50]
    a = causal.annotate(cols, "recent", window_ns=100)
    assert list(a["parent"]) == [0, 0, 1, 2] and list(a["parent2"]) == [0, 0, 0, 3]


def test_strided_columns_annotate_as_their_contiguous_copies():
    # The kernel takes C-contiguous columns; a caller's strided views are copied at the edge.
    cols, _, _ = closed_loop(3, 20, lambda rng: rng.integers(0, 50_000), lambda rng: rng.integers(1_000, 90_000))
    strided = {}
    for name, col in cols.items():
        doubled = np.repeat(col, 2)
        strided[name] = doubled[::2]
        assert not strided[name].flags.c_contiguous
    strided["flags"] = np.zeros(2 * len(cols["ts_ns"]), np.uint8)[::2]
    want = causal.annotate({**cols, "flags": np.zeros(len(cols["ts_ns"]), np.uint8)}, "hybrid")
    got = causal.annotate(strided, "hybrid")
    assert {k: v.tolist() for k, v in got.items()} == {k: v.tolist() for k, v in want.items()}


def test_writeback_workers_form_one_chain_apart_from_user_threads():
    comm = np.array(["kworker/u8:4", "postgres", "kworker/u8:17", "jbd2/loop1-8"], dtype=object)
    cols = {"ts_ns": np.array([0, 5, 20, 30], np.int64), "op": np.full(4, Op.WRITE, np.uint8),
            "latency_ns": np.array([10, 10, 10, 10], np.int64), "pid": np.array([7, 8, 9, 10], np.int32),
            "comm": comm}
    a = causal.annotate(cols, "chains")
    # kworker/u8:17 follows kworker/u8:4's write, not postgres's later one; jbd2, its own
    # chain, begins after the last completion before it
    assert list(a["parent"]) == [0, 0, 2, 1]


def test_a_parent_too_far_back_is_dropped():
    n = 10
    cols = {"ts_ns": np.arange(n, dtype=np.int64) * 100, "op": np.zeros(n, np.uint8),
            "latency_ns": np.full(n, 10, np.int64), "pid": np.array([1] + [2] * (n - 2) + [1], np.int32),
            "comm": np.array(["a"] * n, dtype=object)}
    a = causal.Annotator("chains", max_back=5).add(cols)
    assert a["parent"][-1] == 0 and a["parent"][2] == 1


def test_missing_pid_or_latency_is_refused_naming_the_column(tmp_path):
    cols = {"ts_ns": np.array([0, 1], np.int64), "op": np.zeros(2, np.uint8),
            "offset": np.zeros(2, np.int64), "length": np.full(2, 4096, np.int64),
            "latency_ns": np.array([5, 5], np.int64)}
    write_trace(tmp_path / "t.parquet", cols, {"name": "t"})
    with pytest.raises(TraceFormatError, match=r"needs the column pid.*replay capture"):
        causal.check_columns(tmp_path / "t.parquet", open_trace(tmp_path / "t.parquet").column_names)


def test_traces_show_reports_chains_roots_and_think_time():
    done = replay_cli("traces", "show", "blob")
    assert done.returncode == 0, done.stderr
    assert "causal          hybrid:" in done.stdout and "think time      p50" in done.stdout
    done = replay_cli("traces", "show", "demo")  # synthetic: no pid, no latency
    assert "causal          - (needs the pid and latency_ns columns" in done.stdout


def test_hybrid_also_waits_for_another_process_completed_just_before():
    # A client writes (done at 100); the journal thread commits (110 to 200); the client's
    # next I/O, at 205, came after the commit it waited for in fsync, not 105 ns of its own.
    cols = {"ts_ns": np.array([0, 110, 205], np.int64), "op": np.array([Op.WRITE, Op.WRITE, Op.READ], np.uint8),
            "latency_ns": np.array([100, 90, 10], np.int64), "pid": np.array([1, 9, 1], np.int32),
            "comm": np.array(["app", "jbd2/sda-8", "app"], dtype=object), "flags": np.array([0, 2, 0], np.uint8)}
    a = causal.annotate(cols, "chains")
    assert list(a["parent"]) == [0, 1, 2] and list(a["parent2"]) == [0, 0, 0] and a["think_ns"][2] == 105
    a = causal.annotate(cols, "hybrid")
    assert list(a["parent"]) == [0, 1, 2] and list(a["parent2"]) == [0, 0, 1] and a["think_ns"][2] == 5


def installer(writeback_gap_ns):
    """dpkg-like, in ms: the writeback worker writes (0-1), the journal thread commits (1-2);
    the installer writes its files, each 1 ms after the last I/O completed (3-4, 5-6, 7-8);
    the journal thread commits them 5 ms later (13-14), and the writeback worker writes again
    `writeback_gap_ns` after that commit completed."""
    ms = 1_000_000
    ts = np.array([0, 1, 3, 5, 7, 13, 14], np.int64) * ms
    ts[6] += writeback_gap_ns
    return {"ts_ns": ts, "op": np.full(7, Op.WRITE, np.uint8), "latency_ns": np.full(7, ms, np.int64),
            "pid": np.array([5, 9, 1, 1, 1, 9, 6], np.int32),
            "comm": np.array(["kworker/u8:2", "jbd2/sda-8", "dpkg", "dpkg", "dpkg", "jbd2/sda-8",
                              "kworker/u8:15"], dtype=object),
            "flags": np.array([0, 5, 0, 0, 0, 5, 0], np.uint8)}


@pytest.mark.parametrize("gap_ms", [0.5, 250, 10_000])
def test_hybrid_links_the_kernels_threads_to_what_the_applications_did_last(gap_ms):
    # The journal's commit 5 ms after the installer's last write (past the 2 ms window, inside
    # the durable one) commits it: it waits for that write, not 11 ms after its own last I/O.
    # Writeback, however long after, follows the last completion of any process (the pages
    # dirtied, a sync), not its own previous write: on a faster drive the installer finishes
    # sooner, and so does the writeback it starts (dpkg slow -> fast ran +28 % without).
    ms = 1_000_000
    gap = int(gap_ms * ms)
    a = causal.annotate(installer(gap), "hybrid")
    assert (a["parent"][5], a["parent2"][5], a["think_ns"][5]) == (4, 1, 5 * ms)
    assert (a["parent"][6], a["parent2"][6], a["think_ns"][6]) == (6, 1, gap)
    assert a["from_op"][6] == Op.WRITE
    # With chains each keeps its own thread's pace.
    chains = causal.annotate(installer(gap), "chains")
    assert list(chains["parent2"]) == [0] * 7 and list(chains["think_ns"][5:]) == [11 * ms, 13 * ms + gap]
    # A journal I/O past the durable window (a timer's commit) keeps it with hybrid too.
    late = installer(gap)
    late["ts_ns"][5:] += 6 * ms
    b = causal.annotate(late, "hybrid")
    assert (b["parent"][5], b["parent2"][5], b["think_ns"][5]) == (4, 0, 17 * ms)


def _lock_waiter(holder_done_ns):
    """Client 10 reads (0-1 ms), then sleeps 2-12 ms polling for a lock, then writes at 13 ms;
    client 20, the lock's holder, writes from 3 ms until `holder_done_ns`; process 30 reads
    from 11 to 12.5 ms, after client 10 woke."""
    ms = 1_000_000
    cols = {"ts_ns": np.array([0, 3 * ms, 11 * ms, 13 * ms], np.int64),
            "op": np.array([Op.READ, Op.WRITE, Op.READ, Op.WRITE], np.uint8),
            "latency_ns": np.array([ms, holder_done_ns - 3 * ms, ms + ms // 2, ms], np.int64),
            "pid": np.array([10, 20, 30, 10], np.int32), "comm": np.array(["db"] * 4, dtype=object),
            "flags": np.zeros(4, np.uint8)}
    return cols, {"pid": [10], "start_ns": [2 * ms], "end_ns": [12 * ms]}


@pytest.mark.parametrize("heuristic", ["chains", "hybrid"])
def test_a_process_that_slept_waits_for_the_io_it_woke_after_not_for_its_sleep(heuristic):
    # Without the sleeps, the client's 12 ms between its read and its write is its own time
    # (hybrid: 0.5 ms after process 30's read). With them, the write waits for the holder's
    # write (done at 8 ms, during the sleep) plus the 1 ms the client ran after waking: on a
    # faster drive the lock frees sooner, and the poll's interval is not the client's work.
    cols, sleeps = _lock_waiter(8_000_000)
    blind = causal.annotate(cols, heuristic)
    assert blind["parent"][3] == 3 and blind["think_ns"][3] == (12_000_000 if heuristic == "chains" else 500_000)
    a = causal.annotate(cols, heuristic, sleeps=sleeps)
    assert (a["parent"][3], a["parent2"][3], a["think_ns"][3]) == (3, 2, 1_000_000)
    assert a["from_op"][3] == Op.WRITE
    assert list(a["parent"][:3]) == list(blind["parent"][:3]) and list(a["think_ns"][:3]) == list(blind["think_ns"][:3])
    # In any chunking: the completions it searches are carried from chunk to chunk.
    ann = causal.Annotator(heuristic, sleeps=sleeps)
    parts = [ann.add({k: v[i:i + 1] for k, v in cols.items()}) for i in range(4)]
    assert [int(p["think_ns"][0]) for p in parts] == list(a["think_ns"])
    assert [int(p["parent2"][0]) for p in parts] == list(a["parent2"])


def test_a_sleep_that_no_other_process_ended_stays_the_processs_own_time():
    # The holder's write ends after the client woke (a timer sleep, or a lock held by
    # computation): nothing another process did on the drive ended it, so it is kept.
    cols, sleeps = _lock_waiter(12_800_000)
    assert {k: list(v) for k, v in causal.annotate(cols, "chains", sleeps=sleeps).items()} == \
           {k: list(v) for k, v in causal.annotate(cols, "chains").items()}
    # A sleep before the process's previous I/O does not count for this one.
    early = {"pid": [10], "start_ns": [-5_000_000], "end_ns": [-1_000_000]}
    cols, _ = _lock_waiter(8_000_000)
    assert causal.annotate(cols, "chains", sleeps=early)["think_ns"][3] == 12_000_000


# -- the replayer's own time per hop comes off think times ---------------------------------

def test_host_costs_come_off_think_times_by_the_op_pair_never_below_zero():
    # One process: a read (0-10), a write 50 after it completed, a flush 5 after the write:
    # the flush's think (5) is less than the flush-after-write cost, so it becomes 0.
    cols = {"ts_ns": np.array([0, 60, 75], np.int64), "op": np.array([0, 1, 3], np.uint8),
            "latency_ns": np.array([10, 10, 10], np.int64), "pid": np.array([7, 7, 7], np.int32)}
    plain = causal.annotate(cols, "chains")
    assert list(plain["think_ns"]) == [0, 50, 5] and list(plain["from_op"]) == [-1, 0, 1]
    host = np.zeros((4, 4), np.int64)
    host[0, 1], host[1, 3], host[1, 1] = 20, 30, 99
    adjusted = causal.Annotator("chains", host_ns=host).add(cols)
    assert list(adjusted["think_ns"]) == [0, 30, 0]
    assert list(adjusted["parent"]) == list(plain["parent"]) and list(adjusted["parent2"]) == list(plain["parent2"])
