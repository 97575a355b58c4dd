"""FIU traces (SNIA IOTTA: homes, mail, web-vm): whitespace-separated text.

ts pid process lba size R/W major minor md5: ts in ns from an arbitrary origin, lba and
size in 512-byte sectors. The first time becomes 0; pid and process fill pid and comm.
"""
import numpy as np
import pyarrow as pa

from traces.formats import ordering, reading
from traces.schema import Op

NAME = "fiu"
DESCRIPTION = "FIU text (ts pid process lba size R/W major minor md5)"
SECTOR = 512
NAMES = ["ts", "pid", "comm", "lba", "size", "rw", "major", "minor", "md5"]
TYPES = {"ts": pa.int64(), "pid": pa.int64(), "comm": pa.string(), "lba": pa.int64(),
         "size": pa.int64(), "rw": reading.WORD}
KINDS = ("int", "int", "str", "int", "int", "str", "int", "int", "str")
WORDS = {"R": Op.READ, "W": Op.WRITE}
# Captured on several CPUs: requests may be logged slightly out of order.
WINDOW_NS = 1_000_000_000
PROVENANCE = ("FIU block traces (Koller and Rangaswami, FAST 2010), distributed by the SNIA "
              "IOTTA repository under its own terms of use; check them before redistributing.")


def _parse(line):
    parts = line.split(" ")
    if len(parts) != 9 or parts[5] not in WORDS:
        return None
    try:
        return [int(parts[i]) for i in (0, 1, 3, 4, 6, 7)]
    except ValueError:
        return None


def sniff(path, head) -> bool:
    lines = reading.first_lines(head)
    return bool(lines) and all(_parse(line) for line in lines)


def read(paths, options):
    checker = reading.field_checker(KINDS, delimiter=" ")
    firsts = [first[1] for path in paths
              if (first := ordering.first_record(path, _parse, checker, "operation must be R or W",
                                                lambda f: f[0], 1, options.get("outliers")))]
    origin = min((f[0] for f in firsts), default=0)
    devices = sorted({(f[4], f[5]) for f in firsts})
    metadata = {
        "description": "Imported from the FIU block traces: " + ", ".join(p.name for p in paths) + ".",
        "source": {"kind": "import:fiu", "time_origin_ns": origin,
                   "devices": [f"{a}:{b}" for a, b in devices]},
        "provenance": PROVENANCE,
    }
    meter = options.get("meter")
    streams = [ordering.ordered_chunks(p, _chunks(p, i if len(paths) > 1 else None, origin, meter),
                                      WINDOW_NS, outliers=options.get("outliers"))
               for i, p in enumerate(paths)]
    return metadata, ordering.merge_sorted(streams)


def _chunks(path, device, origin, meter):
    check = reading.field_checker(KINDS, delimiter=" ")
    blocks = reading.read_blocks(path, NAMES, TYPES, check_line=check, delimiter=" ",
                                 include=["ts", "pid", "comm", "lba", "size", "rw"], meter=meter)
    for row0, batch in blocks:
        pid = reading.numpy_of(batch.column("pid"))
        if (bad := (pid < 0) | (pid > np.iinfo(np.int32).max)).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), "pid out of range")
        chunk = {
            "ts_ns": reading.numpy_of(batch.column("ts")) - origin,
            "op": reading.op_from_words(path, batch.column("rw"), WORDS, row0),
            "offset": reading.numpy_of(batch.column("lba")) * SECTOR,
            "length": reading.numpy_of(batch.column("size")) * SECTOR,
            "pid": pid.astype(np.int32),
            "comm": reading.numpy_of(batch.column("comm")),
        }
        reading.check_rows(path, chunk, row0)
        if device is not None:
            chunk["device"] = np.full(len(pid), device, dtype=np.uint32)
        yield row0, chunk
