"""blkreplay's .load files (github.com/schoebel/blkreplay, Thomas Schoebel-Theuer for 1&1): the
natural loads it replays, recorded by blktrace on production servers.

As scripts/conv_blktrace_to_load.sh writes them: a free-text header (a copyright notice,
ending in a line of #, then `start ; sector; length ; op ;  replay_delay=0 ;
replay_duration=0`), then one request per line, `SEC.NSEC ; SECTOR ; LENGTH ; R|W ; DELAY ;
DURATION`: the time from blkparse (%T.%9t), SECTOR and LENGTH in 512-byte sectors, the
operation, and two numbers blkreplay fills in when it writes its results (0.0 in a load).
src/blkreplay.c reads the first five fields (`sscanf("%ld.%ld ; %lld ; %d ; %c")`), so of
the operation only its first letter (`RA`, read-ahead, is a read), and skips lines that do
not match them: here, lines before the first request are the header,
and a malformed line after it is an error naming the line. The fraction is read as a
decimal fraction (the converters always write nine digits, where both readings agree).
Times count from the first request, as blkreplay replays them.
"""
import re

import pyarrow as pa
import pyarrow.compute as pc

from traces.errors import TraceFormatError
from traces.formats import ordering, reading
from traces.schema import Op

NAME = "blkreplay"
DESCRIPTION = "blkreplay .load (SEC.NSEC ; SECTOR ; LENGTH ; R|W ; ...), after its text header"
SECTOR = 512
WORDS = {"R": Op.READ, "W": Op.WRITE}
# blktrace's per-CPU interleaving survives the conversion to a load.
WINDOW_NS = 1_000_000_000
_RECORD = re.compile(r"^\s*(\d+)\.(\d{1,9})\s*;\s*(\d+)\s*;\s*(\d+)\s*;\s*(\S+)\s*(;.*)?$")
_HEADER = re.compile(rb"^start ; sector; length ; op ;", re.M)


def _check(line: bytes) -> str | None:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not UTF-8 text at column {e.start + 1}"
    match = _RECORD.match(text)
    if not match:
        return "not a request line (SEC.NSEC ; SECTOR ; LENGTH ; R|W ; ...)"
    if match.group(5)[:1] not in WORDS:
        return f"operation {match.group(5)[:20]!r}; blkreplay replays R and W only"
    return None


def _parse(text: str):
    match = _RECORD.match(text)
    return match and int(match.group(1)) * 10**9 + int(match.group(2).ljust(9, "0"))


def sniff(path, head) -> bool:
    if _HEADER.search(head):
        return True
    lines = reading.first_lines(head, 5)
    return bool(lines) and all(_parse(line) is not None and _check(line.encode()) is None for line in lines)


def _first(path):
    """(line number, time in ns) of the first request line; the lines before it are header."""
    for number, line in reading.iter_lines(path):
        text = line.decode("utf-8", "replace")
        if (ns := _parse(text)) is not None:
            return number, ns
    raise TraceFormatError(path, "no request lines (SEC.NSEC ; SECTOR ; LENGTH ; R|W ; ...) "
                           "after the header: there is nothing to import")


def read(paths, options):
    firsts = [_first(p) for p in paths]
    origin = min(ns for _, ns in firsts)
    metadata = {
        "description": "Imported from blkreplay loads: " + ", ".join(p.name for p in paths) + ".",
        "source": {"kind": f"import:{NAME}", "time_origin_ns": origin},
    }
    meter = options.get("meter")
    streams = [ordering.ordered_chunks(p, _chunks(p, number - 1, origin, meter), WINDOW_NS, number - 1,
                                      outliers=options.get("outliers"))
               for p, (number, _) in zip(paths, firsts)]
    return metadata, ordering.merge_sorted(streams)


def _chunks(path, skip, origin, meter):
    for row0, batch in reading.read_blocks(path, ["line"], {"line": pa.string()}, check_line=_check,
                                           delimiter="\x1f", skip_rows=skip, meter=meter):
        fields = pc.split_pattern(batch.column("line"), ";", max_splits=4)
        count = reading.numpy_of(pc.list_value_length(fields))
        if (bad := count < 4).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), "not a request line (SEC.NSEC ; "
                                  "SECTOR ; LENGTH ; R|W ; ...)", skip)
        text = [pc.utf8_trim_whitespace(pc.list_element(fields, i)) for i in range(4)]
        stamp = pc.split_pattern(text[0], ".", max_splits=1)
        fraction = pc.utf8_rpad(pc.list_element(stamp, 1), 9, "0")
        try:
            seconds, nanos, sector, length = (
                reading.numpy_of(pc.cast(c, pa.int64()))
                for c in (pc.list_element(stamp, 0), fraction, text[1], text[2]))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, IndexError) as exc:
            raise reading.locate_line(path, exc, _check, skip) from None
        bad = (reading.numpy_of(pc.utf8_length(fraction)) != 9) | (sector < 0) | (length < 0)
        if bad.any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), _check(
                batch.column("line")[int(bad.argmax())].as_py().encode()) or "bad request line", skip)
        chunk = {
            "ts_ns": seconds * 10**9 + nanos - origin,
            "op": reading.op_from_words(path, text[3], WORDS, row0, skip, key=lambda word: word[:1]),
            "offset": sector * SECTOR,
            "length": length * SECTOR,
        }
        reading.check_rows(path, chunk, row0, skip)
        yield row0, chunk
