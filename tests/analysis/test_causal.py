"""Causal replay: dependency and think-time inference from a captured trace (analysis.causal),
checked against closed-loop workloads generated from a known model.
"""
import os

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
    # The run's start and end on the trace's clock: after the capture started, elapsed apart.
    start, end = outcome["start_monotonic_ns"], outcome["end_monotonic_ns"]
    assert meta["source"]["start_monotonic_ns"] < start < end
    assert (end - start) / 1e9 == pytest.approx(outcome["elapsed_s"])


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
    assert 0 < outcome["cpu_user_s"] + outcome["cpu_system_s"] <= outcome["elapsed_s"] * os.cpu_count()
    # The clients' sleeps (SQLite's busy handler) are traced with the blob store's I/O.
    sleeps = open_trace(out).metadata["source"]["sleeps"]
    assert sleeps is not None and len(sleeps["pid"]) == len(sleeps["start_ns"]) == len(sleeps["end_ns"])


# -- causal replay: the engine issues each I/O when its parents completed, plus think ------


def _replay_model(cols, service_ns, step=1 << 16, think_scale=1.0):
    """Annotate `cols` and replay them in causal mode on the null engine with a fixed service
    time, as the runner does; returns the annotation and the results columns."""
    from replay import _engine

    ann = causal.Annotator("chains")
    rep = _engine.Replayer(None, engine="null", causal=True, think_scale=think_scale, service_ns=service_ns,
                           depth=1024, max_length=4096)
    deps = []
    n = len(cols["ts_ns"])
    for s in range(0, n, step):
        part = {k: v[s:s + step] for k, v in cols.items()}
        a = ann.add(part)
        deps.append(a)
        rep.push(part["ts_ns"], part["op"], part["offset"], part["length"], None,
                 parent=a["parent"].astype(np.uint32), parent2=a["parent2"].astype(np.uint32),
                 think_ns=a["think_ns"])
    rep.close()
    out = []
    while (got := rep.take(True)) is not None:
        out.append(got)
    rep.join()
    res = {k: np.concatenate([o[i] for o in out]) for i, k in enumerate(("intended_ns", "issue_ns", "complete_ns", "result"))}
    return {k: np.concatenate([d[k] for d in deps]) for k in deps[0]}, res


@settings(max_examples=25, deadline=None)
@given(model, st.integers(1, 200), st.sampled_from([1.0, 0.5, 2.0]))
def test_causal_replay_of_a_closed_loop_model_follows_its_dependencies_exactly(m, step, think_scale):
    # The device of the model has one fixed latency, and the null engine that service time.
    service = m["latency"][0]
    cols, parent, think = closed_loop(
        m["threads"], min(m["ios"], 15), think=lambda r: r.integers(0, m["think_max"] + 1),
        latency=lambda r: service, seed=m["seed"])
    ann, res = _replay_model(cols, service, step, think_scale)
    rows = np.arange(len(parent))
    chained = parent >= 0
    # Every row ran, each took the service time, and went no earlier than its due time ...
    assert (res["issue_ns"] >= 0).all() and (res["result"] == 4096).all()
    np.testing.assert_array_equal(res["complete_ns"] - res["issue_ns"], service)
    assert (res["issue_ns"] >= res["intended_ns"]).all()
    # ... which is exactly its parent's completion on the target plus the model's think time,
    # scaled; a thread's first I/O follows the last completion before it, or without one
    # keeps its captured time.
    scaled = np.floor(think[chained] * think_scale + 0.5).astype(np.int64)  # Rust rounds half up
    np.testing.assert_array_equal(res["intended_ns"][chained], res["complete_ns"][parent[chained]] + scaled)
    np.testing.assert_array_equal(ann["parent"][chained], (rows - parent)[chained])
    first = ~chained & (ann["parent"] > 0)
    scaled = np.floor(ann["think_ns"][first] * think_scale + 0.5).astype(np.int64)
    np.testing.assert_array_equal(res["intended_ns"][first],
                                  res["complete_ns"][rows[first] - ann["parent"][first]] + scaled)
    roots = ann["parent"] == 0
    np.testing.assert_array_equal(res["intended_ns"][roots], cols["ts_ns"][roots])


