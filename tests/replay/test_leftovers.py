"""What a run killed outright (SIGKILL) leaves in the temporary directory, its scratch file and
its calibration directory, is removed by the next run that makes one, and what a live run
holds is not (traces.workdirs: each directory's owner keeps a lock on it while it lives)."""
import signal
import subprocess

import numpy as np
import pytest

from tests.cli_process import CLI, ENV, replay_process, wait_for
from tests.replay.test_cluster_local import _kill, _tree
from tests.replay.test_stop_status import _chain
from traces.schema import Op
from traces.trace import write_trace


def _trace(path, seconds):
    """Reads and writes of 4 KiB spread over `seconds`, inside 4 MiB."""
    n = 200
    i = np.arange(n, dtype=np.int64)
    write_trace(path, {"ts_ns": i * int(seconds * 1e9) // n, "op": np.where(i % 2, Op.WRITE, Op.READ).astype(np.uint8),
                       "offset": (i % 1024) * 4096, "length": np.full(n, 4096, np.int64)},
                {"name": path.stem, "device_size": 4 << 20})
    return path


def _scratch_dirs(tmp):
    return {p.parent for p in tmp.glob("tracereplay-*/scratch.img")}


def test_a_scratch_file_left_by_a_killed_run_is_removed_by_the_next_run(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    long, short = _trace(tmp_path / "long.parquet", 60), _trace(tmp_path / "short.parquet", 0.01)
    env = {"TMPDIR": str(tmp)}
    with replay_process("run", long, "--engine", "psync", "-o", tmp_path / "a.parquet", env=env) as killed:
        wait_for(killed, lambda: _scratch_dirs(tmp), "the scratch file")
        killed.kill()
        killed.wait()
    left = _scratch_dirs(tmp)
    assert len(left) == 1  # SIGKILL runs no cleanup
    with replay_process("run", long, "--engine", "psync", "-o", tmp_path / "b.parquet", env=env) as alive:
        wait_for(alive, lambda: _scratch_dirs(tmp) - left, "the live run's scratch file")
        held = _scratch_dirs(tmp) - left
        done = _run(short, tmp_path / "c.parquet", env)
        assert done.returncode == 0, done.stderr
        # The dead run's scratch is gone; the live run's is kept; the finished run's removed.
        assert _scratch_dirs(tmp) == held
        alive.send_signal(signal.SIGINT)
        alive.wait(timeout=60)
    assert list(tmp.iterdir()) == []


def _run(trace, out, env):
    """`replay run TRACE -o OUT` on a scratch file, to its end, with `env` added."""
    return subprocess.run([*CLI, "run", str(trace), "--engine", "psync", "-o", str(out)],
                          capture_output=True, text=True, timeout=120, env={**ENV, **env})


@pytest.mark.root
@pytest.mark.loopdev
def test_a_calibration_directory_left_by_a_killed_run_is_removed_by_the_next_run(tmp_path, loop_device):
    dev = loop_device(64 << 20)
    trace, tmp = _chain(tmp_path / "chain.parquet"), tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    started = {}
    try:
        with replay_process("run", trace, dev, "--timing", "causal", "--destroy-data", "-o",
                            tmp_path / "a.parquet", env=env) as proc:
            # The probe replay's log appears once the calibration's capture is recording.
            wait_for(proc, lambda: list(tmp.glob("tracereplay-calibrate-*/probe.log")), "the calibration")
            started.update(_tree(proc.pid))  # the probe replay, which the SIGKILL leaves running
            proc.kill()
            proc.wait()
        left = list(tmp.glob("tracereplay-calibrate-*"))
        assert len(left) == 1
        _kill(started)
        done = _run(_trace(tmp_path / "short.parquet", 0.01), tmp_path / "b.parquet", env)
        assert done.returncode == 0, done.stderr
        assert list(tmp.iterdir()) == []
    finally:
        _kill(started)
