"""Type stubs for `native._engine`, the Rust extension (engine/src/python.rs, python_text.rs).

A `Replayer` owns one engine thread that replays one target. Build every worker's Replayer,
optionally give them one start instant (`start_at`), `push` trace chunks, `take` result
chunks as they finish, then `close` and `join`. `stop` ends a run early.
"""
from typing import TypedDict, final

import numpy as np
import numpy.typing as npt

# The engines and timing modes by name: the one list of each, which the runner and the CLI
# take their choices from.
ENGINES: tuple[str, ...]  # ("io_uring", "psync", "null")
TIMINGS: tuple[str, ...]  # ("original", "afap", "causal")

class Summary(TypedDict):
    """What `Replayer.join` returns."""

    start_monotonic_ns: int  # the run's start (time 0 of every time in the results)
    rows_issued: int
    interrupted: bool  # stopped before every pushed row was issued
    cpu_ns: int  # CPU time of the engine thread (not psync's I/O threads or io_uring's workers)

# (intended_ns, issue_ns, complete_ns, result, issued), one entry per row pushed in the chunk.
# Times are ns since the run's start on the monotonic clock:
# - intended_ns: when the row was due (ts_ns / speed; in afap, when it was queued);
# - issue_ns: when the I/O entered the kernel (psync: right before its I/O thread called
#   pread/pwrite/ioctl/fallocate/fdatasync; io_uring: when the io_uring_enter that submitted it
#   returned; null: when it was "submitted");
# - complete_ns: when the engine saw its completion;
# - result: bytes transferred (a discard: the bytes it covered; a flush: 0), or -errno.
# Rows at and after `issued` were never issued (a stopped run) and hold -1.
ChunkResult = tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], int
]

@final
class Progress:
    """How far a run has got, shared with its engine thread."""

    def completed(self) -> int:
        """Rows completed so far, across every chunk pushed."""

class Replayer:
    def __init__(
        self,
        target: str | None = None,
        *,
        engine: str = "io_uring",
        timing: str = "original",
        speed: float = 1.0,
        depth: int = 256,
        writable: bool = False,
        direct: bool = True,
        is_block: bool = False,
        sync_driver: bool = False,
        max_length: int = 1 << 20,
        data: str = "random",
        queue_chunks: int = 4,
        start_ns: int | None = None,
        think_scale: float = 1.0,
        service_ns: int = 0,
    ) -> None:
        """Open `target` (None for the null engine) and start the engine thread.

        engine: "io_uring", "psync" (threads doing pread/pwrite) or "null" (no device).
        timing: "original", each row due at start + ts_ns / speed; "afap", as fast as
        possible with `depth` in flight; "causal", each row due when its parents (given to
        `push`) have completed, plus its think time times think_scale (a row without parents
        at start + ts_ns / speed). depth: 1 to 32768 I/Os in flight. writable: open for writing;
        a block device (is_block) is then opened O_EXCL, so a mounted or claimed one is
        refused with EBUSY; read-only it takes no claim and runs on a mounted disk.
        direct: O_DIRECT. sync_driver: a block device whose driver runs each I/O on the
        submitting CPU (zram, brd): psync then uses one thread per CPU. max_length: the
        longest read or write that will be pushed, at most 2147479552 bytes (the most one
        read or write transfers); it sizes the buffers, and discards and flushes need none.
        data: what writes carry: "random", "zeros" or "compressible:PCT". queue_chunks: the
        chunks pushed but not yet started that `push` lets wait. start_ns: the run's start on
        the monotonic clock (see `start_at`). service_ns: with the null engine, each
        I/O completes exactly this long after its submission (0: at once).

        Raises ValueError for a bad argument, OSError (errno set) when the target cannot be
        opened, traces.errors.EngineSetupError (an OSError) when the engine cannot start.
        """
    def progress(self) -> Progress:
        """The run's progress, readable from any thread (even while `push` or `join`
        waits, when the Replayer itself cannot be called)."""
    def start_at(self, start_ns: int) -> None:
        """Set the run's start to `start_ns` on the monotonic clock (time.monotonic_ns()):
        deadlines count from it and nothing is issued before it. Replaces the constructor's
        `start_ns`; without either, the run starts when the first chunk reaches the engine.

        Call it on every worker once all engines are built and before the first push, with
        one instant for all, so workers start together. Raises RuntimeError after a push.
        """
    def push(
        self,
        ts_ns: npt.NDArray[np.int64],
        op: npt.NDArray[np.uint8],
        offset: npt.NDArray[np.int64],
        length: npt.NDArray[np.int64],
        flags: npt.NDArray[np.uint8] | None = None,
        parent: npt.NDArray[np.uint32] | None = None,
        parent2: npt.NDArray[np.uint32] | None = None,
        think_ns: npt.NDArray[np.int64] | None = None,
    ) -> None:
        """Hand the engine the next rows (contiguous 1-D arrays of one length). Blocks,
        without the GIL, while `queue_chunks` chunks wait; Ctrl-C raises KeyboardInterrupt.

        Every row is checked first. ValueError, naming the row by its index among all rows
        pushed, for: an op other than 0 read, 1 write, 2 discard, 3 flush; a negative offset
        or length; offset + length past 2**63 - 1; a read or write longer than `max_length`.
        With causal timing, `parent` and `parent2` (rows back to each row's parents, 0 for
        none, at most 131,071; parent2 2**32 - 1: wait for every earlier row) and `think_ns`
        (>= 0) are required; without, refused.
        Nothing of a refused chunk is queued. Returns quietly if the run has already ended
        (`join` says why).
        """
    def take(self, block: bool = True) -> ChunkResult | None:
        """The next finished chunk, in push order; None when nothing is ready (block=False)
        or the run is over."""
    def close(self) -> None:
        """No more chunks: the run ends when everything pushed has completed."""
    def stop(self) -> None:
        """End the run now: nothing more is issued; in-flight I/Os are reaped."""
    def join(self) -> Summary:
        """Wait for the engine thread (without the GIL) and return its summary, or raise the
        OSError that ended it. Call after `close` or `stop`, once."""

def read_lines(
    block: bytes | bytearray | memoryview, kinds: list[str | None]
) -> tuple[list[npt.NDArray[np.int64] | npt.NDArray[np.float64]], int] | None:
    """The comma-separated lines of `block` (whole lines), one field each in `kinds`: "int64"
    (an optional minus and 1-18 digits), "float64" (1-15 digits, then optionally a point and
    1-3 digits) or None (a field not kept). Returns the kept fields' columns in field order and
    the LFs read, or None for a block with any other line, for pyarrow to read instead. The
    GIL is released; a block of 1 MiB or more is read in two halves at once."""
