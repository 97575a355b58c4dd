"""Importing foreign trace formats into Parquet traces and exporting traces for other tools.

Also the machinery the text importers share: block-wise CSV reading with pyarrow (errors
located to a line by a slow rescan, only on the error path), per-file ordering with an
optional reorder window, and a bounded-memory merge of several time-ordered inputs.
"""
import contextlib
import datetime
import gc
import gzip
import io
import itertools
import lzma
import os
import queue
import threading
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from traces import formats, schema
from traces.errors import ReplayError, TraceFormatError
from traces.formats.inputs import compression
from traces.schema import Op
from traces.trace import TraceWriter, _check_chunk, open_trace

BLOCK_BYTES = 16 << 20  # text per parse: ~320k MSR rows, ~15 MB of arrays per chunk
REQUIRED = tuple(schema.TRACE_COLUMNS)
_ARROW_TYPES = {**{n: pa.from_numpy_dtype(d) for n, d in schema.TRACE_COLUMNS.items()},
                **schema.OPTIONAL_COLUMNS}
_ORDER = (*REQUIRED, *schema.OPTIONAL_COLUMNS)


# ----------------------------------------------------------------------------- input


class InputMeter:
    """Bytes read so far from the raw (possibly compressed) input files, for progress."""

    def __init__(self, paths):
        self.total = sum(os.path.getsize(p) for p in paths if os.path.isfile(p))
        self.done = 0


class _Counting(io.RawIOBase):
    def __init__(self, raw, meter):
        self._raw, self._meter = raw, meter

    def readable(self):
        return True

    def readinto(self, buffer):
        n = self._raw.readinto(buffer)
        if self._meter is not None and n:
            self._meter.done += n
        return n

    def close(self):
        self._raw.close()
        super().close()


def open_text(path, meter=None, buffered=True) -> io.BufferedIOBase:
    """A binary reader over `path`, decompressed by content, counting raw bytes into `meter`.

    buffered=False gives the decompressor itself, whose read1 is one decompression step:
    no buffer above it can swallow the bytes read before an error (see read_block)."""
    path = Path(path)
    kind = compression(path)
    try:
        raw = io.BufferedReader(_Counting(open(path, "rb", buffering=0), meter), 1 << 20)
    except OSError as e:
        raise TraceFormatError(path, f"cannot read: {e.strerror}") from None
    wrap = (lambda f: io.BufferedReader(f, 1 << 20)) if buffered else (lambda f: f)
    if kind == "gzip":
        return wrap(gzip.GzipFile(fileobj=raw, mode="rb"))
    if kind == "xz":
        return wrap(lzma.LZMAFile(raw, "rb"))
    if kind == "zstd":
        return wrap(_Zstd(raw))
    return raw


class _Zstd(io.RawIOBase):
    """A zstd stream, frame after frame. zstandard's stream_reader ends quietly where a cut
    file ends; this one raises EOFError there, as gzip and lzma do, so a cut is named."""

    def __init__(self, raw):
        import zstandard

        self._raw, self._new = raw, zstandard.ZstdDecompressor().decompressobj
        self._frame, self._out, self._input_left = self._new(), b"", b""

    def readable(self):
        return True

    def readinto(self, buffer):
        while not self._out:
            data = self._input_left or self._raw.read(1 << 17)
            self._input_left = b""
            if not data:
                if self._frame is not None:
                    raise EOFError("zstd data ends inside a frame")
                return 0
            if self._frame is None:
                self._frame = self._new()
            self._out = self._frame.decompress(data)
            if self._frame.eof:
                self._input_left, self._frame = self._frame.unused_data, None
        n = min(len(buffer), len(self._out))
        buffer[:n], self._out = self._out[:n], self._out[n:]
        return n

    def close(self):
        self._raw.close()
        super().close()


def _read_errors():
    errors = (OSError, EOFError, lzma.LZMAError, gzip.BadGzipFile, zlib.error)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


READ_ERRORS = _read_errors()


