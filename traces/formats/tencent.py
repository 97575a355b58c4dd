"""Tencent CBS block traces (SNIA IOTTA): headerless CSV Timestamp,Offset,Size,IOType,VolumeID.

Timestamps are whole Unix seconds, so many I/Os share one: the n I/Os of a second are
spread evenly over it (the k-th at k/n s), and the metadata says so. Offset and Size are in
512-byte sectors; IOType 0 is a read, 1 a write. options["device"] keeps one VolumeID;
otherwise `device` is the VolumeID.
"""
import datetime

import numpy as np
import pyarrow as pa

from traces.errors import TraceFormatError
from traces.formats import ordering, reading
from traces.schema import Op

NAME = "tencent"
DESCRIPTION = "Tencent CBS CSV (Timestamp,Offset,Size,IOType,VolumeID)"
SECTOR = 512
NAMES = ["ts", "offset", "size", "iotype", "volume"]
TYPES = {n: pa.int64() for n in NAMES}
KINDS = ("int",) * 5
PROVENANCE = ("Tencent Cloud Block Storage traces (Zhang et al., USENIX ATC 2020), distributed "
              "by the SNIA IOTTA repository under its own terms of use; check them before "
              "redistributing.")
TIMING = ("Tencent CBS timestamps are whole seconds: the I/Os sharing a second were spread "
          "evenly over it, so times within a second are not the captured ones.")


def _parse(line):
    parts = line.split(",")
    if len(parts) != 5:
        return None
    try:
        values = [int(p) for p in parts]
    except ValueError:
        return None
    return values if values[3] in (0, 1) else None


def sniff(path, head) -> bool:
    lines = reading.first_lines(head)
    # Whole Unix seconds: 10^9 .. 10^10 for dates from 2001 to 2286.
    return bool(lines) and all(_parse(line) for line in lines) and 10**9 <= _parse(lines[0])[0] < 10**10


def read(paths, options):
    wanted = reading.device_option(options, "VolumeID")
    origin = None
    for path in paths:
        first = ordering.first_record(path, _parse, reading.field_checker(KINDS), "IOType must be 0 or 1",
                                     lambda f: f[0], 10**9, options.get("outliers"))
        if first is None:
            continue
        number, parsed = first
        if not 10**9 <= parsed[0] < 10**10:
            raise TraceFormatError(path, f"line {number}: Timestamp {parsed[0]} is not in whole "
                                   "seconds since 1970 (about 1.54e9 for 2018)")
        origin = parsed[0] if origin is None else min(origin, parsed[0])
    origin = origin or 0
    metadata = {
        "description": "Imported from the Tencent CBS block traces: " + ", ".join(p.name for p in paths)
                       + (f", volume {wanted}" if wanted is not None else "") + ". " + TIMING,
        "source": {"kind": "import:tencent", "device": wanted, "time_origin_ns": origin * 10**9,
                   "timing": "spread-within-second"},
        "provenance": PROVENANCE,
        "start_wallclock": datetime.datetime.fromtimestamp(origin, datetime.timezone.utc).isoformat(),
    }
    meter = options.get("meter")
    streams = [ordering.spread_seconds(p, _outliers(p, _chunks(p, wanted, meter), options.get("outliers")),
                                       origin)
               for p in paths]
    return metadata, ordering.merge_sorted(streams)


def _chunks(path, wanted, meter):
    blocks = reading.read_blocks(path, NAMES, TYPES, check_line=reading.field_checker(KINDS), meter=meter)
    for row0, batch in blocks:
        iotype = reading.numpy_of(batch.column("iotype"))
        if (bad := (iotype != 0) & (iotype != 1)).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), f"IOType {iotype[bad.argmax()]}; "
                                  "expected 0 (read) or 1 (write)")
        volume = reading.numpy_of(batch.column("volume"))
        if (bad := (volume < 0) | (volume > np.iinfo(np.uint32).max)).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), "VolumeID out of range")
        seconds = reading.numpy_of(batch.column("ts"))
        chunk = {
            "ts_ns": seconds,  # whole seconds until ordering.spread_seconds
            "op": np.where(iotype == 0, Op.READ, Op.WRITE).astype(np.uint8),
            "offset": reading.numpy_of(batch.column("offset")) * SECTOR,
            "length": reading.numpy_of(batch.column("size")) * SECTOR,
            "_row": np.arange(row0, row0 + len(seconds)),
        }
        reading.check_rows(path, chunk, row0)
        if wanted is None:
            chunk["device"] = volume.astype(np.uint32)
        else:
            keep = volume == wanted
            chunk = {k: v[keep] for k, v in chunk.items()}
        yield chunk


def _outliers(path, chunks, log):
    """ordering.Outliers over whole seconds."""
    spikes = ordering.Outliers(path, log, lambda row: reading.line_of_row(path, row), scale=10**9)
    for chunk in chunks:
        yield spikes.push(chunk, 0)
    rest = spikes.finish()
    if rest:
        yield rest
