"""Replay targets: a scratch file when no TARGET is given. What a target is and whether it is
safe to write: traces.targets; where the results may be written: traces.outputs.
"""
import os
import tempfile
from typing import Callable

from traces import workdirs
from traces.errors import TargetError
from traces.targets import Target, inspect_target
from traces.units import human_bytes

MIB = 1 << 20


def scratch_target(
    size: int, directory: str | None = None, *, writes: bool = True
) -> tuple[Target, Callable[[], None]]:
    """A sparse scratch file of `size` bytes rounded up to 1 MiB, and a function that removes it.

    When the replay writes, the filesystem must have room for the whole file, because the
    written blocks stop being sparse; that is checked up front rather than failing mid-run.
    """
    size = max(MIB, -(-size // MIB) * MIB)
    directory = directory or tempfile.gettempdir()
    if writes:
        fs = os.statvfs(directory)
        free = fs.f_bavail * fs.f_frsize
        if free < size:
            raise TargetError(
                f"the scratch file needs {human_bytes(size)} ({size} bytes) but {directory} has "
                f"{human_bytes(free)} ({free} bytes) free; choose a directory on a larger "
                "filesystem or pass a TARGET"
            )
    # Owned: a run killed outright leaves it, and the next one to make a scratch file removes it.
    workdir = workdirs.make("tracereplay-scratch-", directory)
    path = workdir / "scratch.img"
    with open(path, "wb") as f:
        f.truncate(size)
    return inspect_target(str(path)), lambda: workdirs.remove(workdir)