def iter_lines(path, skip_rows=0):
    """(line number, bytes without the newline) for every non-empty line after `skip_rows`.

    A Python loop per line: only for error paths and small headers, never the bulk read.
    The lines before a read error come out before it (a header is read from a cut file).
    """
    number, carry = 0, b""
    try:
        f = open_text(path, buffered=False)
    except READ_ERRORS as e:
        raise read_error(path, 1, e) from None
    with f:
        while True:
            data, error = read_block(f, 1 << 16)
            lines = (carry + data).split(b"\n")
            carry = lines.pop() if data or error else b""
            for line in lines:
                number += 1
                line = line.rstrip(b"\r")
                if number > skip_rows and line:
                    yield number, line
            if error is not None:
                raise read_error(path, number + 1, error)
            if not data:
                return


def read_error(path, line, exc) -> TraceFormatError:
    """The error for a read that failed in `line`: a compressed input that stops before its
    end marker is truncated (the lines before are intact); other failures are damage."""
    kind = compression(Path(path))
    if kind is None:
        return TraceFormatError(path, f"line {line}: cannot read ({exc})")
    size = os.path.getsize(path)
    if isinstance(exc, EOFError):
        return TraceFormatError(path, f"line {line}: the {kind} data stops here, at the end of "
                                f"the {size}-byte file, before its end marker: the file is "
                                "truncated (the lines before it are intact)")
    return TraceFormatError(path, f"line {line}: cannot decompress ({exc}); the {size}-byte "
                            f"{kind} file is damaged")


def read_block(f, size):
    """(up to `size` bytes of `f`, the read error or None). Compressed input is read one
    decompression step at a time, so an error keeps the bytes that came before it: they
    say in which line the input stops."""
    parts, got = [], 0
    read = getattr(f, "read1", None) or f.read
    try:
        while got < size:
            piece = read(size - got)
            if not piece:
                break
            parts.append(piece)
            got += len(piece)
    except READ_ERRORS as exc:
        return b"".join(parts), exc
    return b"".join(parts), None


def first_record(path, parse, checker, otherwise, time_of=None, scale=1, outliers=None):
    """(line number, parse(line)) of the first line of `path`, or None for an empty file. A
    first line that `parse` refuses (None) is a TraceFormatError naming the field `checker`
    finds at fault, or saying `otherwise` when every field has the right kind.

    With `time_of` (parsed -> time, `scale` ns a unit), for a format whose times count from
    its first record: a first record that is an outlier (see Outliers) is refused, naming
    its line. With outliers.drop, a first record later than the rest gives way to the second
    as the origin; an earlier one stays the origin, and import_trace moves the times once the
    record is dropped (ZERO_AT_FIRST). Either way no kept time is negative.
    """
    lines = iter_lines(path)
    first = next(lines, None)
    if first is None:
        return None
    parsed = parse(first[1].decode("utf-8", "replace"))
    if parsed is None:
        raise TraceFormatError(path, f"line {first[0]}: {checker(first[1]) or otherwise}")
    if time_of is None:
        return first[0], parsed
    after = [(number, parse(line.decode("utf-8", "replace"))) for number, line in itertools.islice(lines, 2)]
    if len(after) < 2 or after[0][1] is None or after[1][1] is None:
        return first[0], parsed
    t0, t1, t2 = (float(time_of(p)) for p in (parsed, after[0][1], after[1][1]))
    limit = MAX_GAP_NS / scale
    if abs(t1 - t0) > limit and abs(t2 - t1) <= limit:
        if outliers is None or not outliers.drop:
            raise outlier_error(path, first[0], abs(t1 - t0) * scale)
        if t0 > t1:
            return after[0]
    return first[0], parsed


def outlier_error(path, line, gap_ns) -> TraceFormatError:
    return TraceFormatError(path, f"line {line}: this record's time is {span_text(gap_ns)} away "
                            f"from the records around it (more than {span_text(MAX_GAP_NS)}): a "
                            "damaged timestamp; --drop-outliers leaves such records out")


def device_option(options, what: str) -> int | None:
    """The importer option --device as an integer, or None when not given."""
    wanted = options.get("device")
    if wanted is None:
        return None
    try:
        return int(wanted)
    except ValueError:
        raise ReplayError(f"--device must be a {what} number, not {wanted!r}") from None


def first_lines(head: bytes, count=1) -> list[str]:
    """Up to `count` non-empty lines from a sniffing head (the last, maybe cut, is dropped).

    One by default: a bad record further on is then reported by line, not as an unknown format.
    """
    text = head.decode("utf-8", "replace").splitlines()
    if len(head) >= 65536 and text:
        text = text[:-1]
    return [line for line in text if line.strip()][:count]


