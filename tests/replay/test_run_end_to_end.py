"""`replay run` end to end through the library entry `replay()`: real traces, real I/O on
regular files and loop devices, the results file and its metadata, and the refusals.
"""
import dataclasses
import errno
import glob
import hashlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_process import replay_process, wait_for
from replay.runner import RunOptions, replay
from traces import library
from traces.errors import ReplayError, TargetError, UnsafeTargetError
from traces.schema import RESULT_COLUMNS, Op
from traces.trace import open_trace, read_trace, write_trace

MIB = 1 << 20
KIB = 1 << 10
R, W, D, F = Op.READ, Op.WRITE, Op.DISCARD, Op.FLUSH


def _io_uring_refusal() -> str | None:
    """Why io_uring cannot run here (a seccomp profile, an old kernel), or None."""
    from native import _engine

    with tempfile.NamedTemporaryFile() as f:
        f.truncate(4096)
        try:
            _engine.Replayer(f.name, engine="io_uring", depth=1, direct=False).join()
        except OSError as e:
            return f"needs io_uring ({errno.errorcode.get(e.errno, e.errno)}: {e})"
    return None


_why_no_uring = _io_uring_refusal()
uring = [pytest.mark.uring, pytest.mark.skipif(_why_no_uring is not None, reason=str(_why_no_uring))]
on_loop = [pytest.mark.root, pytest.mark.loopdev]


def needs(tool):
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"needs {tool}")


def marks(*groups):
    """Apply several lists of marks to a test."""
    def apply(fn):
        for group in groups:
            for m in group if isinstance(group, list) else [group]:
                fn = m(fn)
        return fn
    return apply


def make_trace(path, rows, **columns):
    """Write a trace from (ts_ns, op, offset, length) rows, plus any optional columns."""
    ts, op, offset, length = (np.array(c) for c in zip(*rows))
    write_trace(path, {"ts_ns": ts.astype(np.int64), "op": op.astype(np.uint8),
                       "offset": offset.astype(np.int64), "length": length.astype(np.int64),
                       **columns}, {"name": path.stem})
    return path


