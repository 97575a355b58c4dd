"""What the text formats share for reading: inputs decompressed by content and counted for
progress, lines and blocks of delimited text parsed with pyarrow, and errors located to a line
by a slow rescan, only on the error path.
"""
import gzip
import io
import lzma
import os
import queue
import threading
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv

from traces.errors import ReplayError, TraceFormatError
from traces.formats.inputs import compression
from traces.schema import Op

BLOCK_BYTES = 16 << 20  # text per parse: ~320k MSR rows, ~15 MB of arrays per chunk


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
                include=None, meter=None, block_bytes=None, quoted=False, fast=None):
    """Yield (first data row, RecordBatch) over a delimited text file, in bounded memory.

    The file is cut into blocks of whole lines, each parsed by pyarrow's multi-threaded
    read_csv (its streaming reader parses on one core: 2.0 M MSR rows/s against 5.2 M/s
    measured on the 2-core VM). When pyarrow refuses a block, the file is rescanned line
    by line with `check_line` to name the first bad line (only on that error path).
    `fast` (see fast_lines) reads a block first, where it can, into the same batch.
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
        size = block_bytes or BLOCK_BYTES
        space = None  # a plain file's buffer, read into again while no batch holds on to it
        while not done:
            if plain:
                # The carried line and the next block are read into one buffer: joining them
                # was a copy of every byte into a fresh 16 MB each time (6 ns of CPU a NetApp line).
                data, got, error = _read_after(f, carry, size, space)
                space = data if fast is not None else None
                if error is not None:
                    raise read_error(path, lines + data.count(b"\n", 0, len(carry) + got) + 1, error)
            else:
                data, error = read_block(f, size)
                if error is not None:
                    raise read_error(path, lines + (carry + data).count(b"\n") + 1, error)
                got = len(data)
                data = carry + data if got else data
            if plain and meter is not None:
                meter.done = min(meter.total, meter.done + got)
            # The block is data[start:cut], whole lines, parsed in place: cutting it out was a
            # copy of every byte (5 ns a NetApp line).
            if got:
                end = len(carry) + got
                cut = data.rfind(b"\n", 0, end) + 1
                carry = bytes(data[cut:end])
            else:
                data, cut, carry, done = carry, len(carry), b"", True
            start = 0
            while skip and start < cut:
                stop = data.find(b"\n", start, cut) + 1 or cut
                lines += data.count(b"\n", start, stop)
                start, skip = stop, skip - 1
            if start == cut or (data[start:start + 256].isspace() and data[start:cut].isspace()):
                lines += data.count(b"\n", start, cut)
                continue
            block = memoryview(data)[start:cut]
            if fast is not None and (parsed := fast(block)) is not None:
                del block
                batch, newlines = parsed
                lines += newlines
                yield row, batch
                row += batch.num_rows
                continue
            lines += data.count(b"\n", start, cut)
            space = None  # pyarrow's columns may point into the block it parses
            try:
                table = pacsv.read_csv(pa.BufferReader(block), read_options=read_options,
                                       parse_options=parse_options, convert_options=convert_options)
            except pa.ArrowInvalid as exc:
                raise locate_line(path, exc, check_line, skip_rows) from None
            del block, data
            for batch in table.combine_chunks().to_batches():
                yield row, batch
                row += batch.num_rows
    except READ_ERRORS as exc:
        raise read_error(path, lines + 1, exc) from None
    finally:
        f.close()


def _read_after(f, carry, size, space):
    """(a bytearray of `carry` then up to `size` bytes read from `f`, how many were read,
    the read error or None): into `space` when it has room, which the caller no longer uses.
    Its bytes past the ones read are stale."""
    if space is None or len(space) < len(carry) + size:
        space = bytearray(len(carry) + size)
    space[:len(carry)] = carry
    got, error = len(carry), None
    with memoryview(space) as view:
        try:
            while got < len(carry) + size and (n := f.readinto(view[got:len(carry) + size])):
                got += n
        except READ_ERRORS as exc:
            error = exc
    return space, got - len(carry), error


def fast_lines(names, types, include):
    """A `fast` reader for read_blocks, or None where it does not apply: for comma-separated
    lines of len(names) unquoted fields, whose kept columns (`include`) are all int64 or
    float64 (and at least one). It returns (the batch, the LFs read), or None for a block
    that is not that simple, which pyarrow then reads."""
    kind = {pa.int64(): "int64", pa.float64(): "float64"}
    if not include or any(types[n] not in kind for n in include):
        return None
    from native import read_lines  # the compiled extension, loaded with the first fast read

    kinds = [kind[types[n]] if n in include else None for n in names]
    kept = [n for n in names if n in include]  # read_lines gives the kept columns in field order

    def read(block):
        """`block`: bytes or a memoryview of whole lines."""
        if (got := read_lines(block, kinds)) is None:
            return None
        columns, newlines = got
        by_name = dict(zip(kept, columns))
        return pa.record_batch([pa.array(by_name[n]) for n in include], names=list(include)), newlines

    return read


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


def op_from_words(path, column, words: dict, row0, skip_rows=0, key=None):
    """uint8 op codes from a string column, by a word -> Op mapping of each word, or of
    key(word) (blkreplay reads only a word's first letter).

    The column is mapped through its few distinct words (dictionary-encoded), then indexed.
    """
    if not pa.types.is_dictionary(column.type):
        column = column.dictionary_encode()
    key = key or (lambda word: word)
    table = np.array([words.get(key(w), 255) for w in column.dictionary.to_pylist()] or [255],
                     dtype=np.uint8)
    op = table[numpy_of(column.indices)] if len(column) else np.zeros(0, np.uint8)
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


def record_blocks(path, record: np.dtype, meter=None, block_records=1 << 20):
    """Yield (index of the first record, structured array) over a file of fixed-size binary
    records, decompressed by content, in bounded memory. A file that ends inside a record is
    an error naming the byte offset where that record starts."""
    size = record.itemsize
    try:
        f = open_text(path, meter, buffered=False)
    except READ_ERRORS as e:
        raise TraceFormatError(path, f"cannot read: {e}") from None
    with f:
        index, carry = 0, b""
        while True:
            want = block_records * size - len(carry)
            data, error = read_block(f, want)
            if error is not None:
                raise TraceFormatError(path, f"byte offset {index * size + len(carry) + len(data)}: "
                                       f"cannot read ({error})")
            at_end = len(data) < want
            data = carry + data
            whole = len(data) // size
            if whole:
                yield index, np.frombuffer(data, record, count=whole)
                index += whole
            carry = data[whole * size:]
            if at_end:
                if carry:
                    raise TraceFormatError(path, f"byte offset {index * size}: the file ends {len(carry)} "
                                           f"bytes into a {size}-byte record; it is cut short")
                return
