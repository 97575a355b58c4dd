"""Running a replay: the trace streams in by chunks, the native engine issues them, and the
results stream out to a Parquet file and a summary. Python prepares, Rust runs.
"""
import errno
import gc
import platform
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa

from analysis.summary import RunSummary
from analysis.summary import warm_up as summary_warm_up
from replay import __version__, remap
from replay.errors import EngineUnavailable, ReplayError
from replay.targets import Target, check_safe_to_write, inspect_target, scratch_target
from traces import library, schema
from traces.schema import Op
from traces.trace import TraceWriter, open_trace

ENGINES = ("io_uring", "psync", "null")

# errnos with which a sandbox refuses io_uring (Docker's default seccomp profile: EPERM).
_URING_REFUSED = (errno.EPERM, errno.ENOSYS, errno.EACCES)


@dataclass
class RunOptions:
    """How to replay; the CLI's flags map one to one onto these fields."""

    speed: float = 1.0
    afap: bool = False
    qd: int = 32
    max_inflight: int = 1024
    workers: int = 1
    engine: str = "io_uring"
    remap: str = "fail"
    read_only: bool = False
    dry_run: bool = False
    data: str = "random"
    destroy_data: bool = False
    chunk_rows: int = 1 << 16


@dataclass
class RunOutcome:
    """What a run produced. `output` is None for a dry run."""

    output: Path | None
    summary: RunSummary
    interrupted: bool
    target: Target
    rows: int
    notices: list[str] = field(default_factory=list)


@dataclass
class _Scan:
    """What one pass over the trace learns before anything is issued."""

    rows: int = 0
    span: int = 0
    max_length: int = 0
    counts: np.ndarray = field(default_factory=lambda: np.zeros(len(Op), dtype=np.int64))

    @property
    def writes(self) -> bool:
        return bool(self.counts[Op.WRITE] + self.counts[Op.DISCARD] + self.counts[Op.FLUSH])


def _scan(trace) -> _Scan:
    """Validates every required column too, so a bad row is found before any I/O is issued."""
    scan = _Scan()
    for chunk in trace.chunks(columns=list(schema.TRACE_COLUMNS)):
        if len(chunk["op"]):
            scan.span = max(scan.span, int((chunk["offset"] + chunk["length"]).max()))
            scan.max_length = max(scan.max_length, int(chunk["length"].max()))
        scan.counts += np.bincount(chunk["op"], minlength=len(Op))[: len(Op)]
        scan.rows += len(chunk["op"])
    return scan


def _null_target(size: int) -> Target:
    return Target(path="(null engine)", kind="null", size=max(size, 512),
                  logical_block_size=512, physical_block_size=512)


def _start_engines(target: Target, options: RunOptions, writable: bool, max_length: int, notices):
    """Running Replayers, one per worker, plus the engine and O_DIRECT setting they use.

    The first one settles the engine: psync where io_uring is refused, buffered I/O where the
    target refuses O_DIRECT (each said in a notice). Several workers share one start time.
    """
    from replay import _engine

    depth = options.qd if options.afap else options.max_inflight
    start_ns = time.monotonic_ns() + 100_000_000 if options.workers > 1 else None
    engine, direct = options.engine, True
    reps = []
    while len(reps) < options.workers:
        try:
            reps.append(_engine.Replayer(
                None if engine == "null" else target.path,
                engine=engine, afap=options.afap, speed=options.speed, depth=depth,
                writable=writable, direct=direct, is_block=target.kind == "block",
                max_length=max_length, data=options.data, start_ns=start_ns,
            ))
        except OSError as e:
            if reps:
                raise ReplayError(f"cannot start worker {len(reps) + 1}: {e}") from None
            setup = isinstance(e, _engine.EngineSetupError)
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
                raise EngineUnavailable(e.errno, f"{e}; try another --engine") from None
            else:
                raise ReplayError(f"{e.strerror or e}: cannot replay on {target.path}") from None
    return reps, engine, direct


