"""Importing foreign trace formats into Parquet traces and exporting traces for other tools.

The machinery the text importers share lives below, in traces.formats.reading (block-wise CSV
reading) and traces.formats.ordering (time order, outliers, merging several inputs).
"""
import contextlib
import datetime
import gc
import itertools
import os
from pathlib import Path

import numpy as np
import pyarrow as pa

from traces import formats, schema
from traces.errors import ReplayError, TraceFormatError
from traces.formats.ordering import MAX_GAP_NS, OutlierLog, span_text
from traces.formats.reading import InputMeter, open_text, prefetch
from traces.outputs import Claim, check_output, no_room_is_refused
from traces.trace import TraceWriter, _check_chunk, open_trace

REQUIRED = tuple(schema.TRACE_COLUMNS)
_ARROW_TYPES = {**{n: pa.from_numpy_dtype(d) for n, d in schema.TRACE_COLUMNS.items()},
                **schema.OPTIONAL_COLUMNS}
_ORDER = (*REQUIRED, *schema.OPTIONAL_COLUMNS)


# ----------------------------------------------------------------------------- import


def _module(name):
    """The format's module; a format whose module is not installed is a clear error."""
    try:
        return formats.get(name)
    except ModuleNotFoundError:
        raise ReplayError(f"the {name} format is not available in this version of tracereplay") from None


def sniff(path) -> str:
    """formats.sniff, passing over formats whose module is not there yet."""
    from traces.formats.inputs import read_head

    head = read_head(Path(path))
    for name in formats.NAMES:
        try:
            module = formats.get(name)
        except ModuleNotFoundError:
            continue
        if module.sniff(Path(path), head):
            return name
    raise TraceFormatError(
        path, f"cannot tell the trace format; name it with --format ({', '.join(formats.NAMES)})")


@contextlib.contextmanager
def without_gc():
    """The cyclic garbage collector paused: an import makes few reference cycles, and each
    full collection walks every object Numba and pyarrow hold (5-20 % of a blktrace import)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@without_gc()  # the whole import: Numba loading for the first chunk made 40 ms of collections
def import_trace(paths, output, fmt=None, options=None, command=None, progress=None,
                 force=False) -> tuple[Path, int]:
    """Read `paths` in format `fmt` (sniffed from the first file when None) into a trace at
    `output`, written atomically; returns (output, rows). `progress(done, total)` is called
    with raw input bytes after each chunk. An existing `output` is replaced only with `force`.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ReplayError("no input files; give at least one trace file to import")
    for p in paths:
        if not p.is_file():
            raise TraceFormatError(p, "no such file" if not p.exists() else "not a regular file")
    check_output(output, inputs=[(p, "an input") for p in paths], force=force)
    if fmt is None and _is_empty(paths[0]):
        raise TraceFormatError(paths[0], "the file is empty: there is nothing to import")
    name = fmt or sniff(paths[0])
    module = _module(name)
    if not getattr(module, "EMPTY_FILES_OK", False):
        for p in paths:
            if _is_empty(p):
                raise TraceFormatError(p, "the file is empty: there is nothing to import")
    meter = InputMeter(paths)
    outliers = OutlierLog(bool((options or {}).get("drop_outliers")))
    opts = dict(options or {}, meter=meter, outliers=outliers)
    metadata, chunks = module.read(paths, opts)
    metadata = dict(metadata)
    # The format's own dict: a streaming reader completes its counts in it as it finishes.
    source = metadata.setdefault("source", {})
    source.setdefault("kind", f"import:{name}")
    source["command"] = command
    source["inputs"] = [p.name for p in paths]
    source["format"] = name
    metadata["source"] = source
    if opts.get("name"):
        metadata["name"] = opts["name"]
    metadata.setdefault("name", paths[0].name.split(".")[0])
    output = Path(output)
    chunks = iter(chunks)
    first = next(chunks, None)
    # One rule for every format: a trace starts at its first I/O. The time that becomes 0 is
    # recorded, in ns on the input's own clock: where the format counted from (its
    # time_origin_ns, 0 when it keeps the file's zero) plus the first I/O's time after that.
    shift = int(first["ts_ns"][0]) if first is not None and len(first["ts_ns"]) else 0
    source["time_origin_ns"] = int(source.get("time_origin_ns") or 0) + shift
    if shift and metadata.get("start_wallclock"):
        start = datetime.datetime.fromisoformat(metadata["start_wallclock"])
        metadata["start_wallclock"] = (start + datetime.timedelta(microseconds=shift / 1000)).isoformat()
    # A format may say which columns it would have made, for an input without records.
    declared = metadata.pop("columns", None) or REQUIRED
    names = [n for n in _ORDER if n in (first if first is not None else declared)]
    fields = [(n, _ARROW_TYPES[n]) for n in names]
    rows, last_ts = 0, None
    # Parsing (in a thread) overlaps compression and writing (here): both release the GIL.
    chunks = prefetch(chunks)
    with no_room_is_refused(output), TraceWriter(output, fields, metadata, force=force) as writer:
        for part in itertools.chain([first] if first is not None else [], chunks):
            part = {n: _as_column(n, part[n]) for n in names}
            if shift:
                part["ts_ns"] = part["ts_ns"] - shift
            _check_chunk(output, part, rows, last_ts)
            _check_gaps(paths, part, rows, last_ts)
            writer.write(part)
            if len(part["ts_ns"]):
                last_ts = int(part["ts_ns"][-1])
            rows += len(part["ts_ns"])
            if progress is not None:
                progress(meter.done, meter.total)
        if rows == 0:
            raise TraceFormatError(", ".join(map(str, paths)),
                                   "no I/O records in the input: there is nothing to import")
        extra = {"rows_imported": rows, "source": source}
        if outliers.count:
            extra["dropped_outliers"] = outliers.metadata()
        writer.close(extra)
    return output, rows


