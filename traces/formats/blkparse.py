"""blkparse's default text output (`maj,min cpu seq sec.nsec pid action RWBS sector + nblocks
[cmd]`): import. Each line becomes a blktrace event and goes through the same matching of
completions to I/Os as the binary reader; the trailing summary block is ignored.
"""
import io
import re

import numpy as np

from replay.errors import TraceFormatError
from traces.formats import blktrace
from traces.formats.inputs import open_input

NAME = "blkparse"
DESCRIPTION = "blkparse text output (maj,min cpu seq sec.nsec pid action RWBS sector + nblocks [cmd])"

_LINES = 1 << 18  # lines per block
_EVENT = re.compile(rb"^\s*\d+,\d+\s+\d+\s+\d+\s+\d+\.\d+\s+\d+\s+[A-Za-z]{1,2}\s+[A-Z]*", re.M)
_SUMMARY = re.compile(r"^(CPU\d+ \(|Total \()")
_ACTIONS = {"Q": 1, "M": 2, "F": 3, "G": 4, "S": 5, "R": 6, "D": 7, "C": 8, "P": 9, "U": 10,
            "UT": 11, "I": 12, "X": 13, "B": 14, "A": 15}
# Actions printed without a trailing [cmd] or [error].
_NO_BRACKET = {"A", "m"}
_RWBS_TAIL = {"F": blktrace.TC_FUA, "A": blktrace.TC_AHEAD, "S": blktrace.TC_SYNC,
              "M": blktrace.TC_META}
_RWBS_DIR = {"D": blktrace.TC_DISCARD | blktrace.TC_WRITE, "W": blktrace.TC_WRITE,
             "R": blktrace.TC_READ, "N": blktrace.TC_READ}


def sniff(path, head: bytes) -> bool:
    lines = [line for line in head.splitlines()[:20] if line.strip()]
    if len(head) == 64 * 1024 and lines:
        lines = lines[:-1]  # the last line of a full head may be cut
    return bool(lines) and all(_EVENT.match(line) for line in lines[:10])


def _rwbs(text: str) -> int | None:
    """Category bits of an RWBS string, None if it is not one."""
    i, category = 0, 0
    if text.startswith("F") and len(text) > 1 and text[1] in _RWBS_DIR:
        category, i = blktrace.TC_FLUSH, 1
    if i >= len(text) or text[i] not in _RWBS_DIR:
        return None
    category |= _RWBS_DIR[text[i]]
    for letter in text[i + 1:]:
        if letter not in _RWBS_TAIL:
            return None
        category |= _RWBS_TAIL[letter]
    return category


def _blocks(path):
    """Yield (event columns, notes) for blocks of lines; notes carry process names."""
    try:
        raw = open_input(path)
    except OSError as e:
        raise TraceFormatError(path, f"cannot read: {e.strerror or e}") from None
    with raw, io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n") as text:
        number = 0
        summary = False
        while True:
            try:
                lines = text.readlines(_LINES * 64)
            except (OSError, EOFError) as e:
                raise TraceFormatError(path, f"line {number + 1}: cannot read ({e})") from None
            if not lines:
                return
            cols = {"time": [], "sector": [], "bytes": [], "action": [], "pid": [], "device": []}
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
                if event[6]:
                    names[event[4]] = event[6]
            columns = {
                "time": np.array(cols["time"], np.int64),
                "sector": np.array(cols["sector"], np.uint64),
                "bytes": np.array(cols["bytes"], np.uint32),
                "action": np.array(cols["action"], np.uint32),
                "pid": np.array(cols["pid"], np.uint32),
                "device": np.array(cols["device"], np.uint32),
            }
            yield columns, [("comm", pid, name) for pid, name in names.items()]


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
    if action not in _ACTIONS:
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
    return (time, sector, nblocks * 512, (category << 16) | _ACTIONS[action], pid,
            blktrace.dev_t(major, minor), comm)


def read(paths, options=None):
    """(metadata, chunk iterator) of the I/Os in one blkparse text file.

    options: event = "issue" (D, default) or "queue" (Q). ts_ns counts from blkparse's
    first event; pid comes from the Q event where one is found, comm from [cmd].
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
    return blktrace._prime(metadata, matcher.chunks(_blocks(paths[0])))