def default_output(trace_name: str, target: Target) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(f"{trace_name}-{Path(target.path).name.strip('()').replace(' ', '-')}-{stamp}.parquet")


def replay(trace, target=None, options: RunOptions | None = None, output=None,
           progress=None, notices=None) -> RunOutcome:
    """Replay `trace` (a path, or a name in the bundled library) on `target` (a block device
    or a regular file; None for a scratch file sized to the trace).

    `progress(rows_done, rows_total, elapsed_s)` is called as chunks finish. Ctrl-C
    (KeyboardInterrupt) ends the run early: what was done is still written, marked
    interrupted. Returns the outcome; raises ReplayError subclasses for setup problems.
    """
    options = options or RunOptions()
    if options.engine not in ENGINES:
        raise ReplayError(f"unknown engine {options.engine!r}: use one of {', '.join(ENGINES)}")
    notices = [] if notices is None else notices
    trace_path = library.resolve(str(trace))
    tf = open_trace(trace_path)
    scan = _scan(tf)
    writes = scan.writes and not options.read_only
    cleanup = None
    if options.engine == "null" and target is None:
        tgt = _null_target(scan.span)
    elif target is None:
        tgt, cleanup = scratch_target(scan.span, writes=writes)
        notices.append(f"no target given: replaying on a scratch file of {remap.human_bytes(tgt.size)} "
                       f"({tgt.path}), removed afterwards")
    else:
        tgt = inspect_target(str(target))
    try:
        if writes and tgt.kind == "block":
            check_safe_to_write(tgt, options.destroy_data)
        mapping = remap.plan_mapping(scan.span, scan.max_length, tgt.size, tgt.logical_block_size,
                                     options.remap, target_path=tgt.path)
        if options.read_only and scan.writes:
            skipped = int(scan.rows - scan.counts[Op.READ])
            notices.append(f"--read-only: skipping {skipped} writes, discards and flushes")
        if options.dry_run:
            return RunOutcome(None, RunSummary(), False, tgt, 0, notices)
        output = Path(output) if output else default_output(trace_path.stem, tgt)
        return _run(tf, tgt, mapping, scan, options, output, writes, progress, notices)
    finally:
        if cleanup:
            cleanup()