def make_file(path, size, fill=None):
    """A target file of `size` bytes: sparse zeros, or `fill` repeated."""
    with open(path, "wb") as f:
        if fill is None:
            f.truncate(size)
        else:
            f.write((fill * (size // len(fill) + 1))[:size])
    return str(path)


def pread(path, offset, length) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def results(outcome):
    """(columns, metadata) of a run's results file, after the checks every run must pass."""
    cols, meta = read_trace(outcome.output)
    assert len(cols["op"]) == outcome.rows == meta["rows_done"]
    assert np.all(cols["issue_ns"] >= 0)
    assert np.all(cols["complete_ns"] >= cols["issue_ns"])
    assert meta["kind"] == "results" and meta["interrupted"] is False
    assert meta["summary"]["tracereplay"]["total_ios"] == outcome.rows
    return cols, meta


def half_away(x):
    """Round half away from zero, as the engine does (numpy's round is half to even)."""
    floor = np.floor(x)
    return (floor + (x - floor >= 0.5)).astype(np.int64)


# ---- the null engine: the whole pipeline, no device --------------------------------------


def test_null_engine_replays_the_demo_trace_row_for_row(tmp_path):
    trace, _ = read_trace(library.resolve("demo"))
    speed = 50.0  # the demo lasts 10 s of trace time; 0.2 s here
    outcome = replay("demo", None, RunOptions(engine="null", speed=speed),
                     output=tmp_path / "demo-null.parquet")
    cols, meta = results(outcome)
    assert list(cols) == list(trace) + list(RESULT_COLUMNS)
    for name in trace:
        np.testing.assert_array_equal(cols[name], trace[name], err_msg=name)
    np.testing.assert_array_equal(cols["intended_ns"], half_away(trace["ts_ns"] / speed))
    assert np.all(cols["issue_ns"] >= cols["intended_ns"])
    expected = np.where(trace["op"] == F, 0, trace["length"])
    np.testing.assert_array_equal(cols["result"], expected)
    assert meta["run"]["engine"] == "null" and meta["run"]["mode"] == "original"
    assert meta["run"]["speed"] == speed
    assert meta["target"]["kind"] == "null"
    assert meta["trace"]["metadata"]["name"] == "demo"
    job = meta["summary"]["jobs"][0]
    assert job["read"]["total_ios"] == np.count_nonzero(trace["op"] == R)
    assert job["write"]["total_ios"] == np.count_nonzero(trace["op"] == W)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gaps=st.lists(st.integers(0, 200_000), min_size=1, max_size=40),
       speed=st.floats(0.5, 64.0))
def test_deadlines_are_monotone_and_never_run_early(tmp_path, gaps, speed):
    ts = np.cumsum(gaps)
    trace = make_trace(tmp_path / "t.parquet", [(t, R, 0, 4096) for t in ts])
    # force: hypothesis runs every example in the same tmp_path.
    cols, _ = results(replay(trace, None, RunOptions(engine="null", speed=speed, force=True),
                             output=tmp_path / "out.parquet"))
    assert np.all(np.diff(cols["intended_ns"]) >= 0)
    assert np.all(cols["issue_ns"] >= cols["intended_ns"])
    np.testing.assert_allclose(cols["intended_ns"], ts / speed, atol=1)


@pytest.mark.parametrize("speed", [1.0, 2.0])
def test_original_timing_is_due_at_ts_over_speed(tmp_path, speed):
    # Odd timestamps: at speed 2 they fall on a half nanosecond and must round away from 0.
    rows = [(i * 1_000_001 + i % 2, [R, W, F, D][i % 4], i * 4096, 0 if i % 4 == 2 else 4096)
            for i in range(40)]
    pid = np.arange(40, dtype=np.int32) + 100
    trace = make_trace(tmp_path / "t.parquet", rows, pid=pid)
    outcome = replay(trace, None, RunOptions(engine="null", speed=speed),
                     output=tmp_path / "out.parquet")
    cols, meta = results(outcome)
    assert list(cols) == ["ts_ns", "op", "offset", "length", "pid", *RESULT_COLUMNS]
    np.testing.assert_array_equal(cols["pid"], pid)
    ts = cols["ts_ns"]
    expected = ts if speed == 1.0 else (ts + 1) // 2
    np.testing.assert_array_equal(cols["intended_ns"], expected)
    assert np.all(cols["issue_ns"] >= cols["intended_ns"])
    assert meta["run"]["mode"] == "original"


def test_afap_ignores_the_trace_timing(tmp_path):
    rows = [(i * 1_000_000_000, R, i * 4096, 4096) for i in range(1000)]  # 1000 s of trace
    trace = make_trace(tmp_path / "slow.parquet", rows)
    outcome = replay(trace, None, RunOptions(engine="null", timing="afap", qd=8),
                     output=tmp_path / "out.parquet")
    cols, meta = results(outcome)
    assert len(cols["op"]) == 1000
    assert meta["run"]["mode"] == "afap"
    # Issued when a slot was free, not when the trace said: the whole run, by its own
    # clock, takes a sliver of the trace's 1000 s.
    assert cols["complete_ns"].max() < rows[-1][0] // 100
    assert np.all(cols["intended_ns"] < cols["ts_ns"][-1] // 100)


# ---- io_uring and psync on files and loop devices ----------------------------------------

WRITES = [(i * 200_000, W, i * 64 * KIB, 16 * KIB) for i in range(8)] + [(1_700_000, F, 0, 0)]
READS = [(i * 200_000, R, i * 64 * KIB, 16 * KIB) for i in range(8)]


def _write_then_read(tmp_path, target, engine="io_uring", data="random"):
    """Replay WRITES then READS on `target`; returns the two result columns and metadata."""
    options = RunOptions(engine=engine, data=data)
    writes = replay(make_trace(tmp_path / "w.parquet", WRITES), target, options,
                    output=tmp_path / f"w-{engine}.parquet")
    wcols, wmeta = results(writes)
    reads = replay(make_trace(tmp_path / "r.parquet", READS), target, options,
                   output=tmp_path / f"r-{engine}.parquet")
    rcols, _ = results(reads)
    return wcols, rcols, wmeta


def _check_written(target, data, background):
    """Every write of WRITES landed with the `data` pattern; the bytes after each, which no
    write touches, still hold `background`."""
    for _, op, offset, length in WRITES:
        if op != W:
            continue
        written = pread(target, offset, length)
        if data == "zeros":
            assert written == bytes(length), f"the write at {offset} did not carry zeros"
        else:
            assert written.count(0) < length // 2, f"the write at {offset} did not land"
        assert pread(target, offset + length, 4096) == background * 4096, \
            f"bytes after the write at {offset} changed"


def _check_transfers(wcols, rcols):
    is_write = wcols["op"] == W
    assert is_write.sum() == 8
    np.testing.assert_array_equal(wcols["result"][is_write], wcols["length"][is_write])
    np.testing.assert_array_equal(wcols["result"][wcols["op"] == F], 0)
    np.testing.assert_array_equal(rcols["result"], rcols["length"])


# The target starts as zeros for random data, as ones for zeros (so zeros written show).
BACKGROUND = {"random": b"\0", "zeros": b"\1"}


@marks(uring)
@pytest.mark.parametrize("data", ["random", "zeros"])
def test_io_uring_writes_and_reads_land_on_a_file(tmp_path, data):
    target = make_file(tmp_path / "disk.img", 1 * MIB, fill=BACKGROUND[data])
    wcols, rcols, meta = _write_then_read(tmp_path, target, data=data)
    assert meta["run"]["engine"] == "io_uring" and meta["run"]["data"] == data
    assert meta["target"]["kind"] == "file"
    _check_transfers(wcols, rcols)
    _check_written(target, data, BACKGROUND[data])


@marks(uring, on_loop)
@pytest.mark.parametrize("data", ["random", "zeros"])
def test_io_uring_writes_and_reads_land_on_a_loop_device(tmp_path, loop_device, data):
    device = loop_device(4 * MIB)
    with open(device, "r+b") as f:
        f.write(BACKGROUND[data] * (1 * MIB))
        os.fsync(f.fileno())
    wcols, rcols, meta = _write_then_read(tmp_path, device, data=data)
    assert meta["run"]["engine"] == "io_uring" and meta["target"]["kind"] == "block"
    assert meta["run"]["direct"] is True
    _check_transfers(wcols, rcols)
    _check_written(device, data, BACKGROUND[data])


DISCARD_TRACE = [(0, W, 0, 64 * KIB), (100_000, D, 128 * KIB, 64 * KIB),
                 (200_000, F, 0, 0), (300_000, R, 256 * KIB, 64 * KIB)]


@marks(uring)
def test_a_discard_on_a_file_punches_a_hole(tmp_path):
    target = make_file(tmp_path / "disk.img", 1 * MIB, fill=b"\xa5")
    outcome = replay(make_trace(tmp_path / "d.parquet", DISCARD_TRACE), target,
                     RunOptions(), output=tmp_path / "out.parquet")
    cols, _ = results(outcome)
    np.testing.assert_array_equal(cols["result"], [64 * KIB, 64 * KIB, 0, 64 * KIB])
    assert pread(target, 128 * KIB, 64 * KIB) == bytes(64 * KIB)
    assert pread(target, 192 * KIB, 4096) == b"\xa5" * 4096
    assert pread(target, 124 * KIB, 4096) == b"\xa5" * 4096


@marks(uring, on_loop)
@pytest.mark.parametrize("engine", ["io_uring", "psync"])
def test_a_discard_on_a_loop_device_succeeds_or_is_recorded(tmp_path, loop_device, engine):
    device = loop_device(4 * MIB)
    outcome = replay(make_trace(tmp_path / "d.parquet", DISCARD_TRACE), device,
                     RunOptions(engine=engine), output=tmp_path / "out.parquet")
    cols, meta = results(outcome)
    assert meta["run"]["engine"] == engine
    discard = cols["result"][1]
    assert discard == 64 * KIB or discard < 0, f"discard gave {discard}"
    np.testing.assert_array_equal(cols["result"][[0, 2, 3]], [64 * KIB, 0, 64 * KIB])


def _mixed_trace(path):
    rows = []
    for i in range(24):
        op = [W, R, W, D, R, F][i % 6]
        rows.append((i * 50_000, op, 0 if op == F else (i * 37 % 16) * 32 * KIB,
                     0 if op == F else (4 + i % 3 * 4) * KIB))
    return make_trace(path, rows)


@marks(uring)
def test_psync_gives_the_same_results_as_io_uring_on_a_file(tmp_path):
    trace = _mixed_trace(tmp_path / "mixed.parquet")
    got = {}
    for engine in ("io_uring", "psync"):
        target = make_file(tmp_path / f"{engine}.img", 1 * MIB)
        cols, meta = results(replay(trace, target, RunOptions(engine=engine),
                                    output=tmp_path / f"{engine}.parquet"))
        assert meta["run"]["engine"] == engine
        got[engine] = cols
    np.testing.assert_array_equal(got["psync"]["result"], got["io_uring"]["result"])
    np.testing.assert_array_equal(got["psync"]["offset"], got["io_uring"]["offset"])
    assert np.all(got["psync"]["result"] >= 0)


IO_URING_DISABLED = "/proc/sys/kernel/io_uring_disabled"


@pytest.fixture
def io_uring_refused():
    """io_uring refused with EPERM for every process, as Docker's seccomp profile does, via the
    kernel's own switch (Linux 6.6+, root); restored whatever happens."""
    if not os.access(IO_URING_DISABLED, os.W_OK):
        pytest.skip(f"needs root and {IO_URING_DISABLED} (Linux 6.6+) to refuse io_uring")
    with open(IO_URING_DISABLED) as f:
        before = f.read().strip()
    with open(IO_URING_DISABLED, "w") as f:
        f.write("2")
    try:
        yield
    finally:
        with open(IO_URING_DISABLED, "w") as f:
            f.write(before)


@pytest.mark.root
def test_io_uring_refused_falls_back_to_psync_with_a_notice(tmp_path, io_uring_refused):
    trace = _mixed_trace(tmp_path / "mixed.parquet")
    target = make_file(tmp_path / "t.img", 1 * MIB)
    notices = []
    cols, meta = results(replay(trace, target, RunOptions(engine="io_uring"),
                                output=tmp_path / "out.parquet", notices=notices))
    assert meta["run"]["engine"] == "psync"
    assert any("io_uring is refused here (EPERM)" in n and "psync" in n for n in notices)
    assert np.all(cols["result"] >= 0)


@marks(uring, on_loop)
def test_psync_gives_the_same_results_as_io_uring_on_a_loop_device(tmp_path, loop_device):
    trace = _mixed_trace(tmp_path / "mixed.parquet")
    device = loop_device(4 * MIB)
    got = {}
    for engine in ("io_uring", "psync"):
        cols, meta = results(replay(trace, device, RunOptions(engine=engine),
                                    output=tmp_path / f"{engine}.parquet"))
        assert meta["run"]["engine"] == engine
        got[engine] = cols
    np.testing.assert_array_equal(got["psync"]["result"], got["io_uring"]["result"])
    reads_writes = np.isin(got["psync"]["op"], [R, W])
    np.testing.assert_array_equal(got["psync"]["result"][reads_writes],
                                  got["psync"]["length"][reads_writes])


@marks(uring, on_loop)
def test_a_block_device_is_released_when_the_run_returns(tmp_path, loop_device):
    device = loop_device(4 * MIB)
    trace = make_trace(tmp_path / "r.parquet", [(0, R, 0, 4096)])
    # Dropping a ring frees it in a kernel worker; before the engine unregistered its
    # files first, the claim outlived ~29 runs in 30 by 10-30 ms. Three runs make it certain.
    for attempt in range(3):
        replay(trace, device, RunOptions(engine="io_uring"), output=tmp_path / f"out{attempt}.parquet")
        os.close(os.open(device, os.O_RDONLY | os.O_EXCL))  # EBUSY while still claimed


# ---- input the run must refuse or fit ----------------------------------------------------


def test_a_trace_larger_than_the_target_is_refused_with_both_sizes(tmp_path):
    target = make_file(tmp_path / "small.img", 1 * MIB)
    trace = make_trace(tmp_path / "big.parquet", [(0, R, 0, 4096), (1, R, 3 * MIB, 8192)])
    with pytest.raises(TargetError) as err:
        replay(trace, target, RunOptions(engine="psync"), output=tmp_path / "out.parquet")
    message = str(err.value)
    assert str(3 * MIB + 8192) in message and str(1 * MIB) in message
    assert "--remap" in message
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize("mode", ["wrap", "scale"])
def test_remap_keeps_every_io_inside_the_target(tmp_path, mode):
    size = 1 * MIB
    target = make_file(tmp_path / "small.img", size)
    rng = np.random.default_rng(7)
    offsets = np.sort(rng.integers(0, 64 * MIB // 4096, 50)) * 4096
    offsets[-1] = 64 * MIB - 8192  # the last I/O ends at the trace's span
    rows = [(i * 10_000, [R, W][i % 2], int(o), 8192) for i, o in enumerate(offsets)]
    outcome = replay(make_trace(tmp_path / "wide.parquet", rows), target,
                     RunOptions(remap=mode, engine="psync"), output=tmp_path / "out.parquet")
    cols, meta = results(outcome)
    assert meta["run"]["remap"] == mode
    assert np.all(cols["offset"] >= 0)
    assert np.all(cols["offset"] + cols["length"] <= size)
    np.testing.assert_array_equal(cols["length"], 8192)
    np.testing.assert_array_equal(cols["result"], 8192)
    assert os.path.getsize(target) == size  # nothing was written past the end


@marks(uring, on_loop)
def test_a_misaligned_trace_is_aligned_to_the_device_blocks_with_a_notice(tmp_path, loop_device):
    device = loop_device(4 * MIB)
    rows = [(0, W, 100, 1000), (10_000, R, 4096, 4096), (20_000, R, 513, 511),
            (30_000, W, 8192, 700), (40_000, R, 1 * MIB, 512)]
    notices = []
    outcome = replay(make_trace(tmp_path / "odd.parquet", rows), device, RunOptions(),
                     output=tmp_path / "out.parquet", notices=notices)
    cols, meta = results(outcome)
    assert np.all(cols["offset"] % 512 == 0) and np.all(cols["length"] % 512 == 0)
    np.testing.assert_array_equal(cols["result"], cols["length"])
    for (_, _, offset, length), new_offset, new_length in zip(rows, cols["offset"], cols["length"]):
        assert new_offset <= offset and offset + length <= new_offset + new_length
    assert meta["aligned_ios"] == 3
    assert "aligned 3 I/Os to the target's 512-byte blocks" in notices


def _ext4(device):
    subprocess.run(["mkfs.ext4", "-q", "-F", device], check=True, capture_output=True)
    return device


WRITE_AND_READ = [(0, W, 1 * MIB, 4096), (10_000, R, 0, 4096), (20_000, R, 2 * MIB, 8192)]


@marks(uring, on_loop, needs("mkfs.ext4"))
def test_a_filesystem_is_refused_for_writes_but_not_read_only_or_destroy_data(tmp_path, loop_device):
    device = _ext4(loop_device(8 * MIB))
    trace = make_trace(tmp_path / "wr.parquet", WRITE_AND_READ)
    before = digest(device)
    with pytest.raises(UnsafeTargetError, match="ext4"):
        replay(trace, device, RunOptions(), output=tmp_path / "refused.parquet")
    assert not (tmp_path / "refused.parquet").exists()
    assert digest(device) == before

    notices = []
    cols, meta = results(replay(trace, device, RunOptions(read_only=True),
                                output=tmp_path / "ro.parquet", notices=notices))
    np.testing.assert_array_equal(cols["op"], [R, R])
    np.testing.assert_array_equal(cols["result"], [4096, 8192])
    assert meta["run"]["read_only"] is True
    assert "--read-only: skipping 1 writes, discards and flushes" in notices
    assert digest(device) == before

    cols, _ = results(replay(trace, device, RunOptions(destroy_data=True),
                             output=tmp_path / "dd.parquet"))
    np.testing.assert_array_equal(cols["result"], [4096, 4096, 8192])
    assert digest(device) != before


# A read-only replay on a mounted device runs: tests/engine/test_boundary.py.
@marks(on_loop, needs("mkfs.ext4"))
def test_a_mounted_device_is_refused_even_with_destroy_data(tmp_path, loop_device, mounted):
    device = _ext4(loop_device(8 * MIB))
    mounted(device)
    trace = make_trace(tmp_path / "wr.parquet", WRITE_AND_READ)
    with pytest.raises(ReplayError, match=r"busy: it is mounted"):
        replay(trace, device, RunOptions(destroy_data=True), output=tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


@marks(uring, on_loop)
@pytest.mark.parametrize("write", [False, True], ids=["reads", "writes"])
def test_a_claim_that_outlives_its_run_is_waited_for(tmp_path, loop_device, write):
    # io_uring releases a run's registered file asynchronously: the next run on the device
    # may find it still claimed for a few ms. Here a claim held 0.2 s stands in for it.
    device = loop_device(4 * MIB)
    trace = make_trace(tmp_path / "t.parquet", WRITES if write else READS)
    replay(trace, device, RunOptions(), output=tmp_path / "first.parquet")  # warm: the next starts fast
    claim = os.open(device, os.O_RDONLY | os.O_EXCL)
    threading.Timer(0.3, os.close, [claim]).start()
    cols, _ = results(replay(trace, device, RunOptions(), output=tmp_path / "out.parquet"))
    assert np.all(cols["result"][cols["op"] != F] == 16 * KIB)


@marks(uring)
def test_read_only_replays_only_the_reads_and_leaves_the_target_unchanged(tmp_path):
    target = make_file(tmp_path / "disk.img", 1 * MIB, fill=b"tracereplay")
    rows = [(0, W, 0, 8192), (1000, R, 8192, 4096), (2000, D, 16384, 4096),
            (3000, F, 0, 0), (4000, R, 0, 8192)]
    before = digest(target)
    cols, meta = results(replay(make_trace(tmp_path / "t.parquet", rows), target,
                                RunOptions(read_only=True), output=tmp_path / "out.parquet"))
    assert digest(target) == before
    np.testing.assert_array_equal(cols["op"], [R, R])
    np.testing.assert_array_equal(cols["offset"], [8192, 0])
    np.testing.assert_array_equal(cols["result"], [4096, 8192])
    assert meta["summary"]["jobs"][0]["write"]["total_ios"] == 0


def test_dry_run_checks_then_issues_nothing(tmp_path):
    target = make_file(tmp_path / "disk.img", 1 * MIB, fill=b"\x5a")
    before = digest(target)
    trace = make_trace(tmp_path / "t.parquet", [(0, W, 0, 4096), (1, D, 4096, 4096), (2, F, 0, 0)])
    outcome = replay(trace, target, RunOptions(dry_run=True), output=tmp_path / "out.parquet")
    assert outcome.output is None and outcome.rows == 0
    assert outcome.summary.total().ios == 0
    assert outcome.target.path == target and outcome.target.size == 1 * MIB
    assert not (tmp_path / "out.parquet").exists()
    assert not glob.glob(str(tmp_path / "*.partial"))
    assert digest(target) == before
    # A dry run still checks: a trace the target cannot hold is refused.
    big = make_trace(tmp_path / "big.parquet", [(0, R, 2 * MIB, 4096)])
    with pytest.raises(TargetError, match="spans"):
        replay(big, target, RunOptions(dry_run=True))


def test_an_unknown_engine_is_refused(tmp_path):
    trace = make_trace(tmp_path / "t.parquet", [(0, R, 0, 4096)])
    with pytest.raises(ReplayError, match=r"unknown engine 'spdk'.*io_uring, psync, null"):
        replay(trace, None, RunOptions(engine="spdk"), output=tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


# ---- Ctrl-C ------------------------------------------------------------------------------


def test_ctrl_c_saves_the_rows_done_and_exits_130(tmp_path):
    n = 300
    rows = [(i * 100_000_000, R, (i % 64) * 4096, 4096) for i in range(n)]  # 30 s of trace
    trace = make_trace(tmp_path / "long.parquet", rows)
    target = make_file(tmp_path / "disk.img", 1 * MIB)
    out = tmp_path / "out.parquet"
    with replay_process("run", trace, target, "-o", out, cwd=tmp_path) as proc:
        # The results file is opened (as OUT.*.partial) once the engine runs: from then on,
        # let it replay about 2 s of the trace before the Ctrl-C.
        wait_for(proc, lambda: glob.glob(f"{out}.*.partial"), "the run's start")
        time.sleep(2)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr and "Traceback" not in stdout
    said = [line for line in stderr.splitlines() if "interrupted" in line]
    assert len(said) == 1, stderr
    assert str(out) in said[0]

    trace_file = open_trace(out)
    assert trace_file.metadata["interrupted"] is True
    cols, _ = read_trace(out)
    done = len(cols["op"])
    assert 0 < done < n
    assert trace_file.metadata["rows_done"] == done
    np.testing.assert_array_equal(cols["ts_ns"], [r[0] for r in rows[:done]])
    np.testing.assert_array_equal(cols["offset"], [r[2] for r in rows[:done]])
    assert np.all(cols["intended_ns"] == cols["ts_ns"])
    assert np.all(cols["issue_ns"] >= cols["intended_ns"])
    assert np.all(cols["complete_ns"] >= cols["issue_ns"])
    np.testing.assert_array_equal(cols["result"], 4096)


# ---- a driver that runs I/O on the submitting CPU ------------------------------------------


def _random_ios(path, n, span, read_share=1.0, gap_ns=1, seed=3):
    """`n` 4 KiB I/Os at random offsets below `span`, `gap_ns` apart; reads with probability
    `read_share`, else writes."""
    rng = np.random.default_rng(seed)
    offsets = rng.integers(0, span // (4 * KIB), n) * 4 * KIB
    ops = np.where(rng.random(n) < read_share, R, W)
    return make_trace(path, [(i * gap_ns, int(op), int(o), 4 * KIB) for i, (op, o) in enumerate(zip(ops, offsets))])


@marks(uring, on_loop)
@pytest.mark.parametrize("timing", ["afap", "original"])
def test_a_driver_that_runs_io_on_the_submitting_cpu_gets_psync_threads(tmp_path, zram, loop_device, timing):
    # zram does each I/O inside the submitting call, which io_uring cannot make without
    # blocking: it would hand every one to a kernel worker thread.
    trace = _random_ios(tmp_path / "mix.parquet", 5000, 16 * MIB, read_share=0.7, gap_ns=20_000)
    opts = RunOptions(timing=timing, qd=32, speed=20.0, destroy_data=True)
    on_zram = replay(trace, zram, opts, output=tmp_path / "zram.parquet")
    cols, meta = results(on_zram)
    assert meta["target"]["sync_driver"] is True and meta["run"]["engine"] == on_zram.engine == "psync"
    assert any("runs each I/O on the CPU that submits it" in n for n in on_zram.notices)
    assert 0 < on_zram.engine_cpu_s == meta["engine_cpu_s"]  # the engine thread's own CPU
    np.testing.assert_array_equal(cols["result"], 4 * KIB)
    assert np.all(cols["intended_ns"] <= cols["issue_ns"]) and np.all(cols["issue_ns"] < cols["complete_ns"])
    # A blk-mq device takes the I/O from the engine thread through io_uring.
    on_loop_device = replay(trace, loop_device(16 * MIB), opts, output=tmp_path / "loop.parquet")
    cols, meta = results(on_loop_device)
    assert meta["target"]["sync_driver"] is False and meta["run"]["engine"] == on_loop_device.engine == "io_uring"
    assert not any("CPU that submits it" in n for n in on_loop_device.notices)
    np.testing.assert_array_equal(cols["result"], 4 * KIB)
    # An engine asked for is the engine used.
    asked = replay(trace, zram, dataclasses.replace(opts, engine="io_uring"), output=tmp_path / "asked.parquet")
    assert asked.engine == "io_uring" and not any("CPU that submits it" in n for n in asked.notices)
    np.testing.assert_array_equal(results(asked)[0]["result"], 4 * KIB)


# ---- a small trace is replayed from memory -------------------------------------------------


def test_a_small_trace_replays_from_memory_as_from_the_file(tmp_path, monkeypatch):
    from replay import sources

    trace = _random_ios(tmp_path / "reads.parquet", 3000, 64 * MIB)
    cached = sources.TraceSource(trace, rows=256)
    monkeypatch.setattr(sources, "CACHE_BYTES", 3000 * 25 - 1)  # one byte short of the columns
    streamed = sources.TraceSource(trace, rows=256)
    assert cached._cache is not None and streamed._cache is None
    target = make_file(tmp_path / "small.img", 16 * MIB)
    opts = RunOptions(engine="null", timing="afap", remap="wrap", chunk_rows=256)
    runs = [results(replay(streamed, target, opts, output=tmp_path / "streamed.parquet"))[0]]
    trace.unlink()  # the kept trace needs no file
    # The second replay of the kept chunks sees them unchanged by the first one's remapping.
    runs += [results(replay(cached, target, opts, output=tmp_path / f"{i}.parquet"))[0] for i in range(2)]
    for cols in runs:
        assert np.all(cols["offset"] < 16 * MIB)
        for name in ("ts_ns", "op", "offset", "length"):
            assert np.array_equal(cols[name], runs[0][name])


# ---- workers start together; progress from the first I/O; failed I/Os ----------------------


def test_many_workers_start_together_so_start_up_is_not_lateness(tmp_path):
    # Workers used to be built and fed one after another against a start taken before the
    # first was built: 32 workers recorded 370 ms of lateness on a 99 ms trace.
    trace = make_trace(tmp_path / "t.parquet", [(i * 30_000, R, (i % 256) * 4096, 4096) for i in range(3300)])
    cols, meta = results(replay(trace, None, RunOptions(engine="null", workers=32), output=tmp_path / "out.parquet"))
    assert meta["run"]["workers"] == 32
    lateness = cols["issue_ns"] - cols["intended_ns"]
    assert np.median(lateness) < 20_000_000, f"p50 lateness {np.median(lateness) / 1e6:.1f} ms"


def test_progress_comes_several_times_a_second_from_the_first_io(tmp_path):
    # 6,000 rows over 1.2 s: a single chunk, which used to show nothing until the end.
    n = 6000
    trace = make_trace(tmp_path / "t.parquet", [(i * 200_000, R, (i % 256) * 4096, 4096) for i in range(n)])
    calls = []
    replay(trace, None, RunOptions(engine="null"), output=tmp_path / "out.parquet",
           progress=lambda done, total, elapsed: calls.append((done, total, elapsed)))
    assert calls[0][2] < 0.3 and len(calls) >= 4, calls
    assert all(total == n for _, total, _ in calls)
    dones = [done for done, _, _ in calls]
    assert dones == sorted(dones) and dones[-1] == n
    assert len({d for d in dones if 0 < d < n}) >= 2, dones  # between chunks, not only at the end


def test_notes_come_before_the_run(tmp_path):
    trace = make_trace(tmp_path / "t.parquet", [(i * 100_000_000, R, i * 4096, 4096) for i in range(31)])
    with replay_process("run", trace, "--engine", "psync", "-o", tmp_path / "out.parquet", cwd=tmp_path) as proc:
        note = proc.stderr.readline()
        noted = time.monotonic()
        proc.communicate(timeout=60)
        ended = time.monotonic()
    assert note.startswith("note: no target given: replaying on a scratch file"), note
    assert ended - noted > 1.5, "the note came after the 3 s run, not before it"
    assert proc.returncode == 0


@pytest.mark.root
def test_a_run_whose_ios_fail_exits_3_naming_them_and_counts_no_iops(tmp_path, tmpfs):
    import json

    from tests.cli_process import replay_cli

    target = make_file(tmpfs("1m") / "disk.img", 4 * MIB)  # sparse: room for 1 MiB of it
    trace = make_trace(tmp_path / "w.parquet", [(i * 10_000, W, i * 256 * KIB, 256 * KIB) for i in range(8)])
    done = replay_cli("run", trace, target, "--json", "-o", tmp_path / "out.parquet")
    cols, _ = read_trace(tmp_path / "out.parquet")
    failed = int(np.count_nonzero(cols["result"] < 0))
    assert 0 < failed < 8 and np.all(cols["result"][cols["result"] < 0] == -errno.ENOSPC)
    assert done.returncode == 3, done.stderr
    assert f"{failed} of 8 I/Os failed (ENOSPC {failed})" in done.stderr and "Traceback" not in done.stderr
    report = json.loads(done.stdout)["tracereplay"]
    assert report["errors"] == failed and report["errors_by_errno"] == {"ENOSPC": failed}
    # IOPS count the writes that landed, not the failed ones.
    assert report["iops"] * report["duration_ns"] / 1e9 == pytest.approx(8 - failed)


def test_the_engine_counts_completed_rows_between_chunks():
    # Progress used to move only when the engine handed back a whole chunk (65,536 rows:
    # seconds of I/O on a slow drive, or the whole of a short --afap run).
    from native import _engine

    n = 20_000
    rep = _engine.Replayer(None, engine="null", timing="afap", depth=1, service_ns=100_000)
    rep.push(np.zeros(n, np.int64), np.zeros(n, np.uint8), np.arange(n, dtype=np.int64) * 4096,
             np.full(n, 4096, np.int64))
    rep.close()
    progress, seen = rep.progress(), []
    while (got := rep.take(block=False)) is None:
        seen.append(progress.completed())
        time.sleep(0.05)
    rep.join()
    assert got[4] == n and progress.completed() == n
    between = sorted({c for c in seen if 0 < c < n})
    assert len(between) >= 3, seen  # it moved while the chunk was still in the engine
