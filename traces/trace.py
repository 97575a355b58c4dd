"""Reading and writing Parquet traces, validating every chunk as it is read or written.

A trace is one Parquet file: the columns of `schema.TRACE_COLUMNS` (plus any of
`schema.OPTIONAL_COLUMNS`) and one JSON object of metadata under the Parquet key-value
key `schema.METADATA_KEY`. The same writer makes replay results files, which add columns.

Metadata keys (all optional except `schema_version`, which the writer always sets):

=================== ======== ===========================================================
key                 type     meaning
=================== ======== ===========================================================
schema_version      int      version of this layout; readers refuse a newer one
name                str      short name, the library name for bundled traces ("demo")
description         str      what the workload is and how it was obtained, in sentences
source              object   how it was made: ``kind`` ("capture:tracefs",
                             "import:msr", "synth:demo"), ``command`` (the command
                             line), ``tool_version``, and any producer-specific keys
device_size         int      bytes of the traced device; offsets are below it
logical_block_size  int      bytes; the traced device's logical block size
host                str      machine the trace was captured on
kernel              str      kernel release it was captured under (``uname -r``)
start_wallclock     str      ISO 8601 wall-clock time of ts_ns == 0
license             str      SPDX identifier the trace is distributed under
provenance          str      where the data came from and what was done to it
=================== ======== ===========================================================

Results files add keys of their own at close (a run summary, ``interrupted: true``).
Unknown keys are kept as they are.
"""
import errno
import json
import os
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traces import schema
from traces.errors import TraceFormatError
from traces.outputs import Claim, held
from traces.schema import Op

DEFAULT_CHUNK_ROWS = 1 << 16
# Largest row group the writer makes; bounds the memory a reader needs per row group.
MAX_ROW_GROUP_ROWS = 1 << 20

_REQUIRED_TYPES = {
    name: (pa.from_numpy_dtype(dtype),) for name, dtype in schema.TRACE_COLUMNS.items()
}
_REQUIRED_TYPES["length"] = tuple(pa.from_numpy_dtype(d) for d in schema.LENGTH_DTYPES)
_COLUMN_TYPES = {**_REQUIRED_TYPES, **{n: (t,) for n, t in schema.OPTIONAL_COLUMNS.items()}}

# Lookup table: _VALID_OP[code] is True for every Op; indexing with a uint8 array is one pass.
_VALID_OP = np.zeros(256, dtype=bool)
_OP_CODES = sorted(int(op) for op in Op)
_VALID_OP[_OP_CODES] = True
assert _OP_CODES == list(range(len(_OP_CODES)))  # so op.max() < len(Op) means every op is known
_OP_NAMES = ", ".join(f"{op.name}={int(op)}" for op in Op)
# A numpy scalar, not a Python int: minus a uint32 array it gives int64 (NEP 50).
_INT64_MAX = np.int64(np.iinfo(np.int64).max)


def open_trace(path) -> "TraceFile":
    """Open a trace, reading only its footer: columns, types and metadata are checked here."""
    path = Path(path)
    if not path.is_file():
        problem = "no such file" if not path.exists() else "not a regular file"
        raise TraceFormatError(path, f"{problem}; give the path of a .parquet trace")
    try:
        parquet_metadata = pq.read_metadata(path)
        arrow_schema = parquet_metadata.schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as exc:
        raise TraceFormatError(
            path, f"not a readable Parquet file ({exc}); is it truncated or another format?"
        ) from None
    for name, types in _COLUMN_TYPES.items():
        if name not in arrow_schema.names:
            if name in _REQUIRED_TYPES:
                raise TraceFormatError(
                    path,
                    "missing required column; a trace needs " + ", ".join(_REQUIRED_TYPES),
                    column=name,
                )
            continue
        found = arrow_schema.field(name).type
        if found not in types:
            expected = " or ".join(str(t) for t in types)
            raise TraceFormatError(
                path, f"column has type {found}, expected {expected}", column=name
            )
    metadata = _parse_metadata(path, (parquet_metadata.metadata or {}).get(schema.METADATA_KEY))
    return TraceFile(path, parquet_metadata, arrow_schema, metadata)


def _parse_metadata(path, raw: bytes | None) -> dict:
    if raw is None:
        return {}
    key = schema.METADATA_KEY.decode()
    try:
        metadata = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TraceFormatError(path, f"metadata under '{key}' is not valid JSON ({exc})") from None
    if not isinstance(metadata, dict):
        raise TraceFormatError(
            path, f"metadata under '{key}' is a JSON {type(metadata).__name__}, expected an object"
        )
    version = metadata.get("schema_version")
    if type(version) is not int or version < 1:
        raise TraceFormatError(
            path, f"metadata schema_version is {version!r}, expected a positive integer"
        )
    if version > schema.SCHEMA_VERSION:
        raise TraceFormatError(
            path,
            f"trace has schema_version {version} but this tracereplay reads versions up to "
            f"{schema.SCHEMA_VERSION}; upgrade tracereplay to read it",
        )
    return metadata