def line_of_row(path, row, skip_rows=0) -> int:
    """The 1-based line number of data row `row` (0-based, empty lines not counted)."""
    for i, (number, _) in enumerate(iter_lines(path, skip_rows)):
        if i == row:
            return number
    return -1


def fail_at(path, row, problem, skip_rows=0):
    """A TraceFormatError for data row `row` of `path`, naming its line."""
    return TraceFormatError(path, f"line {line_of_row(path, row, skip_rows)}: {problem}")


def field_checker(kinds, min_fields=None, delimiter=","):
    """A per-line checker for the error path: `kinds` is a sequence of 'int', 'float', 'str'."""

    def check(line: bytes) -> str | None:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            return f"not UTF-8 text at column {e.start + 1}"
        parts = text.split(delimiter) if delimiter != " " else text.split(" ")
        need = len(kinds) if min_fields is None else min_fields
        if len(parts) < need or (min_fields is None and len(parts) != len(kinds)):
            return f"expected {len(kinds)} fields separated by {delimiter!r}, found {len(parts)}"
        for i, (kind, part) in enumerate(zip(kinds, parts), 1):
            value = part.strip()
            try:
                if kind == "int":
                    int(value)
                elif kind == "float":
                    float(value)
            except ValueError:
                return f"field {i} is {value[:40]!r}, expected {'an integer' if kind == 'int' else 'a number'}"
        return None

    return check


def read_blocks(path, names, types, *, check_line, delimiter=",", skip_rows=0,
                include=None, meter=None, block_bytes=BLOCK_BYTES, quoted=False):
    """Yield (first data row, RecordBatch) over a delimited text file, in bounded memory.

    The file is cut into blocks of whole lines, each parsed by pyarrow's multi-threaded
    read_csv (its streaming reader parses on one core: 2.0 M MSR rows/s against 5.2 M/s
    measured on the 2-core VM). When pyarrow refuses a block, the file is rescanned line
    by line with `check_line` to name the first bad line (only on that error path).
    """
    # A plain file is read by pyarrow without the GIL; compressed ones go through Python's
    # decompressors, which count raw bytes themselves.
    plain = compression(Path(path)) is None
    try:
        f = pa.OSFile(str(path), "rb") if plain else open_text(path, meter, buffered=False)
    except OSError as e:
        raise TraceFormatError(path, f"cannot read: {e}") from None
    read_options = pacsv.ReadOptions(column_names=names, block_size=1 << 22)
    parse_options = pacsv.ParseOptions(delimiter=delimiter, quote_char='"' if quoted else False,
                                       double_quote=quoted)
    convert_options = pacsv.ConvertOptions(
        column_types=types, include_columns=include or names, strings_can_be_null=False,
        quoted_strings_can_be_null=False, null_values=[])
    try:
        carry, row, skip, done, lines = b"", 0, skip_rows, False, 0
        while not done:
            data, error = read_block(f, block_bytes)
            if error is not None:
                raise read_error(path, lines + (carry + data).count(b"\n") + 1, error)
            if plain and meter is not None:
                meter.done = min(meter.total, meter.done + len(data))
            if data:
                data = carry + data
                cut = data.rfind(b"\n") + 1
                block, carry = (data[:cut], data[cut:]) if cut else (b"", data)
            else:
                block, carry, done = carry, b"", True
            lines += block.count(b"\n")
            while skip and block:
                cut = block.find(b"\n") + 1 or len(block)
                block, skip = block[cut:], skip - 1
            if not block or block.isspace():
                continue
            try:
                table = pacsv.read_csv(pa.BufferReader(block), read_options=read_options,
                                       parse_options=parse_options, convert_options=convert_options)
            except pa.ArrowInvalid as exc:
                raise locate_line(path, exc, check_line, skip_rows) from None
            del block
            for batch in table.combine_chunks().to_batches():
                yield row, batch
                row += batch.num_rows
    except READ_ERRORS as exc:
        raise read_error(path, lines + 1, exc) from None
    finally:
        f.close()


