"""How to replay: the run's options, the choices each takes, and their checks, made once
before anything is opened. Light to import: the CLI builds its choices from here.
"""
import math
import re
from dataclasses import dataclass
from enum import Enum

from analysis import causal
import native
from replay import remap
from traces.errors import ReplayError

# The choices of engine and timing are the engine's own lists (engine/src/python.rs).
ENGINES = native.ENGINES
Engine = Enum("Engine", {name: name for name in ENGINES}, type=str)
# original: each I/O at its captured time over the speed; afap: as fast as possible with
# --qd in flight; causal: when the I/Os it waited for in the capture have completed.
Timing = Enum("Timing", {name: name for name in native.TIMINGS}, type=str)


@dataclass
class RunOptions:
    """How to replay; the CLI's flags map one to one onto these fields."""

    speed: float = 1.0
    timing: str = "original"  # one of Timing
    # Causal timing (analysis.causal): each I/O when the I/Os it waited for in the capture have
    # completed on the target, plus its think time times `think_scale`; `heuristic` infers them.
    think_scale: float = 1.0
    heuristic: str = causal.DEFAULT_HEURISTIC  # one of causal.HEURISTICS
    # Causal timing on a block device, as root: take the replayer's own time per I/O, measured
    # there first (replay.calibrate), off each think time.
    calibrate: bool = True
    qd: int = 32
    max_inflight: int = 1024
    workers: int = 1
    engine: str | None = None  # io_uring, or psync on a driver that runs I/O on the submitting CPU
    remap: str = "fail"
    read_only: bool = False
    dry_run: bool = False
    data: str = "random"
    destroy_data: bool = False
    force: bool = False  # replace an existing results file
    chunk_rows: int = 1 << 16
    # Stop cleanly this many seconds after the start (not an interruption): how a closed-loop
    # generator with no end ("4 KiB random writes for an hour") is run. None: run to the end.
    time_limit_s: float | None = None
    # The run's start on this host's monotonic clock (time.monotonic_ns()), for runs that
    # must start together with others (replay.multihost); None: just after the first chunk.
    start_ns: int | None = None


# Bounds of the options, checked once at the front (`check_options`), each with its reason.
# The engine's own limit on I/Os in flight, and io_uring's largest ring.
# What writes carry (--data), the engine's patterns; digits are ASCII: int() reads "５" as 5,
# but the engine is handed the text.
DATA_PATTERN = re.compile(r"random|zeros|compressible:([0-9]{1,2}|100)")

MAX_DEPTH = 32768
# Each worker holds an 8 MiB pool of write data and up to 8 MiB of read buffers, its own
# engine thread and ring: up to ~17 MB (400 workers peaked at 6.8 GB, and 10,000 were
# OOM-killed without a word). Past a few per CPU they only take turns on the CPUs.
MAX_WORKERS = 256
WORKER_BYTES = 17 << 20


def check_options(options: RunOptions) -> None:
    """Raise ReplayError, with one sentence, for the first option out of its range."""
    o = options
    if o.engine not in (None, *ENGINES):
        raise ReplayError(f"unknown engine {o.engine!r}: use one of {', '.join(ENGINES)}")
    if o.timing not in native.TIMINGS:
        raise ReplayError(f"unknown timing {o.timing!r}: use one of {', '.join(native.TIMINGS)}")
    if not (isinstance(o.speed, (int, float)) and math.isfinite(o.speed) and o.speed > 0):
        raise ReplayError(f"--speed must be a finite number above 0 (2 replays twice as fast), not {o.speed}")
    for flag, value, top, why in (
        ("--qd", o.qd, MAX_DEPTH, "the engine's limit on I/Os in flight"),
        ("--max-inflight", o.max_inflight, MAX_DEPTH, "the engine's limit on I/Os in flight"),
        ("--workers", o.workers, MAX_WORKERS, "each worker holds up to 17 MB of buffers and "
                                              "its own thread"),
    ):
        if not (isinstance(value, int) and 1 <= value <= top):
            raise ReplayError(f"{flag} must be between 1 and {top} ({why}), not {value}")
    if not DATA_PATTERN.fullmatch(o.data):
        raise ReplayError(f"--data must be random, zeros or compressible:PCT with PCT a whole "
                          f"number from 0 to 100, not {o.data!r}")
    if o.remap not in remap.MODES:
        raise ReplayError(f"--remap must be one of {', '.join(remap.MODES)}, not {o.remap!r}")
    if o.time_limit_s is not None and not (math.isfinite(o.time_limit_s) and o.time_limit_s > 0):
        raise ReplayError(f"the time limit must be a positive number of seconds, not {o.time_limit_s}")
    if not (isinstance(o.chunk_rows, int) and o.chunk_rows >= 1):
        raise ReplayError(f"chunk_rows must be a positive number of rows, not {o.chunk_rows}")
