"""Alibaba Cloud block traces (2020): headerless CSV device_id,opcode,offset,length,timestamp.

Offsets and lengths in bytes, timestamps in microseconds since the Unix epoch; the first
time becomes 0. device_size.csv beside the trace (device_id,capacity in bytes) gives the
device sizes. options["device"] keeps one device_id; otherwise `device` is the device_id.
"""
import datetime

import numpy as np
import pyarrow as pa

from traces.errors import TraceFormatError
from traces.formats import ordering, reading
from traces.schema import Op

NAME = "alibaba"
DESCRIPTION = "Alibaba 2020 block traces CSV (device_id,opcode,offset,length,timestamp)"
NAMES = ["device", "opcode", "offset", "length", "ts"]
TYPES = {"device": pa.int64(), "opcode": reading.WORD, "offset": pa.int64(),
         "length": pa.int64(), "ts": pa.int64()}
KINDS = ("int", "str", "int", "int", "int")
WORDS = {"R": Op.READ, "W": Op.WRITE}
SIZES_FILE = "device_size.csv"
# Requests from several hosts are merged in the published files: small disorder happens.
WINDOW_NS = 1_000_000_000
PROVENANCE = ("Alibaba Cloud block-storage traces 2020 (Li et al., IISWC 2020), published at "
              "github.com/alibaba/block-traces; check its terms before redistributing.")


def _parse(line):
    parts = line.split(",")
    if len(parts) != 5 or parts[1] not in WORDS:
        return None
    try:
        return [int(parts[i]) for i in (0, 2, 3, 4)]
    except ValueError:
        return None


def sniff(path, head) -> bool:
    lines = reading.first_lines(head)
    # Timestamps are microseconds since 1970: 10^15 and more for any date after 2001.
    return bool(lines) and all(_parse(line) for line in lines) and _parse(lines[0])[3] > 10**14


def _sizes(path):
    sizes_path = path.with_name(SIZES_FILE)
    if not sizes_path.is_file():
        return None
    sizes = {}
    check = reading.field_checker(("int", "int"))
    for number, line in reading.iter_lines(sizes_path):
        problem = check(line)
        if problem:
            if number == 1 and not line[:1].isdigit():
                continue  # a header line
            raise TraceFormatError(sizes_path, f"line {number}: {problem}")
        device, size = (int(x) for x in line.split(b","))
        sizes[device] = size
    return sizes


def read(paths, options):
    wanted = reading.device_option(options, "device_id")
    origin = None
    for path in paths:
        first = ordering.first_record(path, _parse, reading.field_checker(KINDS), "opcode must be R or W",
                                     lambda f: f[3], 1000, options.get("outliers"))
        if first is None:
            continue
        number, parsed = first
        if parsed[3] < 10**14:
            raise TraceFormatError(path, f"line {number}: timestamp {parsed[3]} is not in microseconds "
                                   "since 1970 (about 1.58e15 for 2020)")
        origin = parsed[3] if origin is None else min(origin, parsed[3])
    origin = origin or 0
    sizes = _sizes(paths[0])
    metadata = {
        "description": "Imported from the Alibaba 2020 block traces: "
                       + ", ".join(p.name for p in paths)
                       + (f", device {wanted}" if wanted is not None else "") + ".",
        "source": {"kind": "import:alibaba", "device": wanted, "time_origin_ns": origin * 1000},
        "provenance": PROVENANCE,
        "start_wallclock": datetime.datetime.fromtimestamp(origin / 1e6, datetime.timezone.utc).isoformat(),
    }
    if sizes is not None:
        if wanted is not None:
            if wanted not in sizes:
                raise TraceFormatError(paths[0].with_name(SIZES_FILE), f"no size for device {wanted}")
            metadata["device_size"] = sizes[wanted]
        else:
            metadata["source"]["device_sizes"] = {str(k): v for k, v in sorted(sizes.items())}
            metadata["device_size"] = max(sizes.values(), default=0)
    meter = options.get("meter")
    streams = [ordering.ordered_chunks(p, _chunks(p, wanted, origin, meter), WINDOW_NS,
                                      outliers=options.get("outliers")) for p in paths]
    return metadata, ordering.merge_sorted(streams)


def _chunks(path, wanted, origin, meter):
    blocks = reading.read_blocks(path, NAMES, TYPES, check_line=reading.field_checker(KINDS), meter=meter)
    for row0, batch in blocks:
        device = reading.numpy_of(batch.column("device"))
        if (bad := (device < 0) | (device > np.iinfo(np.uint32).max)).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), "device_id out of range")
        chunk = {
            "ts_ns": (reading.numpy_of(batch.column("ts")) - origin) * 1000,
            "op": reading.op_from_words(path, batch.column("opcode"), WORDS, row0),
            "offset": reading.numpy_of(batch.column("offset")),
            "length": reading.numpy_of(batch.column("length")),
        }
        reading.check_rows(path, chunk, row0)
        if wanted is None:
            chunk["device"] = device.astype(np.uint32)
        else:
            keep = device == wanted
            chunk = {k: v[keep] for k, v in chunk.items()}
            chunk["_row"] = row0 + np.flatnonzero(keep)  # for ordering errors' line numbers
        yield row0, chunk
