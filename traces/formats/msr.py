"""MSR Cambridge block traces (SNIA IOTTA): headerless CSV, one file per volume.

Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime; times are Windows FILETIME
(100 ns ticks since 1601), ResponseTime in 100 ns ticks, offsets and sizes in bytes.
"""
import datetime

import numpy as np
import pyarrow as pa

from traces.errors import TraceFormatError
from traces.formats import ordering, reading
from traces.schema import Op

NAME = "msr"
DESCRIPTION = "MSR Cambridge CSV (Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime)"

NAMES = ["ts", "host", "disk", "type", "offset", "size", "response"]
TYPES = {"ts": pa.int64(), "disk": pa.int64(), "type": reading.WORD, "offset": pa.int64(),
         "size": pa.int64(), "response": pa.int64()}
KINDS = ("int", "str", "int", "str", "int", "int", "int")
WORDS = {"Read": Op.READ, "Write": Op.WRITE}
TICK_NS = 100
FILETIME_UNIX = 116444736000000000  # 100 ns ticks from 1601-01-01 to 1970-01-01
# The published files are sorted; a small window tolerates requests logged out of order.
WINDOW_NS = 1_000_000_000
PROVENANCE = ("MSR Cambridge enterprise server block traces (Narayanan, Donnelly and Rowstron, "
              "FAST 2008), distributed by the SNIA IOTTA repository under its own terms of use; "
              "check them before redistributing this trace.")


def _fields(line: str):
    parts = line.split(",")
    if len(parts) != 7 or parts[3] not in WORDS:
        return None
    try:
        values = [int(parts[i]) for i in (0, 2, 4, 5, 6)]
    except ValueError:
        return None
    return parts, values


def sniff(path, head) -> bool:
    lines = reading.first_lines(head)
    return bool(lines) and all(_fields(line) for line in lines) and int(lines[0].split(",")[0]) > 10**17


def read(paths, options):
    meter = options.get("meter")
    firsts = []
    for path in paths:
        first = ordering.first_record(path, _fields, reading.field_checker(KINDS), "Type must be Read or Write",
                                     lambda f: f[1][0], TICK_NS, options.get("outliers"))
        if first is None:
            firsts.append(None)
            continue
        number, fields = first
        if fields[1][0] < 10**17:
            raise TraceFormatError(path, f"line {number}: Timestamp {fields[1][0]} is not a Windows "
                                   "FILETIME (100 ns ticks since 1601, about 1.28e17 for 2007)")
        firsts.append(fields)
    starts = [f[1][0] for f in firsts if f is not None]
    origin = min(starts) if starts else 0
    volumes = [{"file": p.name, "hostname": f[0][1], "disk": f[1][1]} if f else {"file": p.name}
               for p, f in zip(paths, firsts)]
    metadata = {
        "description": "Imported from the MSR Cambridge block traces: "
                       + ", ".join(f"{v.get('hostname', '?')} disk {v.get('disk', '?')}" for v in volumes) + ".",
        "source": {"kind": "import:msr", "volumes": volumes,
                   # Unix ns: FILETIME's own zero (1601) would overflow 64 bits in ns.
                   "time_origin_ns": (origin - FILETIME_UNIX) * TICK_NS},
        "provenance": PROVENANCE,
    }
    if starts:
        unix_ns = (origin - FILETIME_UNIX) * TICK_NS
        metadata["start_wallclock"] = datetime.datetime.fromtimestamp(
            unix_ns / 1e9, datetime.timezone.utc).isoformat()
    if len(paths) == 1:
        volumes[0].pop("file")
        metadata["source"].update(hostname=volumes[0].get("hostname"), disk=volumes[0].get("disk"))
    streams = [_file(p, i if len(paths) > 1 else None, origin, meter, options.get("outliers"))
               for i, p in enumerate(paths)]
    return metadata, ordering.merge_sorted(streams)


def _file(path, device, origin, meter, outliers):
    check = reading.field_checker(KINDS)
    blocks = reading.read_blocks(path, NAMES, TYPES, check_line=check, include=["ts", "type", "offset", "size", "response"],
                                 meter=meter)
    return ordering.ordered_chunks(path, _chunks(path, blocks, device, origin), WINDOW_NS,
                                  outliers=outliers)


def _chunks(path, blocks, device, origin):
    for row0, batch in blocks:
        ts = reading.numpy_of(batch.column("ts"))
        chunk = {
            "ts_ns": (ts - origin) * TICK_NS,
            "op": reading.op_from_words(path, batch.column("type"), WORDS, row0),
            "offset": reading.numpy_of(batch.column("offset")),
            "length": reading.numpy_of(batch.column("size")),
            "latency_ns": reading.numpy_of(batch.column("response")) * TICK_NS,
        }
        if (bad := chunk["latency_ns"] < 0).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), "negative ResponseTime")
        reading.check_rows(path, chunk, row0)
        if device is not None:
            chunk["device"] = np.full(len(ts), device, dtype=np.uint32)
        yield row0, chunk
