"""blkparse's default text output (`maj,min cpu seq sec.nsec pid action RWBS sector + nblocks
[cmd]`): import. Each line becomes a blktrace event and goes through the same matching of
completions to I/Os as the binary reader; the trailing summary block is ignored.

Output piped live from blktrace interleaves the CPUs, so times go back by microseconds: the
events are sorted within a reorder window of WINDOW_NS (as the MSR, FIU and Alibaba importers
do) before matching, and an event later than that is an error naming its line.
"""
import re

import numpy as np

from traces.errors import TraceFormatError
from traces.formats import blktrace, ordering, reading

NAME = "blkparse"
DESCRIPTION = "blkparse text output (maj,min cpu seq sec.nsec pid action RWBS sector + nblocks [cmd])"
WINDOW_NS = 1_000_000_000

_BLOCK_BYTES = 16 << 20  # text per step
_EVENT = re.compile(rb"^\s*\d+,\d+\s+\d+\s+\d+\s+\d+\.\d+\s+\d+\s+[A-Za-z]{1,2}\s+[A-Z]*", re.M)
_SUMMARY = re.compile(r"^(CPU\d+ \(|Total \()")
# Actions printed without a trailing [cmd] or [error].
_NO_BRACKET = {"A", "m"}
# RWBS, as blkparse (blkparse_fmt.c fill_rwbs) and the kernel's blk_fill_rwbs print it: an
# optional leading F (a pre-flush), one letter for the operation, then the modifiers. An F
# after the operation letter is FUA. E (secure erase) follows D. B (barrier) is what
# blkparse printed before kernel 2.6.37 for the bit that became FLUSH; that kernel turned
# barrier writes into a pre-flush plus FUA (WRITE_FLUSH_FUA), so B is read as both.
_RWBS_OP = {"D": blktrace.TC_DISCARD | blktrace.TC_WRITE, "W": blktrace.TC_WRITE,
            "R": blktrace.TC_READ, "N": 0, "F": blktrace.TC_FLUSH}
_RWBS_TAIL = {"F": blktrace.TC_FUA, "A": blktrace.TC_AHEAD, "S": blktrace.TC_SYNC,
              "M": blktrace.TC_META, "B": blktrace.TC_FLUSH | blktrace.TC_FUA}


def sniff(path, head: bytes) -> bool:
    lines = [line for line in head.splitlines()[:20] if line.strip()]
    if len(head) == 64 * 1024 and lines:
        lines = lines[:-1]  # the last line of a full head may be cut
    return bool(lines) and all(_EVENT.match(line) for line in lines[:10])


def _rwbs(text: str) -> int | None:
    """Category bits of an RWBS string, None if it is not one."""
    i, category = 0, 0
    if text[:1] == "F" and text[1:2] in _RWBS_OP:
        category, i = blktrace.TC_FLUSH, 1
    if i >= len(text) or text[i] not in _RWBS_OP:
        return None
    category |= _RWBS_OP[text[i]]
    tail = text[i + 1:]
    if text[i] == "D" and tail[:1] == "E":
        tail = tail[1:]  # secure erase: a discard that must erase
    if len(set(tail)) != len(tail) or any(letter not in _RWBS_TAIL for letter in tail):
        return None
    for letter in tail:
        category |= _RWBS_TAIL[letter]
    return category


def _text_blocks(path):
    """Yield (event columns with "_row" = line number, notes) for blocks of lines."""
    f = reading.open_text(path, buffered=False)
    with f:
        carry, number, summary, done = b"", 0, False, False
        while not done:
            data, error = reading.read_block(f, _BLOCK_BYTES)
            if error is not None:
                raise reading.read_error(path, number + (carry + data).count(b"\n") + 1, error)
            if data:
                data = carry + data
                cut = data.rfind(b"\n") + 1
                block, carry = data[:cut], data[cut:]
            else:
                block, carry, done = carry, b"", True
            if not block:
                continue
            lines = block.decode("utf-8", "replace").split("\n")
            if block.endswith(b"\n"):
                lines.pop()
            cols = {"time": [], "sector": [], "bytes": [], "action": [], "pid": [], "device": [],
                    "line": []}
            names = {}
            for line in lines:
                number += 1
                if summary or not line.strip():
                    continue
                if _SUMMARY.match(line):
                    summary = True
                    continue
                event = _parse(path, number, line)
                if event is None:
                    continue
                for name, value in zip(("time", "sector", "bytes", "action", "pid", "device"), event[:6]):
                    cols[name].append(value)
                cols["line"].append(number)
                if event[6]:
                    names[event[4]] = event[6]
            columns = {
                "ts_ns": np.array(cols["time"], np.int64),
                "sector": np.array(cols["sector"], np.uint64),
                "bytes": np.array(cols["bytes"], np.uint32),
                "action": np.array(cols["action"], np.uint32),
                "pid": np.array(cols["pid"], np.uint32),
                "device": np.array(cols["device"], np.uint32),
                "_row": np.array(cols["line"], np.int64),
            }
            yield columns, [("comm", pid, name) for pid, name in names.items()]