def locate_line(path, exc, check_line, skip_rows=0):
    """The error naming the first line `check_line` finds at fault (a slow rescan)."""
    for number, line in iter_lines(path, skip_rows):
        problem = check_line(line)
        if problem:
            return TraceFormatError(path, f"line {number}: {problem}")
    return TraceFormatError(path, f"cannot parse ({exc})")


WORD = pa.dictionary(pa.int32(), pa.string())  # column type for op words: few distinct values


def numpy_of(column) -> np.ndarray:
    return column.to_numpy(zero_copy_only=False)


def op_from_words(path, column, words: dict, row0, skip_rows=0, strip=False):
    """uint8 op codes from a string column, by an exact (or stripped) word -> Op mapping.

    A dictionary-encoded column is mapped through its few distinct words, then indexed.
    """
    if pa.types.is_dictionary(column.type):
        dictionary = column.dictionary
        if strip:
            dictionary = pc.utf8_trim_whitespace(dictionary)
        table = np.array([words.get(w, 255) for w in dictionary.to_pylist()] or [255], dtype=np.uint8)
        op = table[numpy_of(column.indices)] if len(column) else np.zeros(0, np.uint8)
        column = column.cast(pa.string()) if (op == 255).any() else column
    else:
        if strip:
            column = pc.utf8_trim_whitespace(column)
        op = np.full(len(column), 255, dtype=np.uint8)
        for word, code in words.items():
            op[numpy_of(pc.equal(column, word))] = code
    if (bad := op == 255).any():
        i = int(bad.argmax())
        raise fail_at(path, row0 + i, f"unknown operation {column[i].as_py()!r}; expected one "
                      f"of {', '.join(sorted(set(words)))}", skip_rows)
    return op


def check_rows(path, chunk, row0, skip_rows=0) -> None:
    """Offsets >= 0, ts >= 0, lengths > 0 for data I/Os; errors name the line."""
    found = []
    if (bad := chunk["ts_ns"] < 0).any():
        found.append((int(bad.argmax()), "time before the first record's; is the file sorted by time?"))
    if (bad := chunk["offset"] < 0).any():
        found.append((int(bad.argmax()), "negative offset"))
    data = (chunk["op"] == Op.READ) | (chunk["op"] == Op.WRITE) | (chunk["op"] == Op.DISCARD)
    if (bad := data & (chunk["length"] <= 0)).any():
        found.append((int(bad.argmax()), "size must be greater than 0 for a read, write or discard"))
    if (bad := chunk["length"] < 0).any():
        found.append((int(bad.argmax()), "negative size"))
    if found:
        row, problem = min(found)
        raise fail_at(path, row0 + row, problem, skip_rows)


