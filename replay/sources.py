"""What a run replays: a trace file or a synthetic generator, each learnt before any I/O is
issued (its span, longest I/O and op mix), then streamed by chunks; and whether it can be
replayed as the options ask.
"""
import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from replay.options import RunOptions, Timing
from traces import library, schema
from traces.errors import ReplayError
from traces.schema import MAX_IO_BYTES, Op
from traces.trace import open_trace
from traces.units import YEAR_S

# A trace whose first I/O is due later than this after the start is almost certainly
# stamped with absolute times (seconds since 1970, or since boot).
MAX_FIRST_DUE_S = 86400
# Causal timing: the most think time a --think-scale may stretch a trace to (a year), far
# inside the engine's signed nanosecond clock, which 1e308 wrapped to a negative due time.
MAX_THINK_S = YEAR_S
# A trace whose replayed columns take at most this much memory is kept from the scan, so the
# run does not decode and validate it a second time while the engine needs the CPU.
CACHE_BYTES = 64 << 20


@dataclass
class Scan:
    """What one pass over the trace learns before anything is issued."""

    rows: int = 0
    span: int = 0
    max_length: int = 0  # the longest I/O of any kind (remapping aligns spans with it)
    # The longest read or write: what the engine's buffers must hold. Discards and flushes
    # carry no data: one 1 GiB discard used to size 4.4 GB of buffers.
    max_data_length: int = 0
    first_ts: int | None = None  # ts_ns of the first row
    last_ts: int | None = None  # the latest ts_ns of any row
    counts: np.ndarray = field(default_factory=lambda: np.zeros(len(Op), dtype=np.int64))

    @property
    def writes(self) -> bool:
        return bool(self.counts[Op.WRITE] + self.counts[Op.DISCARD] + self.counts[Op.FLUSH])


def scan_trace(trace, columns, rows, keep) -> tuple[Scan, list[dict] | None]:
    """Validates every column read too, so a bad row is found before any I/O is issued.
    With `keep`, also returns the chunks read."""
    scan, cache = Scan(), [] if keep else None
    # Nothing else runs yet: the decoding may take every CPU (18 ns a row of one CPU's time).
    for chunk in trace.chunks(columns=columns, rows=rows, threads=True):
        if len(chunk["op"]):
            if scan.first_ts is None:
                scan.first_ts = int(chunk["ts_ns"][0])
            scan.last_ts = max(scan.last_ts or 0, int(chunk["ts_ns"].max()))
            scan.span = max(scan.span, int((chunk["offset"] + chunk["length"]).max()))
            scan.max_length = max(scan.max_length, int(chunk["length"].max()))
            data = chunk["length"][(chunk["op"] == Op.READ) | (chunk["op"] == Op.WRITE)]
            if len(data):
                scan.max_data_length = max(scan.max_data_length, int(data.max()))
        scan.counts += np.bincount(chunk["op"], minlength=len(Op))[: len(Op)]
        scan.rows += len(chunk["op"])
        if keep:
            cache.append(chunk)
    return scan, cache


def _row_bytes(name) -> int:
    """Memory per row of a column once read (a comm string: some tens of bytes)."""
    if name in schema.TRACE_COLUMNS:
        return schema.TRACE_COLUMNS[name].itemsize
    type_ = schema.OPTIONAL_COLUMNS[name]
    return type_.bit_width // 8 if pa.types.is_integer(type_) else 64


class TraceSource:
    """A trace file as the runner reads it: one validating pass (`scan_trace`) learns its span,
    longest I/O and op mix before anything is issued, then `chunks` streams it: from memory
    when its replayed columns fit in CACHE_BYTES (the scan kept them), else from the file."""

    def __init__(self, trace, rows=RunOptions.chunk_rows):
        self.path = library.resolve(str(trace))
        self.tf = open_trace(self.path)
        self.replayed = [n for n in self.tf.column_names
                         if n in schema.TRACE_COLUMNS or n in schema.OPTIONAL_COLUMNS]
        self.rows = rows
        keep = self.tf.num_rows * sum(map(_row_bytes, self.replayed)) <= CACHE_BYTES
        columns = self.replayed if keep else list(schema.TRACE_COLUMNS)
        self.scan, self._cache = scan_trace(self.tf, columns, rows, keep)
        self.name = self.tf.metadata.get("name", self.tf.path.stem)
        self.stem = self.path.stem  # names the default results file
        self.metadata = self.tf.metadata
        self.column_names = self.tf.column_names
        self.buffer_length = self.scan.max_data_length

    def describe(self, rows_done: int) -> dict:
        return {"path": str(self.tf.path), "rows": self.scan.rows, "metadata": self.metadata}

    def chunks(self, columns, rows):
        if self._cache is not None and rows == self.rows and set(columns) <= set(self.replayed):
            # Copies of the dicts: the runner replaces columns (remapped offsets) in place.
            return ({name: chunk[name] for name in columns} for chunk in self._cache)
        return self.tf.chunks(columns=columns, rows=rows)


