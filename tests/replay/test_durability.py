"""A run keeps its rows whatever ends it: SIGTERM and SIGHUP as Ctrl-C, a full results
filesystem (real tmpfs mounts) with one line; Ctrl-C over several chunks and workers. SIGKILL,
through the journal and `replay recover`: test_results_journal.py.
"""
import contextlib
import glob
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cli_process import one_line, replay_cli, replay_process, wait_for
from traces.schema import Op
from traces.trace import open_trace, read_trace, write_trace

R = Op.READ
MIB = 1 << 20
root = pytest.mark.root


def make_trace(path, n, gap_ns, span=64 * 4096):
    """`n` 4 KiB reads `gap_ns` apart; row i reads at offset (i * 4096) % span."""
    i = np.arange(n, dtype=np.int64)
    write_trace(path, {"ts_ns": i * gap_ns, "op": np.full(n, R, np.uint8),
                       "offset": (i * 4096) % span, "length": np.full(n, 4096, np.int64)},
                {"name": path.stem})
    return path


def journal(out) -> list[str]:
    return glob.glob(f"{out}.*.partial")


# ---- SIGTERM and SIGHUP are Ctrl-C -------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_keep_the_rows_and_remove_the_scratch_file(tmp_path, sig):
    n = 300
    trace = make_trace(tmp_path / "long.parquet", n, 100_000_000)  # 30 s
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    out = tmp_path / "out.parquet"
    # No TARGET: a scratch image in TMPDIR, which must go too.
    with replay_process("run", trace, "-o", out, cwd=tmp_path,
                        env={"TMPDIR": str(tmpdir)}) as proc:
        wait_for(proc, lambda: journal(out), "the run's start")
        assert os.listdir(tmpdir), "the scratch image is not in TMPDIR"
        time.sleep(2)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, stderr
    line = one_line(stderr, "interrupted")
    assert signal.Signals(sig).name in line and str(out) in line
    meta = open_trace(out).metadata
    cols, _ = read_trace(out)
    done = len(cols["op"])
    assert meta["interrupted"] is True and meta["rows_done"] == done and 0 < done < n
    np.testing.assert_array_equal(cols["ts_ns"], np.arange(done) * 100_000_000)
    np.testing.assert_array_equal(cols["result"], 4096)
    assert os.listdir(tmpdir) == [] and not journal(out)


def test_sigterm_ends_a_library_replay_with_its_rows(tmp_path):
    import sys

    from tests.cli_process import ENV

    trace = make_trace(tmp_path / "long.parquet", 300, 100_000_000)
    out = tmp_path / "out.parquet"
    script = ("from replay.runner import RunOptions, replay\n"
              f"o = replay({str(trace)!r}, None, RunOptions(engine='null'), output={str(out)!r})\n"
              "print(o.interrupted, o.signum, o.rows)")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        wait_for(proc, lambda: journal(out), "the run's start")
        time.sleep(1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr
    interrupted, signum, rows = stdout.split()
    assert (interrupted, signum) == ("True", str(int(signal.SIGTERM))) and int(rows) > 0
    assert open_trace(out).metadata["rows_done"] == int(rows)


def test_sigterm_before_the_first_io_exits_143_and_leaves_nothing(tmp_path):
    # The signal comes while the trace is scanned, before any I/O: the process is stopped
    # (SIGSTOP) with the trace open, and SIGTERM sent before it goes on. The trace's columns
    # fit in the runner's cache (CACHE_BYTES), so the run itself never opens the file again:
    # an open trace means the scan. A try whose stop missed the scan starts again.
    trace = make_trace(tmp_path / "big.parquet", 2_500_000, 1000)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    out = tmp_path / "out.parquet"

    def reading(pid):
        with contextlib.suppress(OSError):
            return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(trace)
                       for fd in os.listdir(f"/proc/{pid}/fd"))

    def stopped(pid):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"

    for _ in range(20):
        with replay_process("run", trace, "-o", out, cwd=tmp_path,
                            env={"TMPDIR": str(tmpdir)}) as proc:
            wait_for(proc, lambda: reading(proc.pid), "the trace's scan")
            proc.send_signal(signal.SIGSTOP)
            wait_for(proc, lambda: stopped(proc.pid), "the stop")
            if not reading(proc.pid):
                continue  # the scan ended before the stop; the process is killed
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGCONT)
            _, stderr = proc.communicate(timeout=60)
            break
    else:
        pytest.fail("20 tries never stopped the process during the trace's scan")
    assert proc.returncode == 143, stderr
    assert "SIGTERM" in one_line(stderr, "interrupted")
    assert not out.exists() and not journal(out) and os.listdir(tmpdir) == []


def test_a_signal_after_the_last_io_keeps_every_row_and_still_says_stop(tmp_path):
    # The runner's last progress call comes in the main thread once every I/O is back: a
    # Ctrl-C there cannot stop an I/O any more, but the caller (a bench between two runs)
    # must still hear of it. (SIGINT: an in-process Ray, as test_cluster starts, owns SIGTERM.)
    from replay.runner import RunOptions, replay

    trace = make_trace(tmp_path / "t.parquet", 1000, 1000)
    out = tmp_path / "out.parquet"

    def progress(done, total, elapsed):
        if threading.current_thread() is threading.main_thread():
            os.kill(os.getpid(), signal.SIGINT)

    outcome = replay(trace, None, RunOptions(engine="null"), output=out, progress=progress)
    assert (outcome.signum, outcome.interrupted, outcome.rows) == (signal.SIGINT, False, 1000)
    assert open_trace(out).metadata["interrupted"] is False and len(read_trace(out)[0]["op"]) == 1000


