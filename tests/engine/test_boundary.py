"""The engine boundary (`native._engine.Replayer`) on every engine: rows it cannot run are
refused with a ValueError before anything is queued, never undefined behaviour; discards keep
their 64-bit length; buffers are sized from data I/Os only; engine threads leave signals to
Python; issue times are taken when an I/O enters the kernel; a read-only replay runs on a
mounted disk without opening it for writing.
"""
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from native import _engine
from replay.runner import RunOptions, replay
from tests.replay.test_run_end_to_end import _ext4, marks, needs, on_loop, uring
from traces.schema import MAX_IO_BYTES, Op
from traces.trace import read_trace, write_trace

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
I64_MAX = (1 << 63) - 1
MAX_LENGTH = 64 * KIB
ENGINES = ["null", "psync", pytest.param("io_uring", marks=uring)]
REPO = Path(__file__).resolve().parents[2]


def columns(rows):
    """(op, offset, length) rows -> the four columns push takes."""
    n = len(rows)
    op, offset, length = zip(*rows) if rows else ((), (), ())
    return (np.zeros(n, np.int64), np.array(op, np.uint8), np.array(offset, np.int64),
            np.array(length, np.int64))


def replayer(engine, path, **kw):
    kw = {"timing": "afap", "depth": 4, "writable": True, "direct": False, "max_length": MAX_LENGTH, **kw}
    return _engine.Replayer(None if engine == "null" else str(path), engine=engine, **kw)