def test_causal_replay_of_a_bundled_trace_keeps_every_row_and_records_the_mode(tmp_path):
    out = tmp_path / "blob.parquet"
    done = replay_cli("run", "blob", "--engine", "null", "--timing", "causal", "-o", out, timeout=300)
    assert done.returncode == 0, done.stderr
    tf = open_trace(out)
    assert tf.metadata["run"]["mode"] == "causal" and tf.metadata["run"]["heuristic"] == "hybrid"
    from traces.trace import read_trace

    cols, _ = read_trace(out)
    from traces import library

    assert len(cols["op"]) == open_trace(library.resolve("blob")).num_rows
    assert (cols["issue_ns"] >= 0).all() and (cols["complete_ns"] >= cols["issue_ns"]).all()
    # The blob store spends most of its time thinking: with no device time at all (the null
    # engine) the replay still takes most of the captured span, and not more than it (+10 %).
    span = cols["complete_ns"].max() - cols["issue_ns"].min()
    captured = (cols["ts_ns"] + cols["latency_ns"]).max() - cols["ts_ns"].min()
    assert 0.5 * captured < span < 1.1 * captured


def test_causal_timing_refuses_a_trace_without_pid_or_latency_in_one_line(tmp_path):
    done = replay_cli("run", "demo", "--engine", "null", "--timing", "causal", "-o", tmp_path / "x.parquet")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "needs the columns pid and latency_ns" in lines[0] and "replay capture" in lines[0]
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.parametrize("extra,said", [(["--afap"], "exclude each other"),
                                        (["--workers", "2"], "one worker"),
                                        (["--read-only"], "--read-only")])
def test_causal_timing_refuses_options_it_cannot_honour(tmp_path, extra, said):
    done = replay_cli("run", "blob", "--engine", "null", "--timing", "causal", *extra, "-o", tmp_path / "x.parquet")
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_ctrl_c_in_a_causal_replay_keeps_every_completed_row(tmp_path):
    import glob
    import signal
    import time

    from tests.cli_process import replay_process, wait_for
    from traces.trace import read_trace

    out = tmp_path / "out.parquet"
    with replay_process("run", "oltp", "--engine", "null", "--timing", "causal", "--heuristic", "chains",
                        "-o", out, cwd=tmp_path) as proc:
        wait_for(proc, lambda: glob.glob(f"{out}.*.partial"), "the run's start")
        time.sleep(3)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    tf = open_trace(out)
    assert tf.metadata["interrupted"] is True
    cols, _ = read_trace(out)
    assert 0 < len(cols["op"]) < tf.metadata["trace"]["rows"]
    assert (cols["issue_ns"] >= 0).all() and (cols["complete_ns"] >= cols["issue_ns"]).all()


# -- the verdict speaks in application terms for causal replays ------------------------------

MS = 1_000_000