def _blocks(path, outliers=None):
    """Yield (event columns, notes) in time order: lone events far from their neighbours are
    refused or dropped (ordering.Outliers), the rest sorted within WINDOW_NS."""
    line = lambda number: number  # noqa: E731  (rows here are line numbers)
    spikes = ordering.Outliers(path, outliers, line)
    order = ordering.Ordered(path, WINDOW_NS, line_of=line)
    for columns, notes in _text_blocks(path):
        out = order.push(spikes.push(columns, 0), 0)
        yield _events(out), notes
    rest = spikes.finish()
    out = order.push(rest, 0) if rest else None
    if out is not None:
        yield _events(out), []
    yield _events(order.finish()), []


def _events(columns):
    """The matcher's columns from a reordered chunk (None: nothing yet)."""
    if columns is None:
        return blktrace._empty_columns()
    out = {name: columns[name] for name in ("sector", "bytes", "action", "pid", "device")}
    return {"time": columns["ts_ns"], **out}


def _parse(path, number, line):
    """(time, sector, bytes, action, pid, device, comm) of one event line; None to skip it."""
    head, bracket, tail = line.partition(" [")
    fields = head.split()

    def bad(why):
        shown = line.rstrip("\n")
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return TraceFormatError(path, f"line {number}: {why}: {shown!r}")

    if len(fields) < 6:
        raise bad("not a blkparse event line (maj,min cpu seq time pid action ...)")
    try:
        major, minor = (int(x) for x in fields[0].split(","))
        int(fields[1]), int(fields[2])
        seconds, _, fraction = fields[3].partition(".")
        if not fraction.isdigit() or len(fraction) > 9:
            raise ValueError
        time = int(seconds) * 10**9 + int(fraction.ljust(9, "0"))
        pid = int(fields[4])
    except ValueError:
        raise bad("not a blkparse event line (maj,min cpu seq time pid action ...)") from None
    action = fields[5]
    if action == "m":
        return None  # a message note
    if action not in blktrace.ACTIONS:
        raise bad(f"unknown action {action!r}")
    if action not in _NO_BRACKET and (not bracket or "]" not in tail):
        raise bad("line ends before its [cmd] or [error]; is the file cut short?")
    if len(fields) < 7:
        raise bad("no RWBS field")
    category = _rwbs(fields[6])
    if category is None:
        raise bad(f"unknown RWBS {fields[6]!r}")
    sector = nblocks = 0
    rest = fields[7:]
    try:
        if rest and action in ("X",):
            sector = int(rest[0])
        elif rest and rest[0].isdigit():
            sector = int(rest[0])
            if len(rest) >= 3 and rest[1] == "+":
                nblocks = int(rest[2])
            elif len(rest) >= 2 and rest[1] == "+":
                raise ValueError
    except ValueError:
        raise bad("cannot read 'sector + blocks'") from None
    if nblocks == 0 and "B" in fields[6]:
        category &= ~blktrace.TC_FUA  # an empty barrier is a flush
    if nblocks == 0:
        # blkparse prints no sector for an empty Q or D (a flush) but does for its C: drop it
        # everywhere so the three still pair up.
        sector = 0
    stage = {"Q": blktrace.TC_QUEUE, "D": blktrace.TC_ISSUE, "C": blktrace.TC_COMPLETE}
    category |= stage.get(action, 0)
    comm = ""
    if bracket and action != "C":
        comm = tail[:tail.rfind("]")]
        if comm == "(null)":
            comm = ""
    return (time, sector, nblocks * 512, (category << 16) | blktrace.ACTIONS[action], pid,
            blktrace.dev_t(major, minor), comm)


def read(paths, options=None):
    """(metadata, chunk iterator) of the I/Os in one blkparse text file.

    options: event = "issue" (D, default) or "queue" (Q). ts_ns counts from blkparse's
    first event (the import then starts the trace at its first I/O); pid comes from the Q
    event where one is found, comm from [cmd].
    """
    options = options or {}
    paths = list(paths) if isinstance(paths, (list, tuple)) else [paths]
    if len(paths) != 1:
        raise TraceFormatError(
            ", ".join(map(str, paths)),
            "blkparse text is one time-ordered stream; give one file (blkparse merges CPUs)",
        )
    event = options.get("event") or "issue"
    metadata = {"source": {"kind": f"import:{NAME}", "files": [str(p) for p in paths], "event": event}}
    matcher = blktrace._Matcher(paths[0], event, metadata)
    return blktrace._prime(metadata, matcher.chunks(_blocks(paths[0], options.get("outliers"))))