class TraceFile:
    """An opened trace: footer facts up front, rows streamed and validated by `chunks`."""

    def __init__(self, path, parquet_metadata, arrow_schema, metadata):
        self.path = Path(path)
        self.metadata = metadata
        self.num_rows = parquet_metadata.num_rows
        self.column_names = list(arrow_schema.names)
        self._parquet_metadata = parquet_metadata
        self._arrow_schema = arrow_schema

    def __repr__(self):
        return f"TraceFile({str(self.path)!r}, num_rows={self.num_rows})"

    def has(self, column) -> bool:
        return column in self.column_names

    def chunks(self, columns=None, rows=None, threads=False):
        """Yield dicts of numpy arrays, in order, each validated before it is yielded.

        Only the rules whose columns are read are checked (asking for offset and length
        alone does not check op codes). `length` always comes back as int64. With
        `threads`, the columns are decoded in parallel (the same CPU time in less wall
        time, on CPUs that nothing else needs then).
        """
        names = list(self.column_names if columns is None else columns)
        for name in names:
            if not self.has(name):
                raise TraceFormatError(
                    self.path,
                    "no such column; the trace has " + ", ".join(self.column_names),
                    column=name,
                )
        rows = DEFAULT_CHUNK_ROWS if rows is None else int(rows)
        if rows < 1:
            raise ValueError(f"rows must be at least 1, not {rows}")
        first_row, last_ts = 0, None
        # Reopening with the footer already parsed costs no extra read and keeps no file
        # open between calls.
        with pq.ParquetFile(self.path, metadata=self._parquet_metadata) as parquet:
            # One reader per row group: a single reader over the whole file grows by ~3
            # bytes per row read (122 MB over 30M rows, measured), per-group readers stay flat.
            batches = (
                batch
                for group in range(parquet.num_row_groups)
                for batch in parquet.iter_batches(
                    batch_size=rows, row_groups=[group], columns=names, use_threads=threads
                )
            )
            while True:
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                except (pa.ArrowException, OSError) as exc:
                    raise TraceFormatError(
                        self.path, f"cannot read rows from {first_row} on ({exc})", row=first_row
                    ) from None
                chunk = _batch_to_numpy(self.path, batch, first_row)
                _check_chunk(self.path, chunk, first_row, last_ts)
                if len(batch) and "ts_ns" in chunk:
                    last_ts = int(chunk["ts_ns"][-1])
                first_row += len(batch)
                yield chunk

    def span(self) -> int:
        """Exact max(offset + length) over the trace, in bytes: the device size it needs."""
        span = 0
        for chunk in self.chunks(["offset", "length"]):
            if len(chunk["offset"]):
                span = max(span, int((chunk["offset"] + chunk["length"]).max()))
        return span

    def max_length(self) -> int:
        """Largest single I/O in bytes, 0 for an empty trace."""
        longest = 0
        for chunk in self.chunks(["length"]):
            if len(chunk["length"]):
                longest = max(longest, int(chunk["length"].max()))
        return longest

    def duration_ns(self) -> int:
        """The last ts_ns (0 for an empty trace), from the last row group's statistics."""
        md = self._parquet_metadata
        groups = [i for i in range(md.num_row_groups) if md.row_group(i).num_rows]
        if not groups:
            return 0
        last = md.row_group(groups[-1])
        ts = next(
            last.column(i) for i in range(last.num_columns)
            if last.column(i).path_in_schema == "ts_ns"
        )
        stats = ts.statistics
        if stats is not None and stats.has_min_max:
            return int(stats.max)
        with pq.ParquetFile(self.path, metadata=md) as parquet:
            ts = parquet.read_row_group(groups[-1], columns=["ts_ns"]).column(0)
        return int(ts[-1].as_py())


def _batch_to_numpy(path, batch: pa.RecordBatch, first_row: int) -> dict[str, np.ndarray]:
    chunk = {}
    for name, column in zip(batch.schema.names, batch.columns):
        # numpy has no integer null; strings (comm) may be null and become None.
        if column.null_count and not pa.types.is_string(column.type):
            nulls = column.is_null().to_numpy(zero_copy_only=False)
            raise TraceFormatError(
                path,
                "null value; every row needs one",
                column=name,
                row=first_row + int(nulls.argmax()),
            )
        chunk[name] = _to_numpy(name, column)
    return chunk


def _to_numpy(name, column: pa.Array) -> np.ndarray:
    values = column.to_numpy(zero_copy_only=False)
    if name == "length":
        values = values.astype(np.int64, copy=False)
    return values