def _run(tf, tgt, mapping, scan, options, output, writes, progress, notices) -> RunOutcome:
    buf_length = max(4096, -(-scan.max_length // 4096) * 4096 + 2 * tgt.logical_block_size)
    summary_warm_up()
    reps, engine, direct = _start_engines(tgt, options, writes, buf_length, notices)
    metadata = {
        "name": tf.metadata.get("name", tf.path.stem),
        "kind": "results",
        "trace": {"path": str(tf.path), "rows": scan.rows, "metadata": tf.metadata},
        "target": asdict(tgt),
        "run": {
            "engine": engine, "mode": "afap" if options.afap else "original",
            "speed": options.speed, "qd": options.qd, "max_inflight": options.max_inflight,
            "workers": options.workers, "remap": mapping.mode, "read_only": options.read_only,
            "data": options.data, "direct": direct,
            "started": datetime.now(timezone.utc).isoformat(),
        },
        "host": platform.node(), "kernel": platform.release(),
        "versions": {"tracereplay": __version__, "pyarrow": pa.__version__, "numpy": np.__version__},
    }
    columns = [(name, schema.OPTIONAL_COLUMNS.get(name) or pa.from_numpy_dtype(schema.TRACE_COLUMNS[name]))
               for name in tf.column_names
               if name in schema.OPTIONAL_COLUMNS or name in schema.TRACE_COLUMNS]
    keep = [name for name, _ in columns]
    columns += schema.RESULT_ARROW_FIELDS
    # lz4: half zstd's CPU time per row (0.12 vs 0.24 us), which the engine's host shares.
    writer = TraceWriter(output, columns, metadata, compression="lz4")
    summary = RunSummary()
    merger = _Merger(reps, writer, summary)
    aligned = 0
    interrupted = False
    started = time.monotonic()
    gc.disable()  # the run allocates few objects; collector passes only steal the engine's CPU
    try:
        try:
            for chunk in tf.chunks(columns=keep, rows=options.chunk_rows):
                if options.read_only:
                    reads = chunk["op"] == Op.READ
                    chunk = {name: col[reads] for name, col in chunk.items()}
                chunk["offset"], chunk["length"], n = remap.apply(
                    mapping, chunk["offset"], chunk["length"], chunk["op"])
                aligned += n
                merger.push(chunk)
                merger.collect(block=False)
                if progress:
                    progress(merger.done, scan.rows, time.monotonic() - started)
            for rep in reps:
                rep.close()
            while merger.collect(block=True):
                if progress:
                    progress(merger.done, scan.rows, time.monotonic() - started)
        except KeyboardInterrupt:
            interrupted = True
            for rep in reps:
                rep.stop()
            while merger.collect(block=True):
                pass
        stats = [rep.join() for rep in reps]
    except BaseException as e:
        for rep in reps:
            rep.stop()
        path = writer.close({"interrupted": True, "rows_done": merger.done,
                             "summary": summary.to_dict()})
        if isinstance(e, OSError):
            raise ReplayError(f"{e}; the {merger.done} I/Os done so far are in {path}") from None
        raise
    finally:
        gc.enable()
    interrupted = interrupted or any(s["interrupted"] for s in stats)
    if aligned:
        notices.append(f"aligned {aligned} I/Os to the target's {tgt.logical_block_size}-byte blocks")
    path = writer.close({"interrupted": interrupted, "rows_done": merger.done,
                         "aligned_ios": aligned, "summary": summary.to_dict()})
    return RunOutcome(path, summary, interrupted, tgt, merger.done, notices)


class _Merger:
    """Deals each chunk's rows to the workers (row i to worker i % N), and puts their results
    back together in trace order as they finish, writing rows that were issued."""

    def __init__(self, reps, writer, summary):
        self.reps, self.writer, self.summary = reps, writer, summary
        self.pending = deque()  # chunks pushed, not yet written
        self.results = [deque() for _ in reps]  # per worker, in push order
        self.finished = set()  # workers whose run is over
        self.done = 0

    def push(self, chunk):
        n = len(self.reps)
        self.pending.append(chunk)
        for w, rep in enumerate(self.reps):
            part = {name: np.ascontiguousarray(chunk[name][w::n])
                    for name in ("ts_ns", "op", "offset", "length")}
            flags = np.ascontiguousarray(chunk["flags"][w::n]) if "flags" in chunk else None
            rep.push(part["ts_ns"], part["op"], part["offset"], part["length"], flags)

    def collect(self, block: bool) -> bool:
        """Take what the workers have finished (with block, wait for each worker's next chunk
        or its end) and write every complete chunk. False once nothing more can come."""
        for w, rep in enumerate(self.reps):
            while w not in self.finished and not (block and self.results[w]):
                got = rep.take(block)
                if got is None:
                    if block:
                        self.finished.add(w)
                    break
                self.results[w].append(got)
        ready = lambda w: self.results[w] or w in self.finished  # noqa: E731
        while self.pending and all(ready(w) for w in range(len(self.reps))):
            self._write(self.pending.popleft(), [r.popleft() if r else None for r in self.results])
        return bool(self.pending) and len(self.finished) < len(self.reps)

    def _write(self, chunk, parts):
        n_rows, n = len(chunk["op"]), len(self.reps)
        timing = {name: np.full(n_rows, -1, dtype=np.int64)
                  for name in ("intended_ns", "issue_ns", "complete_ns", "result")}
        for w, part in enumerate(parts):
            if part is not None:
                for name, values in zip(timing, part[:4]):
                    timing[name][w::n] = values
        out = {**chunk, **timing}
        issued = timing["issue_ns"] >= 0
        if not issued.all():  # a stopped run: keep the rows that were issued
            out = {name: col[issued] for name, col in out.items()}
        if len(out["op"]):
            self.writer.write(out)
            self.summary.add(out)
        self.done += len(out["op"])