def finish(rep):
    """Close, take every result chunk, join: (results as one array per field, summary)."""
    rep.close()
    parts = []
    while (got := rep.take()) is not None:
        parts.append(got)
    summary = rep.join()
    fields = [np.concatenate([p[k][: p[4]] for p in parts]) if parts else np.zeros(0, np.int64)
              for k in range(4)]
    return fields, summary


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "target.img"
    path.write_bytes(bytes(range(256)) * (MIB // 256))
    return path


BAD_ROWS = {
    "unknown op": ((7, 0, 4096), "unknown op 7"),
    "negative offset": ((Op.READ, -4096, 4096), "negative offset -4096"),
    "negative length": ((Op.READ, 0, -1), "negative length -1"),
    "negative discard": ((Op.DISCARD, 4096, -4096), "negative length"),
    "read above max_length": ((Op.READ, 0, MAX_LENGTH + 4096), "longer than the 65536-byte buffers"),
    "write above max_length": ((Op.WRITE, 0, 8 * MIB), "longer than the 65536-byte buffers"),
    "offset + length overflows": ((Op.WRITE, I64_MAX - 100, 4096), "overflows"),
}


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", BAD_ROWS, ids=[c.replace(" ", "-") for c in BAD_ROWS])
def test_a_bad_row_is_refused_naming_it_and_nothing_of_its_chunk_runs(engine, case, target):
    bad, problem = BAD_ROWS[case]
    before = target.read_bytes()
    rep = replayer(engine, target)
    rep.push(*columns([(Op.READ, 0, 4096)] * 3))
    # A write first: had any row of the chunk been queued, the file would change.
    with pytest.raises(ValueError, match=rf"row 4: .*{problem}"):
        rep.push(*columns([(Op.WRITE, 8192, 4096), bad]))
    rep.push(*columns([(Op.READ, 4096, 4096)]))
    (intended, issue, complete, result), summary = finish(rep)
    assert summary["rows_issued"] == 4
    np.testing.assert_array_equal(result, [4096] * 4)
    assert target.read_bytes() == before


def test_max_length_is_bounded_by_what_one_read_can_transfer():
    with pytest.raises(ValueError, match="max_length must be at most"):
        _engine.Replayer(None, engine="null", max_length=4 * GIB)
    # The trace check (replay.sources.check_trace) stops where the engine does.
    _engine.Replayer(None, engine="null", max_length=MAX_IO_BYTES, depth=1).close()
    with pytest.raises(ValueError, match=f"at most {MAX_IO_BYTES} bytes"):
        _engine.Replayer(None, engine="null", max_length=MAX_IO_BYTES + 1, depth=1)


def test_a_huge_queue_chunks_is_a_value_error_in_a_fresh_process():
    # 2**62 chunks once aborted the process: the channel allocated its capacity up front.
    code = ("from native import _engine\ntry:\n    _engine.Replayer(None, engine='null', queue_chunks=2**62)\n"
            "except ValueError as e:\n    print(e)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    assert run.stdout.startswith("queue_chunks must be at most 4096")


ABORTS = """
import numpy as np
from native import _engine
# Each of these used to reach memory outside the engine's buffers on psync: the process
# aborted with heap corruption (exit 134) or wrote process memory to the file.
for op, offset, length in [(0, 0, 1 << 20), (0, 0, -1), (1, 0, 64 << 20), (7, 0, 1 << 20)]:
    rep = _engine.Replayer({path!r}, engine="psync", timing="afap", depth=4, writable=True,
                           direct=False, max_length=4096)
    try:
        rep.push(np.zeros(4, np.int64), np.full(4, op, np.uint8), np.full(4, offset, np.int64),
                 np.full(4, length, np.int64))
    except ValueError as e:
        print("refused:", e)
    rep.close()
    while rep.take() is not None:
        pass
    rep.join()
print("survived")
"""


def test_the_aborts_found_on_psync_are_refused_in_a_fresh_process(target):
    code = ABORTS.format(path=str(target))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=REPO)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    assert run.stdout.count("refused: push: row 0") == 4 and "survived" in run.stdout


# The target opens as the lowest free descriptor, the limit leaves none for the ring.
RING_FD_REFUSED = """
import errno, os, resource
from native import _engine
from traces.errors import EngineSetupError, ReplayError
free = os.open("/dev/null", os.O_RDONLY)
os.close(free)
resource.setrlimit(resource.RLIMIT_NOFILE, (free + 1, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
try:
    _engine.Replayer({path!r}, engine="io_uring", timing="afap", depth=4, writable=False,
                     direct=False, max_length=4096)
except ReplayError as e:
    print(type(e) is EngineSetupError, isinstance(e, OSError), e.errno == errno.EMFILE)
    print(e)
"""


@marks(uring)
def test_an_engine_that_cannot_start_raises_a_replay_error_that_is_an_os_error(target):
    run = subprocess.run([sys.executable, "-c", RING_FD_REFUSED.format(path=str(target))],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    kind, message = run.stdout.splitlines()
    assert kind == "True True True"
    assert message.startswith("[Errno 24] cannot set up io_uring: ") and message.endswith("; try another --engine")


def _valid(op, offset, length):
    if op > 3 or offset < 0 or length < 0 or offset + length > I64_MAX:
        return False
    return op not in (Op.READ, Op.WRITE) or length <= MAX_LENGTH


_i64 = st.integers(-(1 << 63), I64_MAX)
_row = st.tuples(
    st.one_of(st.integers(0, 3), st.integers(0, 255)),
    st.one_of(st.integers(0, 255).map(lambda b: b * 4096), _i64),
    st.one_of(st.sampled_from([0, 512, 4096, MAX_LENGTH, MAX_LENGTH + 1]), st.integers(-1, 1 << 20), _i64),
)


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chunks=st.lists(st.lists(_row, max_size=12), min_size=1, max_size=4),
       flags=st.booleans(), ts=st.integers(-(1 << 63), I64_MAX))
def test_arbitrary_pushes_raise_value_error_or_run(engine, target, chunks, flags, ts):
    rep = replayer(engine, target)
    accepted = 0
    for rows in chunks:
        cols = list(columns(rows))
        cols[0] = np.full(len(rows), ts, np.int64)  # afap: any timestamp is due now
        flag_col = np.arange(len(rows), dtype=np.uint8) * 37 if flags else None
        if all(_valid(*r) for r in rows):
            rep.push(*cols, flag_col)
            accepted += len(rows)
        else:
            first_bad = next(i for i, r in enumerate(rows) if not _valid(*r))
            with pytest.raises(ValueError, match=rf"^push: row {accepted + first_bad}: "):
                rep.push(*cols, flag_col)
    (intended, issue, complete, result), summary = finish(rep)
    assert summary["rows_issued"] == accepted == len(result)
    assert (issue >= intended).all() and (complete >= issue).all()


def _allocated(path) -> int:
    return os.stat(path).st_blocks * 512


@pytest.mark.parametrize("engine", ["psync", pytest.param("io_uring", marks=uring)])
def test_a_discard_past_4_gib_covers_all_of_it(engine, tmp_path):
    # Allocated blocks over 4 GiB + 3 MiB, data written inside the discard's last MiB and
    # just after it. A length kept in 32 bits punched 1 MiB and reported success.
    length = 4 * GIB + MIB
    path = tmp_path / "big.img"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            os.posix_fallocate(fd, 0, length + 2 * MIB)
        except OSError as e:
            pytest.skip(f"needs 4 GiB of allocatable space in {tmp_path}: {e}")
        os.pwrite(fd, b"x" * 4096, length - 512 * KIB)
        os.pwrite(fd, b"y" * 4096, length + MIB)
        os.fsync(fd)
        rep = replayer(engine, path, max_length=4096)
        rep.push(*columns([(Op.DISCARD, 0, length)]))
        (_, _, _, result), _ = finish(rep)
        assert result.tolist() == [length]
        assert os.lseek(fd, 0, os.SEEK_DATA) >= length  # nothing left inside the range
        assert os.pread(fd, 4096, length + MIB) == b"y" * 4096  # nothing after it touched
        assert _allocated(path) <= 2 * MIB + 64 * KIB
    finally:
        os.close(fd)


# The replay's own peak: VmHWM, not ru_maxrss, which Linux carries over exec from the parent
# (the test process itself, hundreds of MB by the time this runs).
BUFFERS = """
import sys, time
from replay.runner import RunOptions, replay
t = time.monotonic()
replay(sys.argv[1], None, RunOptions(engine="null", timing="afap"), output=sys.argv[2])
hwm = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(int(hwm.split()[1]) * 1024, time.monotonic() - t)
"""


def test_one_huge_discard_does_not_size_the_buffers(tmp_path):
    # One 1 GiB discard among 4 KiB reads used to size 4.4 GB of buffers (7-16 s of setup).
    n = 1000
    op = np.full(n, Op.READ, np.uint8)
    op[0] = Op.DISCARD
    length = np.full(n, 4096, np.int64)
    length[0] = GIB
    write_trace(tmp_path / "t.parquet", {"ts_ns": np.arange(n, dtype=np.int64) * 1000, "op": op,
                                         "offset": np.arange(n, dtype=np.int64) * 4096,
                                         "length": length}, {"name": "huge-discard"})
    run = subprocess.run([sys.executable, "-c", BUFFERS, str(tmp_path / "t.parquet"),
                          str(tmp_path / "out.parquet")], capture_output=True, text=True, timeout=300,
                         cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    peak, seconds = map(float, run.stdout.split()[-2:])
    # The interpreter, NumPy, pyarrow and Numba alone take some 200-300 MB.
    assert peak < 800 * MIB, f"peak RSS {peak / MIB:.0f} MiB"
    cols, _ = read_trace(tmp_path / "out.parquet")
    assert cols["result"][0] == GIB and (cols["result"][1:] == 4096).all()


SIGNALS = {"SIGHUP": 1, "SIGINT": 2, "SIGALRM": 14, "SIGTERM": 15}


def _blocked_by_thread() -> dict:
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            status = (task / "status").read_text()
        except OSError:
            continue
        mask = int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)
        out.setdefault(comm, []).append({name for name, sig in SIGNALS.items() if mask >> (sig - 1) & 1})
    return out


def test_engine_and_io_threads_leave_termination_signals_to_python(target):
    rep = replayer("psync", target, timing="original")
    rep.push(np.array([3_600_000_000_000]), *columns([(Op.READ, 0, 4096)])[1:])  # due in an hour
    time.sleep(0.1)
    try:
        threads = _blocked_by_thread()
    finally:
        rep.stop()
        finish(rep)
    ours = {k: v for k, v in threads.items() if k == "replay-engine" or k.startswith("psync-")}
    assert "replay-engine" in ours and any(k.startswith("psync-") for k in ours), threads
    for name, masks in ours.items():
        for blocked in masks:
            assert blocked == set(SIGNALS), f"{name} blocks only {sorted(blocked)}"


def test_psync_issue_time_is_when_a_thread_starts_the_call(target):
    # A sync-driver psync engine has one thread per CPU but one, plus the engine thread: at
    # most that many I/Os are inside a system call at once. With the hand-off time recorded
    # as the issue time, all 256 looked in flight together.
    n = 256
    rep = replayer("psync", target, depth=n, sync_driver=True)
    rep.push(*columns([(Op.READ, (i % 256) * 4096, 4096) for i in range(n)]))
    (intended, issue, complete, result), _ = finish(rep)
    assert (result == 4096).all() and (complete >= issue).all() and (issue >= intended).all()
    events = sorted([(t, 1) for t in issue] + [(t, -1) for t in complete], key=lambda e: (e[0], e[1]))
    in_call = np.cumsum([d for _, d in events]).max()
    assert in_call <= max(2, os.cpu_count()), f"{in_call} I/Os in a system call at once"


def _open_files_of(path) -> int:
    """How many of this process's descriptors are open on `path` (a file or a block device)."""
    want = os.stat(path)
    key = (lambda s: s.st_rdev) if stat.S_ISBLK(want.st_mode) else (lambda s: (s.st_dev, s.st_ino))
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            st_ = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        n += stat.S_IFMT(st_.st_mode) == stat.S_IFMT(want.st_mode) and key(st_) == key(want)
    return n


@pytest.mark.parametrize("kind", ["file", pytest.param("block", marks=on_loop)])
def test_psync_pool_threads_each_open_the_target_and_close_it_after(kind, target, request):
    # One open file per pool thread (one per CPU on a sync driver), not one shared: a shared
    # one's reference count crossed between the CPUs with every I/O. A block device opened
    # for writing keeps its O_EXCL claim on the first; the others open it without one.
    path = target if kind == "file" else request.getfixturevalue("loop_device")(16 * MIB)
    before = _open_files_of(path)
    rep = _engine.Replayer(str(path), engine="psync", timing="afap", depth=32, writable=True,
                           direct=kind == "block", is_block=kind == "block", sync_driver=True, max_length=8192)
    assert _open_files_of(path) - before == min(os.cpu_count(), 32)
    rep.push(*columns([(Op.READ, i * 4096, 4096) for i in range(64)] + [(Op.WRITE, 0, 4096)]))
    (_, _, _, result), summary = finish(rep)
    assert summary["rows_issued"] == 65 and (result == 4096).all()
    assert _open_files_of(path) == before


def _device_fds(device) -> list[int]:
    rdev = os.stat(device).st_rdev
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            st_ = os.stat(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if stat.S_ISBLK(st_.st_mode) and st_.st_rdev == rdev:
            fds.append(int(fd))
    return fds


def _access_mode(fd) -> int:
    flags = next(line for line in Path(f"/proc/self/fdinfo/{fd}").read_text().splitlines()
                 if line.startswith("flags:"))
    return int(flags.split()[1], 8) & os.O_ACCMODE


@marks(on_loop, needs("mkfs.ext4"))
@pytest.mark.parametrize("engine", ["psync", pytest.param("io_uring", marks=uring)])
def test_a_read_only_replay_runs_on_a_mounted_disk_without_opening_it_for_writing(
        engine, tmp_path, loop_device, mounted):
    device = _ext4(loop_device(16 * MIB))
    mounted(device)
    rep = _engine.Replayer(device, engine=engine, depth=4, writable=False, direct=True,
                           is_block=True, max_length=8192)
    try:
        fds = _device_fds(device)
        assert fds and all(_access_mode(fd) == os.O_RDONLY for fd in fds)
        rep.push(*columns([(Op.READ, 0, 4096), (Op.READ, MIB, 8192)]))
    finally:
        (_, _, _, result), _ = finish(rep)
    assert result.tolist() == [4096, 8192]
    # Writing still takes the exclusive claim, which a mounted device refuses.
    with pytest.raises(OSError) as e:
        _engine.Replayer(device, engine=engine, writable=True, is_block=True)
    assert e.value.errno == 16  # EBUSY

    # Through the library: the trace's write is skipped, its reads run.
    trace = tmp_path / "wr.parquet"
    write_trace(trace, {"ts_ns": np.array([0, 1000, 2000]), "op": np.array([Op.WRITE, Op.READ, Op.READ], np.uint8),
                        "offset": np.array([MIB, 0, 2 * MIB]), "length": np.array([4096, 4096, 8192])},
                {"name": "wr"})
    outcome = replay(trace, device, RunOptions(read_only=True, engine=engine), output=tmp_path / "ro.parquet")
    assert read_trace(outcome.output)[0]["result"].tolist() == [4096, 8192]
