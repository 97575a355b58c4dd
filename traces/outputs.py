"""Whether a file may be written at a path: the one check every command that writes (run,
bench, capture, import, export, recover) makes before it writes a byte, and the claim that
keeps two processes from writing the same file at once.
"""
import contextlib
import errno
import fcntl
import glob
import os
import secrets
import stat
from pathlib import Path

from traces.errors import ReplayError, TargetError
from traces.targets import Target, loops_backed_by

_NOT_A_FILE = ((stat.S_ISCHR, "a character device node"), (stat.S_ISBLK, "a block device node"),
               (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


class OutputError(TargetError):
    """A file cannot be written where asked: writing it would replace something."""


NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # a full filesystem, a quota, the size limit


@contextlib.contextmanager
def no_room_is_refused(output):
    """A write that finds no room ends as one ReplayError; by then the writer has removed what
    it wrote, so nothing is left at `output`."""
    try:
        yield
    except OSError as e:
        if e.errno not in NO_ROOM:
            raise
        raise ReplayError(f"cannot write {output}: {os.strerror(e.errno)}; nothing was written: "
                          "free some space, or give -o on another filesystem") from None


def _same(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def check_output(path, *, inputs=(), target: Target | None = None, force: bool = False,
                 example: str = "out.parquet") -> Path:
    """Raise `OutputError` with one sentence if the file `path` may not be written: it is a
    directory, a device node or another non-file; its directory is missing; it is one of
    `inputs` ((path, "the trace being replayed") pairs), the target or the file behind it, or
    backs a loop device; another process is writing it; or it exists and `force` is not set."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"cannot look at {path}: {exc.strerror}; choose another -o") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise OutputError(f"{path} is a directory; give a file name such as {path / example}")
    for test, what in _NOT_A_FILE:
        if st is not None and test(st.st_mode):
            raise OutputError(f"{path} is {what}, not a file: writing there would replace it; "
                              "choose another -o")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"cannot write {path}: the directory {parent} does not exist; create it "
                          "first or choose another -o")
    if st is not None:
        protected = list(inputs)
        if target is not None and target.kind == "file":
            protected.append((target.path, f"the target {target.path}"))
        if target is not None and target.backing_file:
            protected.append((target.backing_file, f"the file behind the target {target.path}"))
        for other, what in protected:
            if _same(path, other):
                raise OutputError(f"{path} is {what}: writing there would replace it; choose another -o")
        loops = loops_backed_by(str(path))
        if loops:
            raise OutputError(f"{path} backs {', '.join(loops)}: writing there would replace that disk "
                              "image; choose another -o")
    _check_free(path, st is not None, force)
    return path


def _check_free(path: Path, exists: bool, force: bool) -> None:
    live = writers_of(path)
    if live:
        raise OutputError(f"another process is writing {path} now ({live[0]}); choose another -o")
    if exists and not force:
        raise OutputError(f"{path} already exists; pass --force to replace it, or choose another -o")


def partials_of(path) -> list[Path]:
    """The `path.<hex>.partial` files next to `path`: what writers of it are filling, or left."""
    path = Path(path)
    return sorted(Path(p) for p in glob.glob(f"{glob.escape(str(path))}.*.partial"))


def held(partial) -> bool:
    """True while a writer still holds the claim on `partial` (its flock)."""
    try:
        fd = os.open(partial, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def writers_of(path) -> list[Path]:
    """The partial files of `path` that a live writer holds."""
    return [p for p in partials_of(path) if held(p)]


class Claim:
    """The right to write `path`: a new `path.<hex>.partial` file, flocked for as long as the
    claim is held, that the writer fills and then renames over `path`.

    Taken under a lock on the directory, after checking that no other writer holds a claim
    on `path` and, unless `force`, that `path` does not exist, so two processes cannot both
    pass the check. The flock goes with the process however it dies; a killed writer's
    partial file stays (a results journal is recovered from it) but no longer counts.
    """

    def __init__(self, path, force: bool = True):
        self.path = Path(path)
        self.tmp = self.path.with_name(f"{self.path.name}.{secrets.token_hex(4)}.partial")
        parent = self.path.parent if str(self.path.parent) else Path(".")
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)
            _check_free(self.path, self.path.exists(), force)
            self.fd = os.open(self.tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        finally:
            os.close(dir_fd)  # and its lock

    def release(self) -> None:
        """Give the claim up; the partial file stays where it is."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
