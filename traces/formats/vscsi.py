"""VMware vscsiStats binary traces, the layout of the CloudPhysics set (106 week-long traces of
production VMs), as libCacheSim reads them (traceReader/customizedReader/vscsi.h): import.

Fixed-size little-endian records, no header, in one of two layouts told apart by the version
field (its high byte is 1 or 2 in the first two records; version 2 is tested first):

    vscsi1, 32 bytes: u32 sn, u32 len, u32 nSG, u16 cmd, u16 ver, u64 lbn, u64 ts
    vscsi2, 40 bytes: u16 cmd, u16 ver, u32 sn, u32 len, u32 nSG, u64 lbn, u64 ts, u64 rt

len is in bytes, lbn in 512-byte sectors, ts in microseconds; rt, the response time, is read
as microseconds too. cmd is the SCSI opcode: READ(6/10/12/16) are reads, WRITE(6/10/12/16)
writes, SYNCHRONIZE CACHE(10/16) flushes; other commands (INQUIRY, TEST UNIT READY, ...) move
no data and are left out, counted by opcode in the metadata.
"""
import numpy as np

from traces.errors import TraceFormatError
from traces.formats import ordering, reading
from traces.schema import Op

NAME = "vscsi"
DESCRIPTION = "VMware vscsiStats / CloudPhysics binary trace (vscsi1 32-byte or vscsi2 40-byte records)"
SECTOR = 512
V1 = np.dtype([("sn", "<u4"), ("len", "<u4"), ("nsg", "<u4"), ("cmd", "<u2"), ("ver", "<u2"),
               ("lbn", "<u8"), ("ts", "<u8")])
V2 = np.dtype([("cmd", "<u2"), ("ver", "<u2"), ("sn", "<u4"), ("len", "<u4"), ("nsg", "<u4"),
               ("lbn", "<u8"), ("ts", "<u8"), ("rt", "<u8")])
LAYOUTS = {2: V2, 1: V1}  # in the order libCacheSim tests them
assert V1.itemsize == 32 and V2.itemsize == 40
SKIP = 255
# Op of each SCSI opcode (low byte of cmd); SKIP for commands without data.
OPS = np.full(256, SKIP, np.uint8)
OPS[[0x08, 0x28, 0xA8, 0x88]] = Op.READ
OPS[[0x0A, 0x2A, 0xAA, 0x8A]] = Op.WRITE
OPS[[0x35, 0x91]] = Op.FLUSH
# Several virtual CPUs issue into one trace: small disorder is sorted, as in the text formats.
WINDOW_NS = 1_000_000_000
PROVENANCE = ("VMware vscsiStats traces; the CloudPhysics set (Waldspurger et al., FAST 2015) is "
              "distributed with its own terms; check them before redistributing.")


def version(head: bytes) -> int | None:
    """1 or 2 when the first two records (or the only one) carry that version, as libCacheSim
    decides; None otherwise."""
    for number, layout in LAYOUTS.items():
        count = min(2, len(head) // layout.itemsize)
        if count and all(v >> 8 == number for v in np.frombuffer(head, layout, count=count)["ver"]):
            return number
    return None


def sniff(path, head) -> bool:
    number = version(head)
    if number is None:
        return False
    first = np.frombuffer(head, LAYOUTS[number], count=1)[0]
    return OPS[first["cmd"] & 0xFF] != SKIP or first["len"] == 0


def read(paths, options):
    heads = []
    for path in paths:
        with reading.open_text(path) as f:
            head = f.read(2 * V2.itemsize)
        number = version(head)
        if number is None:
            raise TraceFormatError(path, "byte offset 0: not a vscsi trace (the version field of the "
                                   "first records is neither vscsi1's 0x01xx nor vscsi2's 0x02xx)")
        heads.append((number, int(np.frombuffer(head, LAYOUTS[number], count=1)[0]["ts"])))
    origin_us = min(ts for _, ts in heads)
    skipped = {}
    metadata = {
        "description": "Imported from vscsi traces: " + ", ".join(p.name for p in paths) + ".",
        "source": {"kind": f"import:{NAME}", "versions": [n for n, _ in heads],
                   "time_origin_ns": origin_us * 1000, "skipped_commands": skipped},
        "provenance": PROVENANCE,
    }
    meter = options.get("meter")
    streams = [_ordered(p, _chunks(p, LAYOUTS[n], origin_us, skipped, meter, i if len(paths) > 1 else None))
               for i, (p, (n, _)) in enumerate(zip(paths, heads))]
    return metadata, ordering.merge_sorted(streams)


def _ordered(path, chunks):
    order = ordering.Ordered(path, WINDOW_NS, line_of=lambda row: row, unit="record")
    for chunk in chunks:
        if (out := order.push(chunk, 0)) is not None and len(out["ts_ns"]):
            yield out
    if (out := order.finish()) is not None and len(out["ts_ns"]):
        yield out


def _chunks(path, layout, origin_us, skipped, meter, device):
    for index, records in reading.record_blocks(path, layout, meter):
        ts = records["ts"]
        if (bad := ts < origin_us).any():
            i = int(bad.argmax())
            raise TraceFormatError(path, f"record {index + i} (byte offset {(index + i) * layout.itemsize}): "
                                   "time before the first record's; is the file sorted by time?")
        op = OPS[records["cmd"] & 0xFF]
        keep = op != SKIP
        if (bad := keep & (records["lbn"] >= 1 << 54)).any():
            i = int(bad.argmax())
            raise TraceFormatError(path, f"record {index + i} (byte offset {(index + i) * layout.itemsize}): "
                                   f"lbn {records['lbn'][i]} is beyond any disk (2^54 sectors)")
        if not keep.all():
            codes, counts = np.unique(records["cmd"][~keep] & 0xFF, return_counts=True)
            for code, count in zip(codes.tolist(), counts.tolist()):
                skipped[f"0x{code:02x}"] = skipped.get(f"0x{code:02x}", 0) + count
        data = op != Op.FLUSH
        chunk = {
            "ts_ns": ((ts - origin_us) * 1000).astype(np.int64),
            "op": op,
            "offset": np.where(data, records["lbn"] * SECTOR, 0).astype(np.int64),
            "length": np.where(data, records["len"], 0).astype(np.int64),
            "_row": np.arange(index, index + len(records), dtype=np.int64),
        }
        if "rt" in layout.names:
            chunk["latency_ns"] = (records["rt"] * 1000).astype(np.int64)
        if device is not None:
            chunk["device"] = np.full(len(records), device, np.uint32)
        if not keep.all():
            chunk = {k: v[keep] for k, v in chunk.items()}
        if (bad := (chunk["op"] != Op.FLUSH) & (chunk["length"] <= 0)).any():
            row = int(chunk["_row"][bad.argmax()])
            raise TraceFormatError(path, f"record {row} (byte offset {row * layout.itemsize}): a read or "
                                   "write of 0 bytes")
        yield chunk
