"""Replay targets: a scratch file when no TARGET is given, and the checks that keep the results
file off the target. What a target is and whether it is safe to write: traces.targets.
"""
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

from traces.errors import TargetError
from traces.targets import Target, inspect_target, loops_backed_by
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
    workdir = tempfile.mkdtemp(prefix="tracereplay-", dir=directory)
    path = os.path.join(workdir, "scratch.img")
    with open(path, "wb") as f:
        f.truncate(size)
    return inspect_target(path), lambda: shutil.rmtree(workdir, ignore_errors=True)


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output_path(output) -> None:
    """Raise `TargetError` if the results file `output` cannot be written at all: it is a
    directory, or in a directory that does not exist. Checked before anything is opened."""
    output = Path(output)
    if output.is_dir():
        raise TargetError(f"the results path {output} is a directory; give a file name such as "
                          f"{output / 'results.parquet'}")
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        raise TargetError(f"cannot write the results to {output}: the directory {parent} does not "
                          "exist; create it first or choose another -o")


def check_output(output, target: Target) -> None:
    """`check_output_path`, and raise `TargetError` if the results file `output` would
    replace the target itself, the file under a loop device target, or any loop device's
    backing file."""
    check_output_path(output)
    output = Path(output)
    if not output.exists():
        return
    if target.kind == "file" and _same_file(output, target.path):
        raise TargetError(f"the results path {output} is the target {target.path}: writing the "
                          "results would replace it; choose another -o")
    if target.backing_file and _same_file(output, target.backing_file):
        raise TargetError(f"the results path {output} is the file behind the target {target.path}: "
                          "writing the results would replace it; choose another -o")
    loops = loops_backed_by(str(output))
    if loops:
        raise TargetError(f"the results path {output} backs {', '.join(loops)}: writing the results "
                          "would replace that disk image; choose another -o")