def _check_chunk(path, chunk, first_row: int, last_ts: int | None) -> None:
    """Raise for the first bad row of a chunk; every rule is one vectorised pass, and a rule
    whose column's minimum or maximum shows it holds (the usual case) needs no mask at all:
    5.4 -> 1.1 ns a row, paid on every row twice per replay (the scan and the run)."""
    found = []  # (row within chunk, column, problem); the smallest row is reported

    def first(mask):
        return int(mask.argmax()) if mask.any() else None

    ts, op = chunk.get("ts_ns"), chunk.get("op")
    offset, length = chunk.get("offset"), chunk.get("length")
    if ts is not None and len(ts):
        if ts.min() < 0 and (i := first(ts < 0)) is not None:
            found.append((i, "ts_ns", f"negative ts_ns {ts[i]}"))
        if last_ts is not None and ts[0] < last_ts:
            found.append((0, "ts_ns", f"ts_ns decreases from {last_ts} to {ts[0]}"))
        elif (i := first(ts[1:] < ts[:-1])) is not None:
            found.append((i + 1, "ts_ns", f"ts_ns decreases from {ts[i]} to {ts[i + 1]}"))
    known = op is None or not len(op) or op.max() < len(_OP_CODES)  # the codes are 0..N-1
    if op is not None and not known:
        if (i := first(~_VALID_OP[op])) is not None:
            found.append((i, "op", f"unknown op {op[i]}; expected one of {_OP_NAMES}"))
    lo_len = length.min() if length is not None and len(length) else 0
    if offset is not None and len(offset) and offset.min() < 0 and (i := first(offset < 0)) is not None:
        found.append((i, "offset", f"negative offset {offset[i]}"))
    if length is not None and lo_len < 0 and (i := first(length < 0)) is not None:
        found.append((i, "length", f"negative length {length[i]}"))
    if op is not None and length is not None and lo_len <= 0:
        empty = (length == 0) & (op != Op.FLUSH)
        if not known:
            empty &= _VALID_OP[op]
        if (i := first(empty)) is not None:
            found.append(
                (i, "length", f"{Op(op[i]).name.lower()} with length 0; only a flush may be empty")
            )
    if offset is not None and length is not None and len(offset) and \
            offset.max() > _INT64_MAX - max(int(length.max()), 0):
        overflow = offset > _INT64_MAX - np.maximum(length, 0)
        if (i := first(overflow)) is not None:
            found.append(
                (i, "offset", f"offset {offset[i]} + length {length[i]} overflows int64")
            )
    if found:
        row, column, problem = min(found, key=lambda f: f[0])
        raise TraceFormatError(path, problem, column=column, row=first_row + row)


def read_trace(path) -> tuple[dict[str, np.ndarray], dict]:
    """The whole trace in memory, validated; for small traces and tests."""
    trace = open_trace(path)
    parts = {name: [] for name in trace.column_names}
    for chunk in trace.chunks():
        for name, values in chunk.items():
            parts[name].append(values)
    columns = {}
    for name, arrays in parts.items():
        if arrays:
            columns[name] = np.concatenate(arrays)
        else:
            empty = pa.array([], type=trace._arrow_schema.field(name).type)
            columns[name] = _to_numpy(name, empty)
    return columns, dict(trace.metadata)


def _json_object(path, metadata, what) -> dict:
    """A copy of `metadata` that is known to serialise to JSON (numpy scalars allowed)."""
    if not isinstance(metadata, dict):
        raise TraceFormatError(path, f"{what} must be a dict, not {type(metadata).__name__}")
    try:
        return json.loads(json.dumps(metadata, default=_json_default))
    except (TypeError, ValueError) as exc:
        raise TraceFormatError(path, f"{what} cannot be stored as JSON ({exc})") from None