def test_sigterm_ends_a_bench_as_ctrl_c_does(tmp_path):
    out = tmp_path / "steady"
    with replay_process("bench", "steady", "--engine", "null", "--span", "64M", "--duration", "120",
                        "-o", out, cwd=tmp_path) as proc:
        wait_for(proc, lambda: glob.glob(f"{out}/steady.parquet.*.partial"), "the steady run")
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr
    one_line(stderr, "are saved in")
    results = json.loads((out / "results.json").read_text())
    assert results["interrupted"] is True
    assert [(r["name"], r["interrupted"]) for r in results["runs"]] == [("fill", False), ("steady", True)]
    assert open_trace(out / "steady.parquet").metadata["rows_done"] > 0
    assert not glob.glob(f"{out}/*.partial")


# ---- Ctrl-C over several chunks and workers ----------------------------------------------


def test_ctrl_c_over_several_chunks_and_workers_keeps_every_io_issued(tmp_path):
    chunk = 1 << 16
    n = 4 * chunk + 1000  # four whole chunks and a partial last one
    gap = 25_000  # 40k IOPS: ~6.6 s of trace
    trace = make_trace(tmp_path / "t.parquet", n, gap, span=n * 4096)
    out = tmp_path / "out.parquet"
    with replay_process("run", trace, "--engine", "null", "--workers", "3", "-o", out,
                        cwd=tmp_path) as proc:
        wait_for(proc, lambda: journal(out), "the run's start")
        time.sleep(3.5)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    one_line(stderr, "interrupted")
    meta = open_trace(out).metadata
    cols, _ = read_trace(out)
    done = len(cols["op"])
    assert chunk < done < n, done  # stopped past the first chunk, before the end
    # Every row an engine issued is in the file: none lost at a chunk's or piece's end.
    assert meta["rows_done"] == done == meta["rows_issued"]
    # Worker w issued rows w, w + 3, ... in order: in the file, a prefix of each.
    row = cols["offset"] // 4096
    assert np.all(np.diff(row) > 0)
    for w in range(3):
        mine = row[row % 3 == w]
        np.testing.assert_array_equal(mine, np.arange(w, w + 3 * len(mine), 3))
    assert np.all(cols["issue_ns"] >= 0) and np.all(cols["result"] == 4096)


# ---- a full results filesystem -----------------------------------------------------------


def fill(path: Path) -> None:
    """Fill the filesystem of `path` until the kernel says ENOSPC."""
    with open(path, "wb", buffering=0) as f:
        block = b"\xa5" * 65536
        try:
            while True:
                f.write(block)
        except OSError:
            pass
        try:
            while True:
                f.write(b"\xa5" * 512)
        except OSError:
            pass


@root
def test_results_that_cannot_fit_are_refused_before_any_io(tmp_path, tmpfs):
    trace = make_trace(tmp_path / "t.parquet", 200_000, 1000)
    small = tmpfs("2m")
    done = replay_cli("run", trace, "--engine", "null", "--afap", "-o", small / "out.parquet")
    assert done.returncode == 2, done.stderr
    line = one_line(done.stderr, "error:")
    assert "200,000 I/Os need" in line and "free" in line and str(small) in line
    assert os.listdir(small) == []


@root
def test_a_completely_full_results_filesystem_is_refused_in_one_line(tmp_path, tmpfs):
    trace = make_trace(tmp_path / "t.parquet", 10, 1000)
    small = tmpfs("1m")
    fill(small / "filler")
    done = replay_cli("run", trace, "--engine", "null", "--afap", "-o", small / "out.parquet")
    assert done.returncode == 2, done.stderr
    assert "0 bytes) free" in one_line(done.stderr, "error:")
    assert os.listdir(small) == ["filler"]


@root
def test_a_full_results_filesystem_mid_run_stops_cleanly_and_keeps_the_rows(tmp_path, tmpfs):
    n, gap = 200_000, 100_000  # 10k IOPS for 20 s; the results need about 3 MB
    trace = make_trace(tmp_path / "t.parquet", n, gap)
    small = tmpfs("6m")
    out = small / "out.parquet"
    with replay_process("run", trace, "--engine", "null", "-o", out, cwd=tmp_path) as proc:
        wait_for(proc, lambda: journal(out) and os.path.getsize(journal(out)[0]) > 50_000,
                 "the first results")
        fill(small / "filler")
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 2, stderr
    line = one_line(stderr, "error:")
    assert "full" in line and "replay recover" in line
    [partial] = journal(out)
    assert partial in line and not out.exists()
    os.unlink(small / "filler")
    done = replay_cli("recover", partial)
    assert done.returncode == 0, done.stderr
    cols, meta = read_trace(out)
    rows = len(cols["op"])
    assert 0 < rows < n and meta["interrupted"] is True
    np.testing.assert_array_equal(cols["ts_ns"], np.arange(rows) * gap)
