"""Temporary directories a later process can tell are orphaned: each holds a lock file its
creator keeps locked (flock) while it lives. A SIGKILL or a power cut releases the lock, so the
next run that makes one removes every directory whose owner is gone, and no other.
"""
import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

# The lock file's name; a directory without it (another program's, or one being made) is
# never removed.
OWNER = ".tracereplay-owner"
_held: dict[Path, int] = {}  # directory -> the descriptor that holds its lock


def make(prefix: str, directory: str | os.PathLike | None = None) -> Path:
    """A new directory PREFIX<pid>-XXXX in `directory` (default: the temporary directory),
    owned by this process until `remove`; orphans left there first are removed."""
    directory = Path(directory or tempfile.gettempdir())
    sweep(directory)
    path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=directory))
    # Locked before it gets its name: a sweep never sees an owner file that is not locked.
    fd = os.open(path / f"{OWNER}.new", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{os.getpid()}\n".encode())
    os.rename(path / f"{OWNER}.new", path / OWNER)
    _held[path] = fd
    return path


def remove(path: Path) -> None:
    """Remove a directory from `make`, and let go of its lock."""
    shutil.rmtree(path, ignore_errors=True)
    fd = _held.pop(Path(path), None)
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def owned(prefix: str, directory=None):
    """`make` for the block, `remove` after it however it ends."""
    path = make(prefix, directory)
    try:
        yield path
    finally:
        remove(path)


def sweep(directory: str | os.PathLike) -> list[Path]:
    """Remove the directories in `directory` whose owner file nobody holds locked; returns them."""
    removed = []
    for owner in Path(directory).glob(f"*/{OWNER}"):
        try:
            fd = os.open(owner, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # alive: its owner holds the lock
        finally:
            os.close(fd)  # closing our descriptor lets go of a lock we took
        shutil.rmtree(owner.parent, ignore_errors=True)
        removed.append(owner.parent)
    return removed