def _json_default(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


# How a results journal stores the clock columns: each as its difference from the row before
# (base None; the batch's first value is in the entry) or from another column of the row, as
# each batch's custom metadata says ("diffs"); `read_journal` adds them back. Small numbers that
# repeat: lz4 packed a 20M-row QD1 null run's journal into 6.3 instead of 21.5 bytes a row, in
# 17 instead of 39 ns a row (plus 7 ns for the differences), on the thread that waits for the
# engine's results.
_JOURNAL_DIFFS = (("ts_ns", None), ("intended_ns", None), ("issue_ns", "intended_ns"),
                  ("complete_ns", "issue_ns"))
# The integer types a journal's int64 column is stored in: the first that holds its values.
_JOURNAL_WIDTHS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


class TraceWriter:
    """Streaming Parquet writer for traces and results: one row group per `write`, or per
    `group_rows` rows when given (the writes are held until that many have come).

    Rows go to `<path>.<random>.partial` in the same directory, which `close` renames over
    `path` atomically, so `path` never holds a half-written file. As a context manager it
    closes on success and aborts on an exception unless the caller closed it first (to
    keep a partial result, call `close({"interrupted": True})` before re-raising).

    With `journal_s` (replay results), the `.partial` is a journal instead: an Arrow IPC
    stream that takes every `write` at once as an lz4 batch and is fsynced every `journal_s`
    seconds while rows come, so a killed process loses no written row and a power cut at most
    `journal_s` seconds of them. A Parquet file is unreadable without the footer written
    at its close; a stream reads up to its last complete batch (`read_journal`). The same
    rows also go, as they come, into the Parquet file, in row groups of `group_rows`: an
    unnamed file (O_TMPFILE) that only `close` gives a name, so a killed process leaves the
    journal alone. Where the filesystem has no unnamed files, or that file fails, or the
    caller asks for it (`beside=False`: the CPU the encoding takes is wanted elsewhere while
    rows come), `close` converts the journal instead. If closing fails (a full disk), the
    journal is kept and the error names it (`JournalKept`).
    """

    def __init__(self, path, columns, metadata, compression="zstd", group_rows=None,
                 journal_s=None, force=True, claimed=False, beside=True):
        self.path = Path(path)
        # The Parquet writer keeps ~7 KB of metadata per row group in memory until close: a
        # replay's results, written 65,536 rows at a time, grew a process by 63 MB over 325M
        # I/Os. Larger groups slow that growth down, for the memory of the rows held.
        self._group_rows = group_rows
        self._compression = compression
        self._held, self._held_rows = [], 0
        self._schema = pa.schema([pa.field(name, type_) for name, type_ in columns])
        self._metadata = _json_object(self.path, metadata, "metadata")
        self._metadata["schema_version"] = schema.SCHEMA_VERSION
        # The claim (traces.outputs) keeps a second writer of `path` out while this one
        # writes; without `force` it also refuses a `path` that exists. `claimed`: the
        # caller holds the claim already (a journal being converted into `path`).
        self._claim = None if claimed else Claim(self.path, force)
        self._tmp = self._claim.tmp if self._claim else \
            self.path.with_name(f"{self.path.name}.{secrets.token_hex(4)}.partial")
        self._journal_s = journal_s
        self._journal = None
        self._writer = None
        self._direct_fd = None  # journal mode: the unnamed Parquet file, or None
        self._encoder = None  # journal mode: the _Encoder of the Parquet file's row groups
        self.rows = 0
        try:
            if journal_s is None:
                self._writer = self._parquet_writer(self._tmp)
            else:
                self._open_journal(beside)
        except BaseException:
            self._close_quietly()
            self._tmp.unlink(missing_ok=True)
            self._release()
            raise
        self._open = True

    def _release(self):
        if self._claim is not None:
            self._claim.release()

    def _parquet_writer(self, path):
        # store_schema=False: Parquet's own logical types keep uint8/uint32, and without
        # the serialised Arrow schema readers see the footer metadata written at close,
        # not a stale copy taken at open.
        # Dictionary encoding only pays for `comm`: on nanosecond and offset columns it
        # cost more than half of a replay's Python time (12 of 20 s over 30M rows).
        # Delta encoding suits the clock columns, which mostly rise: with lz4, results
        # were written in 100 instead of 156 ns a row and took 11 instead of 25 bytes.
        # It suits the other integer columns too: bit-packed, they leave the compressor
        # far fewer bytes. 1M rows of a vscsi2 import (5 columns, zstd) were encoded in 43
        # instead of 80 ns a row, into 10.2 instead of 10.1 bytes, and read no slower; 128k
        # rows of results (lz4) in 56 instead of 64 ns, into 17.6 instead of 21.0 bytes.
        # ts_ns so packed is left uncompressed: zstd found nothing more in it (2.53 bytes).
        return pq.ParquetWriter(
            path, self._schema, store_schema=False,
            compression={n: "none" if n == "ts_ns" else self._compression for n in self._schema.names},
            use_dictionary=[n for n in self._schema.names if n == "comm"] or False,
            column_encoding={n: "DELTA_BINARY_PACKED" for n, t in zip(self._schema.names, self._schema.types)
                             if pa.types.is_integer(t)},
        )

    def _open_journal(self, beside):
        # OSFile is unbuffered: each batch is in the kernel's page cache once written, so
        # a SIGKILL loses none of it.
        self._sink = pa.OSFile(str(self._tmp), "wb")
        self._journal = _Journal(self._sink, self._schema,
                                 json.dumps(self._metadata, sort_keys=True).encode())
        self._sink_fd = os.open(self._tmp, os.O_RDONLY)  # for fsync; OSFile has no fileno
        # The claim's flock is held while the journal is written (the kernel drops it with
        # the process, however it dies): `journal_in_use` tells a live journal from a killed run's.
        _fsync_directory(self._tmp.parent)  # the journal's name survives a power cut too
        # fsync from a thread every journal_s while rows came: a write followed by a long
        # idle stretch (a timed trace's quiet hour) is on the disk journal_s later too.
        self._dirty = False
        self._stop_sync = threading.Event()
        self._syncer = threading.Thread(target=self._sync_loop, name="journal-fsync", daemon=True)
        self._syncer.start()
        if beside:
            self._open_direct()

    def _open_direct(self):
        """The Parquet file written beside the journal, so that `close` need not read the
        journal back (which cost 60 ns a row, more than the replay of a null run): unnamed
        (O_TMPFILE) until `close` links it, so a killed run leaves only its journal."""
        try:
            fd = os.open(self._tmp.parent, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o644)
        except (OSError, AttributeError):
            return  # a filesystem without unnamed files: close converts the journal
        try:
            # pyarrow writes through its own descriptor of the same file, without the GIL.
            self._writer = self._parquet_writer(f"/proc/self/fd/{fd}")
        except (pa.ArrowException, OSError):
            os.close(fd)
            return
        self._direct_fd = fd

    def _sync_loop(self):
        while not self._stop_sync.wait(self._journal_s):
            if self._dirty:
                self._dirty = False
                try:
                    os.fsync(self._sink_fd)
                except OSError:
                    pass  # a full disk shows in the next write or at close, in the main thread

    @property
    def tmp_path(self) -> Path:
        return self._tmp

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self._open:
            return
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write(self, chunk: dict[str, np.ndarray]) -> None:
        """Append `chunk` (every column of the schema, equal lengths) as a row group."""
        self._check_open()
        names = self._schema.names
        missing = [n for n in names if n not in chunk]
        extra = [n for n in chunk if n not in names]
        if missing or extra:
            raise TraceFormatError(
                self.path,
                f"chunk columns do not match the writer's: missing {missing}, unexpected {extra}",
            )
        sizes = {len(chunk[n]) for n in names}
        if len(sizes) > 1:
            raise TraceFormatError(self.path, f"chunk columns differ in length: {sorted(sizes)}")
        arrays = []
        for field in self._schema:
            try:
                arrays.append(pa.array(chunk[field.name], type=field.type))
            except (pa.ArrowException, TypeError, ValueError) as exc:
                raise TraceFormatError(
                    self.path,
                    f"values cannot be stored as {field.type} ({exc})",
                    column=field.name,
                ) from None
        if not len(arrays[0]):
            return
        if self._journal is not None:
            batch = pa.RecordBatch.from_arrays(arrays, schema=self._schema)
            self._journal.write(batch)
            self.rows += len(arrays[0])
            self._dirty = True
            if self._direct_fd is not None:
                try:
                    self._append(pa.Table.from_batches([batch]))
                except (pa.ArrowException, OSError):
                    self._drop_direct()  # the journal has every row: close converts it
            return
        self._append(pa.Table.from_arrays(arrays, schema=self._schema))

    def _append(self, table: pa.Table) -> None:
        self._held.append(table)
        self._held_rows += table.num_rows
        if self._journal is None:  # a journal counts its own rows
            self.rows += table.num_rows
        if self._group_rows is None or self._held_rows >= self._group_rows:
            self._flush()

    def _drop_direct(self) -> None:
        """Give up the Parquet file written beside the journal; the kernel frees it."""
        self._join_encoder()
        self._stop_encoder()
        if self._direct_fd is None:
            return
        self._held, self._held_rows = [], 0
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                writer.close()
        except (pa.ArrowException, OSError, ValueError):
            pass
        os.close(self._direct_fd)
        self._direct_fd = None

    def _flush(self) -> None:
        if self._held:
            table = pa.concat_tables(self._held)
            self._held, self._held_rows = [], 0
            if self._direct_fd is not None:
                self._encode_behind(table)
            else:
                self._writer.write_table(table, row_group_size=min(table.num_rows, MAX_ROW_GROUP_ROWS))

    def _encode_behind(self, table: pa.Table) -> None:
        """Journal mode: encode the row group on a thread while the next one gathers, one at
        a time. Parquet's encoding (38 ns a row, a third of a null replay's own thread) then
        overlaps the replay, for the memory of one more row group. One thread for the whole
        file: a thread per row group drew a new allocator arena each time, whose retained
        pages took 30 MB more. A failure drops the file (`_join_encoder`): close converts
        the journal instead."""
        self._join_encoder()
        if self._direct_fd is None:
            return
        if self._encoder is None:
            self._encoder = _Encoder(self._writer)
        self._encoder.encode(table)

    def _join_encoder(self) -> None:
        """Wait for the row group being encoded; drop the Parquet file if that failed."""
        if self._encoder is not None and not self._encoder.wait():
            self._stop_encoder()
            self._drop_direct()

    def _stop_encoder(self) -> None:
        if self._encoder is not None:
            self._encoder.stop()
            self._encoder = None

    def close(self, extra_metadata=None, look=None) -> Path:
        """Merge `extra_metadata` (or what it returns, when it is a function called once every
        row is in the file) into the JSON object, finish the file and move it into place.
        `look`, for a journal's writer, is called with each batch of rows as the journal is
        converted (which it then is, even where the rows also went into the file as they came)."""
        self._check_open()
        extra = extra_metadata
        if not callable(extra):  # checked before anything is closed
            extra = _json_object(self.path, extra or {}, "extra metadata")
        if self._journal is not None:
            return self._close_journal(extra, look)
        try:
            self._flush()
            self._finish(self._writer, self._tmp, self._called(extra))
        except BaseException:
            self.abort()
            raise
        return self.path

    def _called(self, extra) -> dict:
        """`close`'s extra metadata, called if a function."""
        return _json_object(self.path, extra() or {}, "extra metadata") if callable(extra) else extra

    def _finish(self, writer, tmp, extra):
        metadata = {**self._metadata, **extra}
        metadata["schema_version"] = schema.SCHEMA_VERSION
        writer.add_key_value_metadata(
            {schema.METADATA_KEY: json.dumps(metadata, sort_keys=True).encode()}
        )
        writer.close()
        self._open = False
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._release()

    def _close_journal(self, extra, look) -> Path:
        """The journal, ended and synced, converted into the Parquet file at `path`."""
        self._open = False
        try:
            self._journal.close()
            self._journal = None
            os.fsync(self._sink_fd)
        except BaseException as exc:
            self._close_quietly()
            self._release()
            if isinstance(exc, OSError):
                raise JournalKept(self._tmp, self.rows, exc) from None
            raise
        try:
            if look is not None:
                self._drop_direct()  # `look` sees the rows as the journal is converted
            if self._direct_fd is not None:
                try:
                    self._finish_direct(self._called(extra))
                except (pa.ArrowException, OSError):
                    self._drop_direct()  # the journal has every row: convert it as below
            if self._direct_fd is None:
                self._close_quietly()
                convert_journal(self._tmp, self.path, extra, self._compression, self._group_rows, look,
                                claimed=True)
        except OSError as exc:
            raise JournalKept(self._tmp, self.rows, exc) from None
        finally:
            self._close_quietly()
            self._release()
        self._tmp.unlink(missing_ok=True)
        return self.path

    def _finish_direct(self, extra):
        """Complete the Parquet file written beside the journal and give it its name: `path`
        itself when free, else a temporary name renamed over it."""
        self._flush()
        self._join_encoder()
        self._stop_encoder()
        if self._direct_fd is None:
            raise OSError(errno.EIO, "the Parquet file written beside the journal failed")
        metadata = {**self._metadata, **extra}
        self._writer.add_key_value_metadata(
            {schema.METADATA_KEY: json.dumps(metadata, sort_keys=True).encode()})
        writer, self._writer = self._writer, None
        writer.close()
        os.fsync(self._direct_fd)
        parent = self.path.parent if str(self.path.parent) else Path(".")
        dir_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # os.link follows the /proc link (linkat with AT_SYMLINK_FOLLOW) only when given
            # a directory descriptor; a link cannot replace a file, so an existing one
            # (--force) is replaced by a rename.
            link = dict(src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=True)
            source = f"/proc/self/fd/{self._direct_fd}"
            try:
                os.link(source, self.path.name, **link)
            except FileExistsError:
                tmp = f"{self.path.name}.{secrets.token_hex(4)}.tmp"
                os.link(source, tmp, **link)
                try:
                    os.replace(tmp, self.path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                except OSError:
                    os.unlink(tmp, dir_fd=dir_fd)
                    raise
        finally:
            os.close(dir_fd)

    def keep(self) -> Path:
        """Stop writing and leave the journal where it is (for `read_journal`); returns it."""
        self._open = False
        self._close_quietly()
        self._release()
        return self._tmp

    def _close_quietly(self):
        if getattr(self, "_encoder", None) is not None:
            self._stop_encoder()  # before the writer it uses is closed
        syncer = getattr(self, "_syncer", None)
        if syncer is not None:
            self._stop_sync.set()
            syncer.join()  # before its fd is closed
            self._syncer = None
        for close in (getattr(self._journal, "close", None), getattr(self._writer, "close", None),
                      getattr(getattr(self, "_sink", None), "close", None)):
            if close is not None:
                try:
                    close()
                except (pa.ArrowException, OSError, ValueError):
                    pass
        self._journal = self._writer = None
        fd = getattr(self, "_sink_fd", None)
        if fd is not None:
            os.close(fd)
            self._sink_fd = None
        if self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None

    def abort(self) -> None:
        """Discard everything written; `path` is left as it was."""
        self._held = []
        self._open = False
        self._close_quietly()
        self._tmp.unlink(missing_ok=True)
        self._release()

    def _check_open(self):
        if not self._open:
            raise ValueError(f"TraceWriter for {self.path} is already closed")


class _Encoder:
    """A thread that writes row groups with a ParquetWriter, one at a time: `encode` hands it
    the next (after `wait` for the last), `wait` says whether every one so far was written."""

    def __init__(self, writer):
        self._writer = writer
        self._ok = True
        self._next = None
        self._ready = threading.Semaphore(0)  # a row group (or None: stop) to write
        self._idle = threading.Semaphore(1)  # the last one is written
        self._thread = threading.Thread(target=self._loop, name="results-parquet", daemon=True)
        self._thread.start()

    def _loop(self):
        while True:
            self._ready.acquire()
            table, self._next = self._next, None
            if table is None:
                return
            try:
                if self._ok:
                    self._writer.write_table(table, row_group_size=min(table.num_rows, MAX_ROW_GROUP_ROWS))
            except (pa.ArrowException, OSError):
                self._ok = False
            del table
            self._idle.release()

    def encode(self, table: pa.Table) -> None:
        self._idle.acquire()
        self._next = table
        self._ready.release()

    def wait(self) -> bool:
        self._idle.acquire()
        self._idle.release()
        return self._ok

    def stop(self) -> None:
        self._idle.acquire()
        self._next = None
        self._ready.release()
        self._thread.join()


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JournalKept(OSError):
    """The results could not be finished (a full disk): their journal is kept at `journal`."""

    def __init__(self, journal: Path, rows: int, cause: OSError):
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.journal, self.rows, self.cause = Path(journal), rows, cause


def journal_in_use(path) -> bool:
    """True while a TraceWriter is still writing the journal at `path`."""
    return held(path)


class _Journal:
    """A results journal being written into `sink`: Arrow IPC streams one after another. The
    first has the results' schema, with `metadata` (the metadata known at open, for
    `read_journal`), and no rows: on disk before the first row is done. The next hold the rows,
    lz4-compressed, each int64 column without nulls stored as `_to_journal` says, in the
    narrowest integer type that holds it. lz4 reads fewer bytes so: `write` took 30 instead of
    43 ns a row of a 70/30 QD32 run's 64K-row chunks (lz4 alone took 8 ns a row over random
    offsets as int64, 0.3 as int32), into 11.4 instead of 15.2 bytes. A batch that needs a wider type than
    the stream's starts a stream whose types are the wider of each; so a run starts a few
    streams at most (three widenings per column). No change in IOPS came of it (as fast as
    possible, 5 rows on zram and a loop device over /dev/shm, 10 alternating rounds: 0.999-1.013
    of the wider journal's), but less CPU and disk for every run."""

    _OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4", use_threads=False)

    def __init__(self, sink, schema_: pa.Schema, metadata: bytes):
        self._sink, self._schema = sink, schema_
        with pa.ipc.new_stream(sink, schema_.with_metadata({schema.METADATA_KEY: metadata})) as head:
            head.write_batch(pa.RecordBatch.from_pylist([], schema=schema_))
        self._stream, self._types = None, None
        # The arrays a batch is stored from, by column: write_batch has compressed
        # and written them when it returns, so the next batch reuses them (fresh arrays of a
        # 64K-row chunk cost 2 ns a row more in page faults).
        self._scratch = {}

    def write(self, batch: pa.RecordBatch) -> None:
        arrays, custom = _to_journal(batch, self._scratch, self._types)
        types = [a.type for a in arrays]
        if types != self._types:
            self.close()
            stream_schema = pa.schema([(f.name, t) for f, t in zip(self._schema, types)])
            self._stream = pa.ipc.new_stream(self._sink, stream_schema, options=self._OPTIONS)
            self._types = types
        self._stream.write_batch(pa.RecordBatch.from_arrays(arrays, names=self._schema.names), custom)

    def close(self) -> None:
        """End the stream being written (the sink stays open)."""
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()


def _to_journal(batch: pa.RecordBatch, scratch: dict, floor=None) -> tuple[list, dict]:
    """The batch's arrays as the journal stores them and the custom metadata that says how.
    The int64 columns without nulls: the clock columns as differences (_JOURNAL_DIFFS), each
    in the narrowest of _JOURNAL_WIDTHS that holds it and is at least as wide as `floor`'s type
    of that column (the stream's), written into `scratch`'s arrays, which it grows."""
    names = batch.schema.names
    arrays = list(batch.columns)
    ints = {name: a.to_numpy() for name, a in zip(names, arrays) if a.type == pa.int64() and not a.null_count}
    stored, diffs = dict(ints), []
    for name, base in _JOURNAL_DIFFS:
        # The reader adds a difference from another column to that column's sum: one taken too.
        if name not in ints or (base is not None and not any(d[0] == base for d in diffs)):
            continue
        x = ints[name]
        d = stored[name] = _scratch_array(scratch, name, np.int64, len(x))
        if base is None:  # from the row before; the first row's from itself, its value in the entry
            d[:1] = 0
            np.subtract(x[1:], x[:-1], out=d[1:])
            diffs.append([name, None, int(x[0]) if len(x) else 0])
        else:
            np.subtract(x, ints[base], out=d)  # wraps on overflow, as the sum back does
            diffs.append([name, base])
    for i, name in enumerate(names):
        if name not in stored:
            continue
        x = stored[name]
        lo, hi = (int(x.min()), int(x.max())) if len(x) else (0, 0)
        least = _JOURNAL_WIDTHS.index(floor[i]) if floor else 0
        type_ = next(t for t in _JOURNAL_WIDTHS[least:] if _fits(t, lo, hi))
        if type_ != pa.int64():
            out = _scratch_array(scratch, (name, "stored"), type_.to_pandas_dtype(), len(x))
            np.copyto(out, x, casting="unsafe")
            x = out
        arrays[i] = pa.array(x)
    return arrays, {"diffs": json.dumps(diffs)} if diffs else {}


def _fits(type_: pa.DataType, lo: int, hi: int) -> bool:
    bound = 1 << (type_.bit_width - 1)
    return -bound <= lo and hi < bound


def _scratch_array(scratch: dict, key, dtype, n: int) -> np.ndarray:
    held = scratch.get(key)
    if held is None or len(held) < n or held.dtype != dtype:
        held = scratch[key] = np.empty(n, dtype)
    return held[:n]


def _from_journal(batch: pa.RecordBatch, metadata, schema_: pa.Schema) -> pa.RecordBatch:
    """A journal's batch as it was written: in `schema_`'s types, the differences
    `_to_journal` took added back."""
    arrays = [a if a.type == t else a.cast(t) for a, t in zip(batch.columns, schema_.types)]
    raw = (metadata or {}).get(b"diffs")
    if raw is not None:  # None: a journal of a version that stored the values themselves
        names, values = schema_.names, {}
        for name, base, *start in json.loads(raw):
            i = names.index(name)
            d = arrays[i].to_numpy()
            if base is None:  # older journals kept the first value as the first difference
                values[name] = np.cumsum(d) + (start[0] if start else 0)
            else:
                values[name] = d + values[base]
            arrays[i] = pa.array(values[name])
    return pa.RecordBatch.from_arrays(arrays, schema=schema_)


def read_journal(path) -> tuple[pa.Schema, dict, Iterator[pa.RecordBatch]]:
    """A results journal (`TraceWriter(journal_s=...)`'s `.partial`): its schema, the metadata
    known when it was opened, and its batches up to the last complete one (a killed run's
    journal ends mid-batch)."""
    path = Path(path)
    try:
        # Read, not mapped: pages of a mapped file count in the process's RSS as they are read.
        source = pa.OSFile(str(path))
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowException, OSError) as exc:
        raise TraceFormatError(path, f"not a results journal ({exc}); give a .partial file "
                                     "that a replay run left") from None
    raw = (reader.schema.metadata or {}).get(schema.METADATA_KEY)
    metadata = _parse_metadata(path, raw)
    schema_ = reader.schema.remove_metadata()

    def batches(reader):
        while True:
            try:
                yield _from_journal(*reader.read_next_batch_with_custom_metadata(), schema_)
            except StopIteration:  # the end of a stream: the next one starts after it, if any
                try:
                    reader = pa.ipc.open_stream(source)
                except (pa.ArrowException, OSError):
                    return
            except (pa.ArrowException, OSError):  # the batch a kill cut short
                return

    return schema_, metadata, batches(reader)


def convert_journal(journal, path, extra_metadata=None, compression="lz4", group_rows=None,
                    look=None, force=True, claimed=False) -> Path:
    """Write a journal's rows as the Parquet file `path` (atomically), merging
    `extra_metadata` (or what it returns, when it is a function called once every row is
    written) into the metadata the journal was opened with; `look`, if given, is called with
    each batch on the way (a summary of the rows). `force` and `claimed` as for TraceWriter."""
    journal_schema, metadata, own = read_journal(journal)
    columns = [(f.name, f.type) for f in journal_schema]
    metadata.pop("schema_version", None)
    group_rows = group_rows or MAX_ROW_GROUP_ROWS
    out = TraceWriter(path, columns, metadata, compression=compression, group_rows=group_rows,
                      force=force, claimed=claimed)
    try:
        for batch in own:
            if batch.num_rows:
                if look:
                    look(batch)
                table = pa.Table.from_batches([batch])
                # A cast where the types already match is a copy, and its first use imports
                # pyarrow.compute (0.09 s of CPU, a tenth of a 1M-I/O replay's Python time).
                out._append(table if table.schema == out._schema else table.cast(out._schema))
        return out.close(extra_metadata)  # a function too: `close` calls it once every row is in
    except BaseException:
        out.abort()
        raise


def write_trace(path, columns: dict[str, np.ndarray], metadata: dict) -> Path:
    """Validate `columns` by the reader's rules and write them as a trace at `path`."""
    path = Path(path)
    unknown = [n for n in columns if n not in _COLUMN_TYPES]
    if unknown:
        raise TraceFormatError(
            path,
            f"unknown column; a trace holds only {', '.join(_COLUMN_TYPES)}",
            column=unknown[0],
        )
    for name in _REQUIRED_TYPES:
        if name not in columns:
            raise TraceFormatError(
                path,
                "missing required column; a trace needs " + ", ".join(_REQUIRED_TYPES),
                column=name,
            )
    chunk = {name: _coerce(path, name, values) for name, values in columns.items()}
    sizes = {name: len(values) for name, values in chunk.items()}
    if len(set(sizes.values())) > 1:
        raise TraceFormatError(path, f"columns differ in length: {sizes}")
    _check_chunk(path, chunk, 0, None)
    fields = [(name, _COLUMN_TYPES[name][0]) for name in _COLUMN_TYPES if name in chunk]
    if chunk["length"].dtype == np.uint32:
        fields = [(n, pa.uint32() if n == "length" else t) for n, t in fields]
    with TraceWriter(path, fields, metadata) as writer:
        for start in range(0, sizes["ts_ns"], MAX_ROW_GROUP_ROWS):
            stop = start + MAX_ROW_GROUP_ROWS
            writer.write({name: values[start:stop] for name, values in chunk.items()})
    return path


def _coerce(path, name, values) -> np.ndarray:
    """`values` as a 1-D array of the column's dtype, refusing lossy conversions."""
    values = np.asarray(values)
    if values.ndim != 1:
        raise TraceFormatError(path, f"column must be 1-D, not {values.ndim}-D", column=name)
    arrow_type = _COLUMN_TYPES[name][0]
    if pa.types.is_string(arrow_type):
        if values.dtype.kind not in "UO":
            raise TraceFormatError(
                path, f"column has dtype {values.dtype}, expected strings", column=name
            )
        return values
    if name == "length" and values.dtype in schema.LENGTH_DTYPES:
        return values
    dtype = np.dtype(arrow_type.to_pandas_dtype())
    if values.dtype == dtype:
        return values
    # An empty list becomes a float64 array; there is nothing in it to lose.
    if values.dtype.kind not in "iu" and not (values.size == 0 and values.dtype.kind == "f"):
        raise TraceFormatError(
            path, f"column has dtype {values.dtype}, expected {dtype}", column=name
        )
    limits = np.iinfo(dtype)
    out_of_range = (values < limits.min) | (values > limits.max)
    if out_of_range.any():
        i = int(out_of_range.argmax())
        raise TraceFormatError(
            path, f"value {values[i]} does not fit in {dtype}", column=name, row=i
        )
    return values.astype(dtype)