class Ordered:
    """Makes one input's chunks non-decreasing in ts_ns.

    window_ns == 0: any decrease is an error naming its line. window_ns > 0: rows are held
    back and stably sorted until they are `window_ns` older than the newest row seen, so
    small disorder (per-CPU capture interleaving) is repaired in bounded memory; a row
    arriving later than that is an error naming its line.
    """

    def __init__(self, path, window_ns=0, skip_rows=0, line_of=None):
        self.path, self.window, self.skip = path, int(window_ns), skip_rows
        self.line_of = line_of or (lambda row: line_of_row(path, row, skip_rows))
        self.last = None
        self.held = None  # chunk dict plus "_row"

    def push(self, chunk, row0):
        """`chunk` may carry "_row", the data row of each of its rows (after filtering)."""
        ts = chunk["ts_ns"]
        rows = chunk.get("_row")
        if rows is None:
            rows = np.arange(row0, row0 + len(ts), dtype=np.int64)
        if self.window == 0:
            chunk = {k: v for k, v in chunk.items() if k != "_row"}
            if len(ts):
                if self.last is not None and ts[0] < self.last:
                    raise self._late(int(rows[0]), self.last, ts[0])
                if (down := ts[1:] < ts[:-1]).any():
                    i = int(down.argmax())
                    raise self._late(int(rows[i + 1]), ts[i], ts[i + 1])
                self.last = int(ts[-1])
            return chunk
        # Disorder beyond the window is an error, within a chunk as across chunks.
        newest = max([self.last if self.last is not None else ts[0] if len(ts) else 0]
                     + ([int(self.held["ts_ns"].max())] if self.held is not None and len(self.held["ts_ns"]) else []))
        if len(ts):
            lag = np.maximum.accumulate(np.maximum(ts, newest)) - ts
            if (late := lag > self.window).any():
                i = int(late.argmax())
                raise TraceFormatError(
                    self.path,
                    f"line {self.line_of(int(rows[i]))}: time goes back by "
                    f"{lag[i] / 1e9:.6f} s, more than the reorder window of {self.window / 1e9:g} s; "
                    "is the file sorted by time?")
        chunk = dict(chunk, _row=rows)
        held = chunk if self.held is None else concat([self.held, chunk])
        # Sorting only when needed: the published traces are nearly always in order already.
        if (held["ts_ns"][1:] < held["ts_ns"][:-1]).any():
            order = np.argsort(held["ts_ns"], kind="stable")
            held = {k: v[order] for k, v in held.items()}
        if not len(held["ts_ns"]):
            self.held = held
            return None
        cut = np.searchsorted(held["ts_ns"], held["ts_ns"][-1] - self.window, side="right")
        out = {k: v[:cut] for k, v in held.items()}
        self.held = {k: v[cut:] for k, v in held.items()}
        return self._emit(out)

    def finish(self):
        if self.window == 0 or self.held is None:
            return None
        out, self.held = self.held, None
        return self._emit(out)

    def _emit(self, out):
        ts = out["ts_ns"]
        if len(ts) and self.last is not None and ts[0] < self.last:
            raise TraceFormatError(
                self.path,
                f"line {self.line_of(int(out['_row'][0]))}: time goes back "
                f"by {(self.last - ts[0]) / 1e9:.6f} s, more than the reorder window of "
                f"{self.window / 1e9:g} s; is the file sorted by time?")
        if len(ts):
            self.last = int(ts[-1])
        out.pop("_row")
        return out

    def _late(self, row, before, after):
        return TraceFormatError(self.path, f"line {self.line_of(row)}: time goes back (from "
                                f"{before} ns to {after} ns); this format must be sorted by time")


def ordered_chunks(path, chunks_with_rows, window_ns=0, skip_rows=0, outliers=None, scale=1):
    """Apply `Outliers` then `Ordered` to an iterator of (row0, chunk).

    `outliers`: the import's OutlierLog (None: refuse outliers); `scale`: ns per unit of
    the chunks' ts_ns, for a format whose times are still in its own unit here.
    """
    order = Ordered(path, window_ns, skip_rows)
    spikes = Outliers(path, outliers, lambda row: line_of_row(path, row, skip_rows), scale)
    for row0, chunk in chunks_with_rows:
        out = order.push(spikes.push(chunk, row0), row0)
        if out is not None and len(out["ts_ns"]):
            yield out
    rest = spikes.finish()
    out = order.push(rest, 0) if rest else None
    if out is not None and len(out["ts_ns"]):
        yield out
    out = order.finish()
    if out is not None and len(out["ts_ns"]):
        yield out


# A gap longer than this between consecutive records is a damaged timestamp, not a pause:
# it is three times the span of the longest published block trace (Alibaba 2020, 31 days).
# One glitched record at 1.27e9 s (a Unix time among relative times) made a 40-year trace.
MAX_GAP_NS = 90 * 86400 * 10**9


def span_text(ns) -> str:
    """A long time span in words: '40.2 years', '95.0 days'."""
    days = float(ns) / 86400e9
    return f"{days / 365.25:.1f} years" if days >= 365.25 else f"{days:.1f} days"