class GeneratorSource:
    """A synthetic generator (synth.generators) as the runner reads it, never materialised.

    Its span, longest I/O and op mix come from its parameters (`synth_describe`), so an
    unbounded closed-loop generator (run to a time limit) needs no pass; a generator of
    another kind is scanned once, which only a finite one allows. `rows` is None when the
    length is unknown in advance; the results metadata then records the rows generated.
    """

    def __init__(self, generator, name=None):
        self.generator = generator
        self.name = name or generator.name
        self.scan, self.buffer_length = describe_generator(generator)
        self.metadata = {"name": self.name, "kind": "synthetic", "generator": generator.name,
                         "parameters": generator.parameters()}
        self.column_names = list(schema.TRACE_COLUMNS)
        self.stem = self.name
        self.generated = 0

    def describe(self, rows_done: int) -> dict:
        return {"path": f"synth:{self.generator.name}",
                "rows": self.scan.rows if self.scan.rows is not None else self.generated,
                "metadata": self.metadata}

    def chunks(self, columns, rows):
        for chunk in self.generator.chunks(rows):
            self.generated += len(chunk["op"])
            yield chunk


def describe_generator(gen) -> tuple[Scan, int]:
    """(scan with rows None when unknown, the longest read or write) from a generator's
    parameters. Discards (a purge) need no buffer, so they do not set the buffer length."""
    from synth import generators as g

    stages = gen.stages if isinstance(gen, g.Sequence) else [gen]
    scan = Scan(rows=0)
    buffer_length = 0
    for stage in stages:
        counts = np.zeros(len(Op), dtype=np.int64)
        if isinstance(stage, g.Mix):
            rows = stage.count if stage.count is not None else None
            longest = int(stage.sizes.max())
            counts[Op.READ] = stage.read_share > 0
            counts[Op.WRITE] = stage.read_share < 1
        elif isinstance(stage, g.ActLoad):
            rows, longest = None, stage.large_block
            counts[Op.READ] = counts[Op.WRITE] = 1
        elif isinstance(stage, g.Purge):
            rows, longest = 1, 0
            counts[Op.DISCARD] = 1
            scan.max_length = max(scan.max_length, stage.span)
        else:  # a kind this module does not know: one cheap pass, for finite generators only
            rows = longest = 0
            for chunk in stage.chunks():
                rows += len(chunk["op"])
                if len(chunk["op"]):
                    scan.max_length = max(scan.max_length, int(chunk["length"].max()))
                data = chunk["length"][(chunk["op"] == Op.READ) | (chunk["op"] == Op.WRITE)]
                if len(data):
                    longest = max(longest, int(data.max()))
                counts += np.bincount(chunk["op"], minlength=len(Op))[: len(Op)]
        scan.span = max(scan.span, int(stage.span_end))
        scan.max_length = max(scan.max_length, longest)
        buffer_length = max(buffer_length, longest)
        scan.max_data_length = buffer_length
        scan.counts += counts
        scan.rows = None if rows is None or scan.rows is None else scan.rows + rows
    return scan, buffer_length


def open_source(trace):
    """`trace` as the runner reads it: a path or library name, or a generator."""
    if isinstance(trace, (TraceSource, GeneratorSource)):
        return trace
    if hasattr(trace, "chunks") and hasattr(trace, "parameters"):
        return GeneratorSource(trace)
    return TraceSource(trace)


def check_trace(source, options: RunOptions) -> None:
    """Raise ReplayError for a trace that cannot be replayed as asked: no rows, an I/O longer
    than one system call moves, or a first I/O due more than a day after the start."""
    scan = source.scan
    if scan.rows == 0 and isinstance(source, TraceSource):  # a generator may be asked for none
        raise ReplayError(f"{source.describe(0)['path']} holds no I/Os (0 rows): there is nothing "
                          "to replay; check how the trace was made")
    if scan.max_length > MAX_IO_BYTES:
        raise ReplayError(f"the trace has an I/O of {scan.max_length:,} bytes; one read or write moves "
                          f"at most {MAX_IO_BYTES:,} (2 GiB - 4 KiB) on Linux: split it into shorter I/Os")
    first = getattr(scan, "first_ts", None)
    if options.timing != Timing.afap and first is not None and first / options.speed > MAX_FIRST_DUE_S * 1e9:
        raise ReplayError(
            f"the trace's first I/O is due {first / options.speed / 1e9:,.0f} s after the start "
            f"(ts_ns {first}), more than a day: its times look absolute; rebase them to start "
            "at 0 (replay convert, or ts_ns - ts_ns[0]), or replay it with --afap")


def check_causal(source, options: RunOptions) -> None:
    """Raise ReplayError when causal timing cannot replay `source` as asked."""
    from analysis import causal

    if options.workers > 1:
        raise ReplayError("causal timing runs on one worker (an I/O waits for I/Os another worker "
                          "would issue): drop --workers")
    if options.read_only:
        raise ReplayError("causal timing replays every I/O: with --read-only, reads would wait for "
                          "writes that are skipped")
    if options.heuristic not in causal.HEURISTICS:
        raise ReplayError(f"unknown heuristic {options.heuristic!r}: use one of {', '.join(causal.HEURISTICS)}")
    if not (math.isfinite(options.think_scale) and options.think_scale >= 0):
        raise ReplayError(f"--think-scale must be a finite number >= 0, not {options.think_scale}")
    if not isinstance(source, TraceSource):
        raise ReplayError("causal timing needs a captured trace (with pid and latency_ns), not a generator")
    causal.check_columns(source.path, source.column_names)
    # The think times along any chain of I/Os are disjoint stretches of the trace, so the
    # trace's duration times the scale bounds the think time a replay can add up.
    scan = source.scan
    trace_s = ((scan.last_ts or 0) - (scan.first_ts or 0)) / 1e9
    if trace_s * options.think_scale > MAX_THINK_S:
        raise ReplayError(f"--think-scale {options.think_scale:g} would stretch the think times of the "
                          f"trace's {trace_s:.3g} s to more than a year; give at most "
                          f"{MAX_THINK_S / trace_s:.3g}")
