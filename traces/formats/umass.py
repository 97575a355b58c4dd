"""UMass Trace Repository SPC traces (Financial1/2, WebSearch1-3): headerless CSV.

ASU,LBA,Size,Opcode,Timestamp[,more]: LBA in 512-byte blocks within the ASU's own address
space, Size in bytes, Opcode r/w in any case, Timestamp in seconds from the trace start.
options["asu"]: "devices" (default) makes each ASU a device number (column `device`);
"concat" lays the ASUs one after another in one address space, each ASU's span rounded
up to 1 MiB, and records the layout in the metadata.
"""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traces.errors import ReplayError
from traces.formats import ordering, reading
from traces.schema import Op

NAME = "umass"
DESCRIPTION = "UMass SPC CSV (ASU,LBA,Size,Opcode,Timestamp)"
SECTOR = 512
ALIGN = 1 << 20
WORDS = {"r": Op.READ, "R": Op.READ, "w": Op.WRITE, "W": Op.WRITE}
KINDS = ("int", "int", "int", "str", "float")
PROVENANCE = ("SPC traces from the UMass Trace Repository (traces.cs.umass.edu), made "
              "available by the Storage Performance Council; check the repository's terms "
              "before redistributing this trace.")


def _parse(line):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) < 5 or parts[3] not in WORDS:
        return None
    try:
        return int(parts[0]), int(parts[1]), int(parts[2]), float(parts[4]), len(parts)
    except ValueError:
        return None


def sniff(path, head) -> bool:
    lines = reading.first_lines(head)
    return bool(lines) and all(_parse(line) for line in lines)


def read(paths, options):
    mode = options.get("asu") or "devices"
    if mode not in ("devices", "concat"):
        raise ReplayError(f"--asu must be devices or concat, not {mode!r}")
    meter = options.get("meter")
    checker = reading.field_checker(KINDS, min_fields=5)
    for path in paths:
        ordering.first_record(path, _parse, checker, "Opcode must be r or w")
    metadata = {
        "description": "Imported from the UMass SPC traces: " + ", ".join(p.name for p in paths) + ".",
        "source": {"kind": "import:umass", "asu": mode},
        "provenance": PROVENANCE,
    }
    if mode == "concat":
        # Each ASU's span must be known before the first offset can be placed: a first pass.
        spans = {}
        for path in paths:
            for _, batch in _blocks(path, None):
                asu, end = _asu_end(batch)
                for a in np.unique(asu):
                    spans[int(a)] = max(spans.get(int(a), 0), int(end[asu == a].max()))
        base, bases = 0, {}
        for a in sorted(spans):
            bases[a] = base
            base += -(-spans[a] // ALIGN) * ALIGN
        metadata["source"]["asu_offsets"] = {str(a): b for a, b in bases.items()}
        metadata["device_size"] = base
        table = np.zeros(max(bases, default=0) + 1, dtype=np.int64)
        table[list(bases)] = list(bases.values())
    else:
        table = None
    streams = [ordering.ordered_chunks(p, _chunks(p, table, meter), 0, outliers=options.get("outliers"))
               for p in paths]
    return metadata, ordering.merge_sorted(streams)


_COLUMNS = (("asu", pa.int64()), ("lba", pa.int64()), ("size", pa.int64()), ("opcode", None),
            ("ts", pa.float64()))


def _blocks(path, meter):
    """(row0, batch of asu, lba, size, opcode, ts): the first five fields of each record.

    The SPC format lets the optional fields after the fifth vary from record to record, so a
    line is read whole (\x1f never occurs in one; a line holding it makes pyarrow refuse the
    block, which the rescan reports by line) and split on its first five commas.
    """
    check = reading.field_checker(KINDS, min_fields=5)
    for row0, batch in reading.read_blocks(path, ["line"], {"line": pa.string()}, check_line=check,
                                           delimiter="\x1f", meter=meter):
        line = batch.column("line")
        # Spaces may follow the commas; trimming costs a pass per field, so only when present.
        spaced = pc.any(pc.match_substring(line, " ")).as_py()
        fields = pc.split_pattern(line, ",", max_splits=5)
        if (pc.min(pc.list_value_length(fields)).as_py() or 0) < 5:
            count = reading.numpy_of(pc.list_value_length(fields))
            i = int((count < 5).argmax())
            raise reading.fail_at(path, row0 + i, f"expected at least 5 fields separated by ',', "
                                  f"found {count[i]}")
        arrays = []
        for i, (name, type_) in enumerate(_COLUMNS):
            text = pc.list_element(fields, i)
            text = pc.utf8_trim_whitespace(text) if spaced or type_ is None else text
            if type_ is None:
                arrays.append(text.dictionary_encode())
                continue
            try:
                arrays.append(pc.cast(text, type_))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise reading.locate_line(path, exc, check) from None
        yield row0, pa.RecordBatch.from_arrays(arrays, [n for n, _ in _COLUMNS])


def _asu_end(batch):
    asu = reading.numpy_of(batch.column("asu"))
    end = reading.numpy_of(batch.column("lba")) * SECTOR + reading.numpy_of(batch.column("size"))
    return asu, end


def _chunks(path, table, meter):
    for row0, batch in _blocks(path, meter):
        asu = reading.numpy_of(batch.column("asu"))
        if (bad := asu < 0).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), "negative ASU")
        seconds = reading.numpy_of(batch.column("ts"))
        if (bad := ~np.isfinite(seconds)).any():
            raise reading.fail_at(path, row0 + int(bad.argmax()), "timestamp is not a finite number")
        offset = reading.numpy_of(batch.column("lba")) * SECTOR
        chunk = {
            "ts_ns": np.rint(seconds * 1e9).astype(np.int64),
            "op": reading.op_from_words(path, batch.column("opcode"), WORDS, row0),
            "offset": offset,
            "length": reading.numpy_of(batch.column("size")),
        }
        reading.check_rows(path, chunk, row0)
        if table is None:
            chunk["device"] = asu.astype(np.uint32)
        else:
            chunk["offset"] = offset + table[asu]
        yield row0, chunk
