"""The `drive_pair` fixture: two targets that behave like different drives (bench/targets.py):
a fast loop device over /dev/shm and a slow one over the local disk, throttled by a private
block cgroup. Replays on the slow one run in a child process that joins the cgroup first.
"""
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_process import replay_cli
from bench import targets

MIB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


@dataclass
class DrivePair:
    fast: str
    slow: str
    throttle: targets.Throttle

    def replay(self, device: str, *args, timeout=120) -> subprocess.CompletedProcess:
        """`replay ARGS` in a child process; inside the throttle's cgroup when `device` is the
        slow drive, so its I/O is limited from the first one."""
        extra = self.throttle.popen_kwargs() if device == self.slow else {}
        return replay_cli(*args, cwd=REPO, timeout=timeout, **extra)


def _why_no_pair() -> str | None:
    if os.geteuid() != 0:
        return "needs root (loop devices, cgroup files)"
    for tool in ("losetup", "fio"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian packages mount and fio)"
    if targets._cgroup_mounts() == (None, None):
        return "needs a block cgroup controller (cgroup v2 io or v1 blkio) to throttle a drive"
    return None


@pytest.fixture
def drive_pair():
    """DrivePair(fast, slow, throttle), 128 MiB each, written over; slow limited to 2,000 read
    and 2,000 write IOPS. Everything is detached, removed and the cgroup deleted at the end."""
    why = _why_no_pair()
    if why:
        pytest.skip(why)
    with targets.drive_pair(128 * MIB, riops=2000, wiops=2000) as (fast, slow, throttle):
        yield DrivePair(fast, slow, throttle)
