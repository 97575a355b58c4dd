"""DiskSim's ASCII traces, which MQSim and many SSD simulators also read: one request per line,
`time devno blkno size flags`, separated by white space.

blkno and size count 512-byte sectors. flags is hexadecimal (DiskSim reads it with "%x"), and
bit 0 set is a read: DiskSim's READ flag, MQSim's 1 (0 is a write). The time unit depends on
the tool that wrote the file: milliseconds, as a decimal number, for DiskSim; nanoseconds for
MQSim (its workload XML says which). So options["time_unit"] (--time-unit: s, ms, us or ns)
is required. Times count from the simulation's start (the import then starts the trace at its
first I/O, as every import does). devno becomes
the `device` column when the first block of lines holds more than one; options["device"]
keeps one devno.
"""
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traces.errors import ReplayError
from traces.formats import ordering, reading
from traces.schema import Op

NAME = "disksim"
DESCRIPTION = "DiskSim / MQSim ASCII trace (time devno blkno size flags); needs --time-unit"
SECTOR = 512
TIME_UNITS = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
# Simulator inputs converted from captured traces keep the capture's small disorder.
WINDOW_NS = 1_000_000_000
_RECORD = re.compile(r"^\s*[0-9.eE+-]+\s+\d+\s+\d+\s+\d+\s+(0[xX])?[0-9a-fA-F]+\s*$")


def _check(line: bytes) -> str | None:
    """What is wrong with one line, for the error path."""
    try:
        fields = line.decode("utf-8").split()
    except UnicodeDecodeError as e:
        return f"not UTF-8 text at column {e.start + 1}"
    if len(fields) != 5:
        return f"expected 5 fields (time devno blkno size flags) separated by white space, found {len(fields)}"
    try:
        float(fields[0])
    except ValueError:
        return f"time {fields[0][:40]!r} is not a number"
    for i, what in ((1, "devno"), (2, "blkno"), (3, "size")):
        if not fields[i].isdigit():
            return f"{what} {fields[i][:40]!r} is not a non-negative integer"
    try:
        int(fields[4], 16)
    except ValueError:
        return f"flags {fields[4][:40]!r} is not a hexadecimal number"
    return None


def sniff(path, head) -> bool:
    lines = reading.first_lines(head, 5)
    return bool(lines) and all(_RECORD.match(line) for line in lines)


def read(paths, options):
    unit = options.get("time_unit")
    if unit is None:
        raise ReplayError("a DiskSim-style trace does not say its time unit: give --time-unit "
                          "ms for DiskSim, ns for MQSim (or us, s)")
    if unit not in TIME_UNITS:
        raise ReplayError(f"--time-unit must be one of {', '.join(TIME_UNITS)}, not {unit!r}")
    wanted = reading.device_option(options, "devno")
    metadata = {
        "description": "Imported from DiskSim/MQSim ASCII traces: " + ", ".join(p.name for p in paths)
                       + (f", devno {wanted}" if wanted is not None else "") + f" (times in {unit}).",
        "source": {"kind": f"import:{NAME}", "time_unit": unit, "device": wanted},
    }
    meter = options.get("meter")
    streams = [ordering.ordered_chunks(p, _chunks(p, TIME_UNITS[unit], wanted, meter), WINDOW_NS,
                                      outliers=options.get("outliers")) for p in paths]
    return metadata, ordering.merge_sorted(streams)


def _fields(path, meter):
    """(row0, [time, devno, blkno, size, flags] string arrays) per block of lines."""
    for row0, batch in reading.read_blocks(path, ["line"], {"line": pa.string()}, check_line=_check,
                                           delimiter="\x1f", meter=meter):
        fields = pc.utf8_split_whitespace(pc.utf8_trim_whitespace(batch.column("line")))
        count = reading.numpy_of(pc.list_value_length(fields))
        if (bad := count != 5).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), _check(
                batch.column("line")[int(bad.argmax())].as_py().encode()) or "expected 5 fields")
        yield row0, batch, [pc.list_element(fields, i) for i in range(5)]


def _chunks(path, scale, wanted, meter):
    with_device = None
    for row0, batch, (time, devno, blkno, size, flags) in _fields(path, meter):
        try:
            seconds = reading.numpy_of(pc.cast(time, pa.float64()))
            numbers = [reading.numpy_of(pc.cast(c, pa.int64())) for c in (devno, blkno, size)]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise reading.locate_line(path, exc, _check) from None
        devices, sectors, counts = numbers
        if (bad := ~np.isfinite(seconds)).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), "time is not a finite number")
        if (bad := (devices < 0) | (devices > np.iinfo(np.uint32).max) | (sectors < 0) | (counts < 0)).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), "devno, blkno or size out of range")
        chunk = {
            "ts_ns": np.rint(seconds * scale).astype(np.int64),
            "op": _ops(path, flags, row0),
            "offset": sectors * SECTOR,
            "length": counts * SECTOR,
        }
        reading.check_rows(path, chunk, row0)
        if wanted is not None:
            keep = devices == wanted
            chunk = {k: v[keep] for k, v in chunk.items()}
            chunk["_row"] = row0 + np.flatnonzero(keep)
        else:
            if with_device is None:
                with_device = len(devices) > 0 and devices.min() != devices.max()
                first_devno = int(devices[0]) if len(devices) else 0
            if with_device:
                chunk["device"] = devices.astype(np.uint32)
            elif (other := devices != first_devno).any():
                raise reading.fail_at(path, row0 + int(other.argmax()), f"a second devno "
                                      f"({int(devices[other.argmax()])}, after {first_devno}) appears "
                                      "after the first block of lines; import one devno at a time "
                                      "with --device")
        yield row0, chunk


def _ops(path, flags, row0) -> np.ndarray:
    """Read or write from the hexadecimal flags, through their few distinct values."""
    encoded = flags.dictionary_encode()
    codes = []
    for value in encoded.dictionary.to_pylist():
        try:
            codes.append(Op.READ if int(value, 16) & 1 else Op.WRITE)
        except ValueError:
            i = int(np.flatnonzero(reading.numpy_of(pc.equal(flags, value)))[0])
            raise reading.fail_at(path, row0 + i, f"flags {value[:40]!r} is not a hexadecimal number") from None
    table = np.array(codes or [0], dtype=np.uint8)
    return table[reading.numpy_of(encoded.indices)] if len(flags) else np.zeros(0, np.uint8)
