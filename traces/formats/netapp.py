"""NetApp controller I/O log dumps in CSV, as hfplayer (umn-cris/hfplayer) replays them.

A header line, `#` optional, names the columns, each with a type suffix (.I integer, .D
decimal, .S string), in any case and order: ELAPSED_USECS.D (us from the capture's start),
OP.I (0 read, 1 write), LBA.I and NBLKS.I (512-byte blocks), LUN_SSID.I (the LUN), and
LATENCY_USECS.D; other columns are ignored.
"""
import numpy as np
import pyarrow as pa

from traces.errors import TraceFormatError
from traces.formats import ordering, reading
from traces.schema import Op

NAME = "netapp"
DESCRIPTION = "NetApp controller CSV as hfplayer reads it (#ELAPSED_USECS.D,OP.I,LBA.I,NBLKS.I,...)"

BLOCK = 512  # hfplayer's DISK_BLOCK_SIZE: LBA and NBLKS count 512-byte blocks
REQUIRED = ("elapsed_usecs", "op", "lba", "nblks")
OPTIONAL = ("lun_ssid", "latency_usecs")
DECIMAL = ("elapsed_usecs", "latency_usecs")
# As for the other CSV traces: a record logged up to 1 s out of order is put back in place.
WINDOW_NS = 1_000_000_000
MAX_BLOCKS = 1 << 54  # blocks x 512 stays within int64 bytes
_FLOAT_MAX = np.finfo(np.float64).max  # a decimal above it is infinite: refused
assert (Op.READ, Op.WRITE) == (0, 1)  # the op column is `OP == 1` as uint8


def _header(line: str):
    """Column names as hfplayer reads them (lower case, `#` and type suffix dropped), or None
    when `line` does not name the columns this format needs."""
    text = line.strip().lower()
    names = [n.strip() for n in text.removeprefix("#").split(",")]
    names = [n[:-2] if n[-2:] in (".i", ".d", ".s") else n for n in names]
    return names if set(REQUIRED) <= set(names) else None


def sniff(path, head) -> bool:
    lines = reading.first_lines(head, 1)
    return bool(lines) and _header(lines[0]) is not None


def read(paths, options):
    heads = []
    for path in paths:
        first = next(reading.iter_lines(path), None)
        names = _header(first[1].decode("utf-8", "replace")) if first else None
        if names is None or first[0] != 1:
            raise TraceFormatError(path, "line 1: the header must name the columns, including "
                                   "ELAPSED_USECS, OP, LBA and NBLKS (with their .I/.D suffixes)")
        if twice := [n for n in REQUIRED + OPTIONAL if names.count(n) > 1]:
            raise TraceFormatError(path, f"line 1: the header names {twice[0].upper()} twice")
        heads.append(names)
    skipped = {}
    metadata = {
        "description": "Imported from NetApp controller traces: " + ", ".join(p.name for p in paths) + ".",
        # ELAPSED_USECS counts from the capture's start: the file's own zero.
        "source": {"kind": f"import:{NAME}", "skipped_ops": skipped},
    }
    meter = options.get("meter")
    streams = [ordering.ordered_chunks(p, _chunks(p, h, skipped, meter), WINDOW_NS, 1, options.get("outliers"))
               for p, h in zip(paths, heads)]
    return metadata, ordering.merge_sorted(streams)


def _chunks(path, names, skipped, meter):
    # Positional names: pyarrow needs one per field, and extra columns may repeat a name.
    fields = [f"c{i}" for i in range(len(names))]
    wanted = {n: fields[names.index(n)] for n in REQUIRED + OPTIONAL if n in names}
    types = {f: pa.float64() if n in DECIMAL else pa.int64() for n, f in wanted.items()}
    kinds = ["str"] * len(names)
    for n, f in wanted.items():
        kinds[fields.index(f)] = "float" if n in DECIMAL else "int"
    include = list(wanted.values())
    blocks = reading.read_blocks(path, fields, types, check_line=reading.field_checker(kinds),
                                 skip_rows=1, include=include, meter=meter,
                                 fast=reading.fast_lines(fields, types, include))
    for row0, batch in blocks:
        column = {n: reading.numpy_of(batch.column(f)) for n, f in wanted.items()}
        elapsed, code = column["elapsed_usecs"], column["op"]
        lba, nblks = column["lba"], column["nblks"]
        _refuse(path, row0, elapsed, 0, _FLOAT_MAX, "ELAPSED_USECS must be a number >= 0")
        _refuse(path, row0, lba, 0, MAX_BLOCKS - 1, "LBA must be from 0 to 2^54")
        _refuse(path, row0, nblks, 1, MAX_BLOCKS - 1, "NBLKS must be from 1 to 2^54")
        chunk = {
            "ts_ns": np.rint(elapsed * 1000).astype(np.int64),
            # hfplayer: 1 is a write, 0 a read; other codes it skips, and so do we (counted).
            "op": (code == 1).view(np.uint8),  # Op.WRITE where true, Op.READ elsewhere
            "offset": lba * BLOCK,
            "length": nblks * BLOCK,
            "_row": np.arange(row0, row0 + len(code), dtype=np.int64),
        }
        if "latency_usecs" in column:
            latency = column["latency_usecs"]
            _refuse(path, row0, latency, 0, _FLOAT_MAX, "LATENCY_USECS must be a number >= 0")
            chunk["latency_ns"] = np.rint(latency * 1000).astype(np.int64)
        if "lun_ssid" in column:
            lun = column["lun_ssid"]
            _refuse(path, row0, lun, 0, np.iinfo(np.uint32).max, "LUN_SSID must be from 0 to 2^32-1")
            chunk["device"] = lun.astype(np.uint32)
        if len(code) and (code.min() < 0 or code.max() > 1):
            keep = (code == 0) | (code == 1)
            values, counts = np.unique(code[~keep], return_counts=True)
            for value, count in zip(values.tolist(), counts.tolist()):
                skipped[str(value)] = skipped.get(str(value), 0) + count
            chunk = {k: v[keep] for k, v in chunk.items()}
        yield row0, chunk


def _refuse(path, row0, values, lo, hi, problem):
    """The error naming the first row whose value is not from lo to hi (NaN is not). The
    minimum and the maximum show the usual case, every value in range, in two passes."""
    if len(values) and values.min() >= lo and values.max() <= hi:  # a NaN minimum fails
        return
    if (bad := ~((values >= lo) & (values <= hi))).any():
        raise reading.fail_at(path, row0 + int(bad.argmax()), problem, 1)