def _is_empty(path) -> bool:
    """Whether the (decompressed) file holds nothing but white space."""
    from traces.formats.inputs import read_head

    head = read_head(path)
    if head.strip():
        return False
    if len(head) < 65536:
        return True
    with open_text(path) as f:
        while data := f.read(1 << 20):
            if data.strip():
                return False
    return True


def _check_gaps(paths, part, row0, last_ts) -> None:
    """The backstop behind each format's outlier check: consecutive I/Os (and the start, 0,
    and the first I/O) more than MAX_GAP_NS apart are refused, naming the I/O rows."""
    ts = part["ts_ns"]
    before = last_ts if last_ts is not None else 0
    # _check_chunk has seen the times rise from `before`, so no gap is wider than the span
    # from `before` to the last: within MAX_GAP_NS (the usual case), the passes below are not
    # needed (about 1 ns a record on the main thread).
    if not len(ts) or ts[-1] - before <= MAX_GAP_NS:
        return
    gaps = np.diff(ts, prepend=before)
    if (far := gaps > MAX_GAP_NS).any():
        i = int(far.argmax())
        where = (f"I/O {row0 + i + 1} comes {span_text(gaps[i])} after the one before it"
                 if row0 + i else f"the first I/O comes {span_text(gaps[i])} after the trace's start")
        raise TraceFormatError(", ".join(map(str, paths)), f"{where} (more than "
                               f"{span_text(MAX_GAP_NS)}): a damaged timestamp, not a pause; "
                               "cut the damaged records out of the input (--drop-outliers does "
                               "that for lone records of the text formats)")


def _as_column(name, values):
    if name == "comm":
        return values
    dtype = _ARROW_TYPES[name].to_pandas_dtype()
    return np.asarray(values).astype(dtype, copy=False)


# ----------------------------------------------------------------------------- export


def export_trace(trace, fmt, output, options=None, force=False) -> Path:
    """Write trace (a path or library name) as `fmt` to `output`, atomically; an existing
    `output` is replaced only with `force`."""
    from traces.library import resolve

    if fmt not in formats.WRITERS:
        raise ReplayError(f"cannot export to {fmt!r}; use one of {', '.join(formats.WRITERS)}")
    try:
        module = formats.get(fmt)
    except ModuleNotFoundError:
        module = None
    if module is None or not hasattr(module, "write"):
        raise ReplayError(f"export to {fmt} is not available in this version of tracereplay; "
                          f"use one of: {', '.join(f for f in formats.WRITERS if _can_write(f))}")
    source = resolve(trace)
    opened = open_trace(source)
    output = check_output(output, inputs=[(source, "the trace being exported")], force=force)
    claim = Claim(output, force)
    try:
        with no_room_is_refused(output):
            module.write(opened, claim.tmp, dict(options or {}))
        os.replace(claim.tmp, output)
    finally:
        claim.tmp.unlink(missing_ok=True)
        claim.release()
    return output


def _can_write(fmt) -> bool:
    try:
        return hasattr(formats.get(fmt), "write")
    except ModuleNotFoundError:
        return False
