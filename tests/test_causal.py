"""Causal replay: dependency and think-time inference from a captured trace (analysis.causal),
checked against closed-loop workloads generated from a known model.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis import causal
from replay.errors import TraceFormatError
from tests.cli_process import replay_cli
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
    want_back = np.where(parent >= 0, rows - parent, 0)
    np.testing.assert_array_equal(got["parent"], want_back)
    np.testing.assert_array_equal(got["parent2"], 0)
    np.testing.assert_array_equal(got["think_ns"], think)


def test_a_flush_waits_for_the_last_write_completed_before_it():
    # pid 1 writes (done at 100), pid 2 reads (done at 150), pid 3 flushes at 200.
    cols = {"ts_ns": np.array([0, 10, 200], np.int64), "op": np.array([Op.WRITE, Op.READ, Op.FLUSH], np.uint8),
            "latency_ns": np.array([100, 140, 5], np.int64), "pid": np.array([1, 2, 3], np.int32),
            "comm": np.array(["a", "b", "c"], dtype=object)}
    a = causal.annotate(cols, "chains")
    assert list(a["parent"]) == [0, 0, 2] and list(a["think_ns"]) == [0, 0, 100]
    a = causal.annotate(cols, "recent", window_ns=100)
    # the most recent completion (the read, at 150) and the write before it (at 100)
    assert list(a["parent"]) == [0, 0, 1] and list(a["parent2"]) == [0, 0, 2]
    assert list(a["think_ns"]) == [0, 0, 50]


def test_writeback_workers_form_one_chain_apart_from_user_threads():
    comm = np.array(["kworker/u8:4", "postgres", "kworker/u8:17", "jbd2/loop1-8"], dtype=object)
    cols = {"ts_ns": np.array([0, 5, 20, 30], np.int64), "op": np.full(4, Op.WRITE, np.uint8),
            "latency_ns": np.array([10, 10, 10, 10], np.int64), "pid": np.array([7, 8, 9, 10], np.int32),
            "comm": comm}
    a = causal.annotate(cols, "chains")
    # kworker/u8:17 follows kworker/u8:4's write, not postgres's later one; jbd2 is its own chain
    assert list(a["parent"]) == [0, 0, 2, 0]


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
    assert "causal          chains:" in done.stdout and "think time      p50" in done.stdout
    done = replay_cli("traces", "show", "demo")  # synthetic: no pid, no latency
    assert "causal          - (needs the pid and latency_ns columns" in done.stdout


# -- fixed work: the recipes record the application's own outcome ------------------------

@pytest.mark.root
@pytest.mark.loopdev
def test_oltp_fixed_work_records_pgbench_outcome(tmp_path):
    from traces.capture.recipes import load

    out = tmp_path / "oltp.parquet"
    load("oltp").run(None, out, notices=[], transactions=50, seed=3, scale=1, clients=2,
                     memory_mb=128, shared_buffers_mb=16)
    meta = open_trace(out).metadata
    outcome = meta["recipe"]["outcome"]
    assert outcome["transactions"] == 100 and outcome["status"] == 0
    assert outcome["tps"] > 0 and outcome["latency_ms"] > 0 and outcome["elapsed_s"] > 0
    assert "-t 50 --random-seed=3" in meta["recipe"]["workload"]
    assert "50 transactions per client (seed 3)" in meta["description"]


@pytest.mark.root
@pytest.mark.loopdev
def test_blob_fixed_work_records_operations_and_latency(tmp_path):
    from traces.capture.recipes import load

    out = tmp_path / "blob.parquet"
    load("blob").run(None, out, notices=[], ops=60, populate_mb=64, clients=2, memory_mb=128)
    outcome = open_trace(out).metadata["recipe"]["outcome"]
    assert outcome["operations"] == 60 and sum(outcome["by_op"].values()) == 60
    assert outcome["ops_per_s"] > 0 and outcome["latency_ms"]["p99"] >= outcome["latency_ms"]["p50"] > 0
    assert outcome["elapsed_s"] >= outcome["store_elapsed_s"] > 0
