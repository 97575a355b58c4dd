"""Starting the engines: one Replayer per worker, the fallbacks (psync where io_uring is
refused or the driver runs I/O on the submitting CPU, buffered I/O without O_DIRECT), the
check that their buffers fit in memory, and their common start.
"""
import errno
import time

import native
from replay.options import RunOptions, Timing
from traces.errors import EngineSetupError, ReplayError
from traces.targets import Target, unclaimed
from traces.units import human_bytes

# errnos with which a sandbox refuses io_uring (Docker's default seccomp profile: EPERM).
_URING_REFUSED = (errno.EPERM, errno.ENOSYS, errno.EACCES)


def null_target(size: int) -> Target:
    """The stand-in target of a run on the null engine, which opens no file: `size` bytes."""
    return Target(path="(null engine)", kind="null", size=max(size, 512),
                  logical_block_size=512, physical_block_size=512)


def start_engines(target: Target, options: RunOptions, writable: bool, max_length: int, notices):
    """Running Replayers, one per worker, plus the engine and O_DIRECT setting they use.

    The first one settles the engine: psync where io_uring is refused, or, unless an engine
    was asked for, where the target's driver runs I/O on the submitting CPU; buffered I/O
    where the target refuses O_DIRECT (each said in a notice). None issues anything before
    `start_together` gives them their common start.
    """
    depth = options.qd if options.timing == Timing.afap else options.max_inflight
    check_memory(options.workers, depth, max_length)
    engine, direct = options.engine or "io_uring", True
    if options.engine is None and target.sync_driver:
        notices.append(f"{target.path}'s driver runs each I/O on the CPU that submits it, which "
                       "io_uring would hand to a kernel worker thread: using the psync engine, "
                       "with one thread per CPU running the I/Os (--engine io_uring to override)")
        engine = "psync"
    if target.kind == "block":
        unclaimed(target.path)  # a claim that outlives its run goes; one that stays fails below
    reps = []
    while len(reps) < options.workers:
        try:
            reps.append(native.Replayer(
                None if engine == "null" else target.path,
                engine=engine, timing=Timing(options.timing).value, speed=options.speed, depth=depth,
                # Only the first worker opens a block device O_EXCL (the kernel refuses a
                # second exclusive open with EBUSY); its claim keeps the device from being
                # mounted for the whole run. The others discard with fallocate(PUNCH_HOLE),
                # which block devices also accept.
                writable=writable, direct=direct, is_block=target.kind == "block" and not reps,
                sync_driver=target.sync_driver,
                max_length=max_length, data=options.data,
                think_scale=options.think_scale,
            ))
        except OSError as e:
            if reps:
                raise ReplayError(f"cannot start worker {len(reps) + 1}: {e}") from None
            setup = isinstance(e, EngineSetupError)
            if engine == "io_uring" and setup and e.errno in _URING_REFUSED:
                notices.append(f"io_uring is refused here ({errno.errorcode[e.errno]}); "
                               "using the psync engine (a pool of pread/pwrite threads)")
                engine = "psync"
            elif direct and e.errno == errno.EINVAL and target.kind == "file":
                notices.append(f"{target.path} does not support O_DIRECT; replaying with "
                               "buffered I/O, so the page cache will serve some reads")
                direct = False
            elif e.errno == errno.EBUSY:
                raise ReplayError(f"{target.path} is busy: it is mounted or claimed by another "
                                  "user; unmount it or choose another target") from None
            elif setup:
                raise  # an EngineUnavailable whose message suggests another engine
            else:
                raise ReplayError(f"{e.strerror or e}: cannot replay on {target.path}") from None
    return reps, engine, direct


def worker_bytes(depth: int, max_length: int) -> int:
    """Memory one worker's buffers take (engine/src/data.rs, Buffers::new): the pool of
    write data, and the read slots, at most as large as the pool."""
    slot = -(-max(max_length, 1) // 4096) * 4096
    pool = max(2 * slot, 8 << 20)
    return pool + slot * min(depth, pool // slot)


def check_memory(workers: int, depth: int, max_length: int, available: int | None = None) -> None:
    """Refuse workers whose buffers would not fit in the memory `available` (default: the
    kernel's MemAvailable): the OOM killer would otherwise end the run without a word."""
    if available is None:
        try:
            with open("/proc/meminfo") as f:
                meminfo = dict(line.split(":", 1) for line in f)
            available = int(meminfo["MemAvailable"].split()[0]) * 1024
        except (OSError, KeyError, ValueError):
            return
    need = workers * (worker_bytes(depth, max_length) + (1 << 20))  # + thread stack and ring
    if need > available:
        raise ReplayError(
            f"{workers} workers need about {human_bytes(need)} of buffers (up to "
            f"{human_bytes(need // workers)} each) but {human_bytes(available)} is "
            "available; use fewer --workers, a lower --qd/--max-inflight, or shorter I/Os")


# The workers' common start is this far after their first chunk is ready: time to hand
# it to every worker (32 workers, a 65,536-row chunk: ~5 ms).
START_AHEAD_NS = 20_000_000


def start_together(reps, at: int | None = None) -> int:
    """Give every worker one common start instant, a little ahead (or `at`): their first I/Os
    are all due from then on, so building and feeding the workers one after another is not
    recorded as lateness. Returns that instant (monotonic ns)."""
    start_ns = time.monotonic_ns() + START_AHEAD_NS if at is None else at
    for rep in reps:
        rep.start_at(start_ns)
    return start_ns