def _causal_results(path, name, device_ns, think_ns=MS, rows=1000, mode="causal"):
    """A hand-made results file of one closed chain: each I/O issued `think_ns` after the
    previous one completed, taking `device_ns`."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from traces.schema import METADATA_KEY

    issue = np.arange(rows, dtype=np.int64) * (device_ns + think_ns)
    columns = {"ts_ns": issue.copy(), "op": np.zeros(rows, np.uint8), "offset": np.arange(rows, dtype=np.int64) * 4096,
               "length": np.full(rows, 4096, np.int64), "intended_ns": issue, "issue_ns": issue,
               "complete_ns": issue + device_ns, "result": np.full(rows, 4096, np.int64)}
    meta = {"schema_version": 1, "kind": "results", "name": name, "interrupted": False,
            "run": {"mode": mode, "speed": 1.0, "qd": 1}, "trace": {"path": f"{name}.parquet", "rows": rows},
            "target": {"path": str(path.parent)}}
    pq.write_table(pa.table(columns).replace_schema_metadata({METADATA_KEY: json.dumps(meta).encode()}), path)
    return path


def _score_set(path, iops, run_file):
    import json
    import shutil

    path.mkdir()
    shutil.copy(run_file, path / "r70-qd32.parquet")
    (path / "results.json").write_text(json.dumps({
        "format": "tracereplay-results-set", "version": 1, "test": "mix", "target": {"path": path.name},
        "interrupted": False, "options": {}, "scores": {"iops_70_30_32x1": iops},
        "runs": [{"name": "r70-qd32", "file": "r70-qd32.parquet", "role": "measure", "parameters": {}}]}))
    return path


def test_the_verdict_gives_a_causal_replays_run_time_in_application_terms(tmp_path):
    from analysis.verdict import VerdictError, verdict

    for side in "ab":
        (tmp_path / side).mkdir()
    # 1,000 I/Os with 1 ms of the application's own time after each: 2 ms each on A, 0.5 ms on
    # B, so the application would run 1000 x 2 + 999 x 1 = 2,999 ms on A and 1,499 ms on B.
    _causal_results(tmp_path / "a" / "oltp.parquet", "oltp", 2 * MS)
    _causal_results(tmp_path / "b" / "oltp.parquet", "oltp", MS // 2)
    sa = _score_set(tmp_path / "mix-a", 1_000.0, tmp_path / "a" / "oltp.parquet")
    sb = _score_set(tmp_path / "mix-b", 16_000.0, tmp_path / "b" / "oltp.parquet")
    v = verdict([sa], [sb], [tmp_path / "a"], [tmp_path / "b"], "slow", "fast")
    (w,) = v.workloads
    assert (w.mode, w.primary) == ("causal", "finish")
    assert (w.a.finish_ns, w.b.finish_ns) == (2_999 * MS, 1_499 * MS)
    assert w.sentence == ("fast is 16.00x faster than slow on 70/30 QD32 (32 workers x QD1); oltp would "
                          f"finish 2.00x sooner on fast (causal replay): {w.share:.0%} of the synthetic advantage.")
    assert "  oltp          causal" in v.format_table()
    # One side causal, the other not: refused, saying how to replay.
    _causal_results(tmp_path / "b" / "oltp.parquet", "oltp", MS // 2, mode="original")
    with pytest.raises(VerdictError, match="causal timing on one target only"):
        verdict([sa], [sb], [tmp_path / "a"], [tmp_path / "b"])


def test_a_causal_replay_that_finishes_in_the_same_time_says_so_in_a_sentence(tmp_path):
    """An application paced by its own users (a rate, think time) runs as long on either
    drive; the sentence says so in words, and how much less its I/Os waited."""
    from analysis.verdict import verdict

    for side in "ab":
        (tmp_path / side).mkdir()
    # 1,000 I/Os, each 1 ms on A and 0.5 ms on B after 100 ms of the application's own time:
    # 100.999 s on A and 100.4995 s on B, 0.5 % apart; its I/Os wait 2x less on B.
    _causal_results(tmp_path / "a" / "blob.parquet", "blob", MS, think_ns=100 * MS)
    _causal_results(tmp_path / "b" / "blob.parquet", "blob", MS // 2, think_ns=100 * MS)
    sa = _score_set(tmp_path / "mix-a", 1_000.0, tmp_path / "a" / "blob.parquet")
    sb = _score_set(tmp_path / "mix-b", 16_000.0, tmp_path / "b" / "blob.parquet")
    (w,) = verdict([sa], [sb], [tmp_path / "a"], [tmp_path / "b"], "slow", "fast").workloads
    assert w.answer == "no"
    assert w.sentence == ("fast is 16.00x faster than slow on 70/30 QD32 (32 workers x QD1); blob would "
                          "finish within 5% of the same time on either (causal replay), though its I/Os "
                          "wait 2.00x less on fast: the advantage does not show in its run time.")


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


@pytest.mark.root
@pytest.mark.loopdev
def test_causal_replay_on_the_capturing_drive_reproduces_the_application_time(tmp_path, loop_device):
    # The BLOB store (two clients contending on SQLite, so its sleeps are recorded and used),
    # captured twice on one loop device (their difference is the noise), then the first
    # capture replayed causally on that device: its I/O span is the captured one's within the
    # noise or 25 %. (Not the file copy: cp's own CPU time is not in its trace, and on a fast
    # drive its replay runs 22-34 % short, as docs/benchmarks.md says.)
    from replay.runner import RunOptions, replay
    from traces.capture.recipes import load
    from traces.trace import read_trace

    dev = loop_device(1024 << 20)
    spans = []
    for k in range(2):
        out = tmp_path / f"blob{k}.parquet"
        load("blob").run(dev, out, notices=[], ops=300, populate_mb=64, clients=2, memory_mb=128,
                         destroy_data=True)
        cols, _ = read_trace(out)
        spans.append((cols["ts_ns"] + cols["latency_ns"]).max() - cols["ts_ns"].min())
    noise = abs(spans[0] - spans[1]) / min(spans)
    res = tmp_path / "replay.parquet"
    replay(tmp_path / "blob0.parquet", dev, RunOptions(causal=True, destroy_data=True, remap="wrap"), output=res)
    cols, meta = read_trace(res)
    assert meta["run"]["mode"] == "causal"
    span = cols["complete_ns"].max() - cols["issue_ns"].min()
    assert abs(span - spans[0]) / spans[0] <= max(noise, 0.25), (span, spans)


# -- the replayer's own time per hop, measured on the target and taken off think times -------

def test_pair_costs_are_the_median_gap_after_each_op_pair():
    from replay.calibrate import PATTERN, pair_costs
    from traces.schema import Op

    # A chain of the probe pattern where op b reaches the device `want[a, b]` ns after op a
    # completed (plus 1 us of jitter on every fourth hop, which the median ignores).
    want = {(a, b): 1_000 * (1 + 3 * a + b) for a in (0, 1, 3) for b in (0, 1, 3)}
    op = np.tile(np.array(PATTERN, np.uint8), 20)
    lat = np.full(len(op), 7_000, np.int64)
    ts = np.zeros(len(op), np.int64)
    for k in range(1, len(op)):
        ts[k] = ts[k - 1] + lat[k - 1] + want[int(op[k - 1]), int(op[k])] + (1_000 if k % 4 == 0 else 0)
    host = pair_costs(ts, op, lat)
    for (a, b), gap in want.items():
        assert host[a, b] == gap, (a, b)
    assert (host[Op.DISCARD, :] == host[Op.WRITE, :]).all() and (host[:, Op.DISCARD] == host[:, Op.WRITE]).all()


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


def _chain_trace(path, op, step_ns=100_000, latency_ns=50_000):
    """One process's chain of 4 KiB I/Os of `op` (an array), each issued `step_ns` after the one
    before, which took `latency_ns`: think time step - latency."""
    n = len(op)
    rows = np.arange(n, dtype=np.int64)
    write_trace(path, {"ts_ns": rows * step_ns, "op": np.asarray(op, np.uint8), "offset": rows * 4096,
                       "length": np.full(n, 4096, np.int64), "latency_ns": np.full(n, latency_ns, np.int64),
                       "pid": np.ones(n, np.int32)}, {"name": path.stem})
    return path


@pytest.mark.root
@pytest.mark.loopdev
def test_a_causal_replay_measures_the_replayers_own_time_per_io_on_a_block_device(tmp_path, loop_device):
    from replay.runner import RunOptions, replay
    from traces.schema import Op
    from traces.trace import read_trace

    dev = loop_device(64 << 20)
    rows = np.arange(300)
    trace = _chain_trace(tmp_path / "chain.parquet", np.where(rows % 3 == 2, Op.WRITE, Op.READ), 200_000, 100_000)
    notices = []
    replay(trace, dev, RunOptions(causal=True, destroy_data=True), output=tmp_path / "r.parquet", notices=notices)
    cols, meta = read_trace(tmp_path / "r.parquet")
    host = np.array(meta["run"]["host_cost_ns"])
    # Every pair of read, write and flush was measured: a real gap, above 0 and under 10 ms.
    for a in (Op.READ, Op.WRITE, Op.FLUSH):
        for b in (Op.READ, Op.WRITE, Op.FLUSH):
            assert 0 < host[a, b] < 10_000_000, (a, b, host)
    assert any("the replayer's own time per I/O on " + dev in n for n in notices), notices
    # Each chained I/O is due at its parent's completion plus 100 us of think, less the cost.
    parent_done = cols["complete_ns"][:-1]
    cost = host[cols["op"][:-1], cols["op"][1:]]
    assert (cols["intended_ns"][1:] == parent_done + np.maximum(100_000 - cost, 0)).all()
    # Without calibration, the think time is replayed as captured.
    replay(trace, dev, RunOptions(causal=True, destroy_data=True, calibrate=False), output=tmp_path / "p.parquet")
    cols, meta = read_trace(tmp_path / "p.parquet")
    assert meta["run"]["host_cost_ns"] is None
    assert (cols["intended_ns"][1:] == cols["complete_ns"][:-1] + 100_000).all()


def test_a_causal_replay_on_a_file_says_its_think_times_are_replayed_as_captured(tmp_path):
    from replay.runner import RunOptions, replay
    from traces.trace import read_trace

    target = tmp_path / "t.img"
    target.write_bytes(b"\0" * (4 << 20))
    trace = _chain_trace(tmp_path / "chain.parquet", np.zeros(20))
    notices = []
    replay(trace, target, RunOptions(causal=True), output=tmp_path / "r.parquet", notices=notices)
    assert read_trace(tmp_path / "r.parquet")[1]["run"]["host_cost_ns"] is None
    assert any("replayed as captured" in n for n in notices), notices


@pytest.mark.root
@pytest.mark.loopdev
def test_a_causal_replay_of_a_trace_that_only_reads_never_writes_probes(tmp_path, loop_device):
    # The probes write the target's first 2 MiB; a trace that only reads was never cleared to
    # write (a mounted or partitioned disk replays its reads), so nothing is measured.
    from replay.runner import RunOptions, replay
    from traces.trace import read_trace

    dev = loop_device(8 << 20)
    pattern = bytes(range(256)) * (8 << 12)
    with open(dev, "r+b") as f:
        f.write(pattern)
    trace = _chain_trace(tmp_path / "reads.parquet", np.zeros(30))
    notices = []
    replay(trace, dev, RunOptions(causal=True), output=tmp_path / "r.parquet", notices=notices)
    assert read_trace(tmp_path / "r.parquet")[1]["run"]["host_cost_ns"] is None
    assert any("does not write" in n for n in notices), notices
    with open(dev, "rb") as f:
        assert f.read(len(pattern)) == pattern