class OutlierLog:
    """What an import does with outlying records: drop them (--drop-outliers) or refuse.
    Dropped records are counted here for the trace's metadata."""

    def __init__(self, drop=False):
        self.drop = drop
        self.count = 0
        self.dropped = []  # "file:line" of the first 20
        self.first_dropped = False  # a file's first record was one (its origin moved)

    def metadata(self) -> dict:
        return {"count": self.count, "max_gap_s": MAX_GAP_NS // 10**9, "first": self.dropped}


class Outliers:
    """Finds lone records whose time lies more than MAX_GAP_NS from their neighbours in file
    order: a damaged timestamp, as a record 40 years away is. Inside the file that is a record
    far from both neighbours; at either end, one far from its neighbour while that neighbour
    is near its own. The first one is an error naming its line; with log.drop they are left
    out and counted. Two rows are held back, for the neighbours of the last ones."""

    def __init__(self, path, log, line_of, scale=1):
        self.path, self.log, self.line_of, self.scale = path, log or OutlierLog(), line_of, scale
        self.before = None  # time of the row before `pending`, in the chunk's unit
        self.before_gap = np.nan  # that row's gap to the one before it
        self.pending = None  # the last rows seen, undecided

    def push(self, chunk, row0):
        if "_row" not in chunk:
            chunk = dict(chunk, _row=np.arange(row0, row0 + len(chunk["ts_ns"]), dtype=np.int64))
        if self.pending is not None:
            chunk = concat([self.pending, chunk])
        n = len(chunk["ts_ns"])
        decided = max(0, n - 2)
        self.pending = {k: v[decided:] for k, v in chunk.items()}
        return self._judge(chunk, decided)

    def finish(self):
        if self.pending is None:
            return {}
        chunk, self.pending = self.pending, None
        return self._judge(chunk, len(chunk["ts_ns"]))

    def _judge(self, chunk, n):
        """The first `n` rows of `chunk`, outliers refused or left out."""
        if n == 0:
            return {k: v[:0] for k, v in chunk.items()}
        t = chunk["ts_ns"].astype(np.float64)
        limit = MAX_GAP_NS / self.scale
        gaps = np.abs(np.diff(t))
        left = np.r_[abs(t[0] - self.before) if self.before is not None else np.nan, gaps]
        right = np.r_[gaps, np.nan]
        left_of_left = np.r_[self.before_gap, left[:-1]]
        right_of_right = np.r_[right[1:], np.nan]
        with np.errstate(invalid="ignore"):  # NaN: no neighbour there; comparisons are False
            far = (left > limit) & (right > limit)
            first = np.isnan(left) & (right > limit) & (right_of_right <= limit)
            last = np.isnan(right) & (left > limit) & (left_of_left <= limit)
        far = (far | first | last)[:n]
        self.before, self.before_gap = float(t[n - 1]), float(left[n - 1])
        if far.any():
            rows = chunk["_row"][:n][far]
            if not self.log.drop:
                i = int(far.argmax())
                raise outlier_error(self.path, self.line_of(int(rows[0])),
                                    np.nanmin([left[i], right[i]]) * self.scale)
            if first[:n].any():
                self.log.first_dropped = True
            name = Path(self.path).name
            room = max(0, 20 - len(self.log.dropped))
            self.log.dropped.extend(f"{name}:{self.line_of(int(r))}" for r in rows[:room].tolist())
            self.log.count += len(rows)
        keep = ~far
        return {k: v[:n][keep] for k, v in chunk.items()}


def concat(chunks):
    return {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}


def merge_sorted(streams):
    """Merge time-ordered chunk iterators into one, in bounded memory (stable by stream order).

    Rows up to the smallest newest-buffered time among live streams are safe to emit: no
    live stream can still produce an earlier row.
    """
    streams = [iter(s) for s in streams]
    if len(streams) == 1:
        yield from streams[0]
        return
    buffers = [None] * len(streams)
    live = [True] * len(streams)
    while True:
        for i, stream in enumerate(streams):
            while live[i] and (buffers[i] is None or not len(buffers[i]["ts_ns"])):
                try:
                    buffers[i] = next(stream)
                except StopIteration:
                    live[i] = False
        pending = [b for b in buffers if b is not None and len(b["ts_ns"])]
        if not pending:
            return
        marks = [buffers[i]["ts_ns"][-1] for i in range(len(streams)) if live[i]]
        mark = min(marks) if marks else np.iinfo(np.int64).max
        parts = []
        for i, b in enumerate(buffers):
            if b is None or not len(b["ts_ns"]):
                continue
            cut = int(np.searchsorted(b["ts_ns"], mark, side="right"))
            parts.append({k: v[:cut] for k, v in b.items()})
            buffers[i] = {k: v[cut:] for k, v in b.items()}
        out = concat(parts)
        order = np.argsort(out["ts_ns"], kind="stable")
        yield {k: v[order] for k, v in out.items()}


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


def import_trace(paths, output, fmt=None, options=None, command=None, progress=None) -> tuple[Path, int]:
    """Read `paths` in format `fmt` (sniffed from the first file when None) into a trace at
    `output`, written atomically; returns (output, rows). `progress(done, total)` is called
    with raw input bytes after each chunk.
    """
    paths = [Path(p) for p in paths]
    if not paths:
        raise ReplayError("no input files; give at least one trace file to import")
    for p in paths:
        if not p.is_file():
            raise TraceFormatError(p, "no such file" if not p.exists() else "not a regular file")
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
    shift = 0
    if first is not None and outliers.first_dropped and getattr(module, "ZERO_AT_FIRST", False) \
            and len(first["ts_ns"]):
        # The dropped record was the origin the times count from: count from the first kept.
        shift = int(first["ts_ns"][0])
        if shift:
            source["time_shift_ns"] = -shift
            if metadata.get("start_wallclock"):
                start = datetime.datetime.fromisoformat(metadata["start_wallclock"])
                metadata["start_wallclock"] = (start + datetime.timedelta(microseconds=shift / 1000)).isoformat()
    # A format may say which columns it would have made, for an input without records.
    declared = metadata.pop("columns", None) or REQUIRED
    names = [n for n in _ORDER if n in (first if first is not None else declared)]
    fields = [(n, _ARROW_TYPES[n]) for n in names]
    rows, last_ts = 0, None
    # Parsing (in a thread) overlaps compression and writing (here): both release the GIL.
    chunks = prefetch(chunks)
    with without_gc(), TraceWriter(output, fields, metadata) as writer:
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
    if not len(ts):
        return
    gaps = np.diff(ts, prepend=last_ts if last_ts is not None else 0)
    if (far := gaps > MAX_GAP_NS).any():
        i = int(far.argmax())
        where = (f"I/O {row0 + i + 1} comes {span_text(gaps[i])} after the one before it"
                 if row0 + i else f"the first I/O comes {span_text(gaps[i])} after the trace's start")
        raise TraceFormatError(", ".join(map(str, paths)), f"{where} (more than "
                               f"{span_text(MAX_GAP_NS)}): a damaged timestamp, not a pause; "
                               "cut the damaged records out of the input (--drop-outliers does "
                               "that for lone records of the text formats)")


@contextlib.contextmanager
def without_gc():
    """The cyclic garbage collector paused: an import makes few reference cycles, and each
    full collection walks every object Numba and pyarrow hold (5-20 % of a blktrace import)."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class prefetch:
    """Run a chunk iterator in a background thread, at most `depth` chunks ahead."""

    _DONE = object()

    def __init__(self, iterator, depth=2):
        self._queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(iter(iterator),), daemon=True)
        self._thread.start()

    def _run(self, iterator):
        try:
            for item in iterator:
                if not self._put((True, item)):
                    return
            self._put((True, self._DONE))
        except BaseException as exc:  # handed to the consumer, which re-raises it
            self._put((False, exc))

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self):
        try:
            while True:
                ok, item = self._queue.get()
                if not ok:
                    raise item
                if item is self._DONE:
                    return
                yield item
        finally:
            self._stop.set()
            self._thread.join()


def _as_column(name, values):
    if name == "comm":
        return values
    dtype = _ARROW_TYPES[name].to_pandas_dtype()
    return np.asarray(values).astype(dtype, copy=False)


# ----------------------------------------------------------------------------- export


EXPORT_FORMATS = ("fio", "blktrace", "csv")


def export_trace(trace, fmt, output, options=None) -> Path:
    """Write trace (a path or library name) as `fmt` to `output`, atomically."""
    from traces.library import resolve

    if fmt not in EXPORT_FORMATS:
        raise ReplayError(f"cannot export to {fmt!r}; use one of {', '.join(EXPORT_FORMATS)}")
    try:
        module = formats.get(fmt)
    except ModuleNotFoundError:
        module = None
    if module is None or not hasattr(module, "write"):
        raise ReplayError(f"export to {fmt} is not available in this version of tracereplay; "
                          f"use one of: {', '.join(f for f in EXPORT_FORMATS if _can_write(f))}")
    opened = open_trace(resolve(trace))
    output = Path(output)
    tmp = output.with_name(f".{output.name}.{os.getpid()}.partial")
    try:
        module.write(opened, tmp, dict(options or {}))
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    return output


def _can_write(fmt) -> bool:
    try:
        return hasattr(formats.get(fmt), "write")
    except ModuleNotFoundError:
        return False
