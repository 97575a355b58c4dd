"""fio iolog versions 2 and 3: import, and export as version 3 for `fio --read_iolog`.

v2: `fio version 2 iolog`, then `FILE add|open|close`, `FILE read|write|trim OFF LEN`,
`FILE sync|datasync [OFF LEN]` and `FILE wait USEC` (time advances only by waits).
v3: `fio version 3 iolog`, then `USEC FILE ACTION [OFF LEN]`, USEC since the run's start.
Each distinct file name is one device (column `device`) when there are several.
"""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from traces.errors import TraceFormatError
from traces.formats import ordering, reading
from traces.schema import Op

NAME = "fio"
DESCRIPTION = "fio iolog version 2 or 3 (fio --write_iolog)"

HEADERS = {b"fio version 2 iolog": 2, b"fio version 3 iolog": 3}
IO_WORDS = {"read": Op.READ, "write": Op.WRITE, "trim": Op.DISCARD,
            "sync": Op.FLUSH, "datasync": Op.FLUSH}
FILE_WORDS = ("add", "open", "close")
DEFAULT_FILENAME = "tracereplay.img"


def sniff(path, head) -> bool:
    return head.split(b"\n", 1)[0].rstrip(b"\r") in HEADERS


def _version(path) -> int:
    first = next(reading.iter_lines(path), None)
    version = HEADERS.get(first[1].rstrip() if first else b"")
    if version is None or first[0] != 1:
        raise TraceFormatError(path, "line 1: not a fio iolog; it must start with "
                               "'fio version 2 iolog' or 'fio version 3 iolog'")
    return version


def read(paths, options):
    versions = [_version(p) for p in paths]
    names = {name: number for number, name in enumerate(_file_names(paths, versions))}
    metadata = {
        "description": "Imported from fio iologs: " + ", ".join(p.name for p in paths) + ".",
        "source": {"kind": "import:fio", "iolog_versions": versions, "files": names},
    }
    meter = options.get("meter")
    chunks = ordering.merge_sorted([_file(p, v, names, meter) for p, v in zip(paths, versions)])
    if len(names) <= 1:
        chunks = ({k: v for k, v in c.items() if k != "device"} for c in chunks)
    return metadata, chunks


def _file_names(paths, versions):
    """Every file name the logs add, in order of first appearance (a first, quick pass)."""
    seen = []
    for path, version in zip(paths, versions):
        for _, batch in _lines(path, None):
            fields = _split(batch)
            filename, action = _columns(fields, version)[:2]
            is_add = numpy_bool(pc.equal(action, "add"))
            for name in filename.filter(pa.array(is_add)).to_pylist():
                if name not in seen:
                    seen.append(name)
    return seen


def numpy_bool(array):
    return reading.numpy_of(pc.fill_null(array, False)).astype(bool)


def _lines(path, meter):
    # One string column per line: \x1f never occurs in an iolog, and a line holding one
    # makes pyarrow refuse the block, which the rescan reports by line.
    return reading.read_blocks(path, ["line"], {"line": pa.string()}, check_line=_check,
                               delimiter="\x1f", skip_rows=1, meter=meter)


def _check(line: bytes):
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    if "\x1f" in text:
        return "control character 0x1f in the line"
    return None


def _split(batch):
    """Space-split fields, padded with empty strings so that every line has at least 5."""
    line = batch.column("line")
    count = reading.numpy_of(pc.list_value_length(pc.split_pattern(line, " ")))
    padded = pc.binary_join_element_wise(line, pa.scalar("    "), "")
    return pc.split_pattern(padded, " "), count


def _columns(split, version):
    """(file, action, off, len, usec, field count) of a split batch; absent fields are ''."""
    fields, count = split
    get = [pc.list_element(fields, i) for i in range(5)]
    if version == 3:
        return get[1], get[2], get[3], get[4], get[0], count
    return get[0], get[1], get[2], get[3], None, count


def _ints(path, column, ok, row0, what):
    """int64 values of `column` where `ok`; a bad number is an error naming its line."""
    values = pc.if_else(pa.array(ok), column, "0")
    good = pc.match_substring_regex(values, r"^[0-9]+$")
    bad = ~numpy_bool(good)
    if bad.any():
        i = int(bad.argmax())
        raise reading.fail_at(path, row0 + i, f"{what} {column[i].as_py()!r} is not a "
                              "non-negative integer", skip_rows=1)
    return reading.numpy_of(pc.cast(values, pa.int64()))


def _file(path, version, names, meter):
    clock = 0  # v2: microseconds of waits so far
    last = None
    for row0, batch in _lines(path, meter):
        fields = _split(batch)
        filename, action, off, length, usec, count = _columns(fields, version)
        action_np = reading.numpy_of(pc.fill_null(action, "")).astype(str) if len(action) else np.zeros(0, str)
        op = np.full(len(batch), 255, dtype=np.uint8)
        for word, code in IO_WORDS.items():
            op[action_np == word] = code
        is_file = np.isin(action_np, FILE_WORDS)
        is_wait = action_np == "wait"
        is_io = op != 255
        data_fields = 4 if version == 2 else 5
        flush = (op == Op.FLUSH)
        shape_ok = np.where(is_io, (count == data_fields) | (flush & (count == data_fields - 2)),
                            np.where(is_file, count == data_fields - 2,
                                     is_wait & (version == 2) & ((count == 3) | (count == 4))))
        if (bad := ~shape_ok).any():
            i = int(bad.argmax())
            word = str(action_np[i]) if i < len(action_np) else ""  # not numpy's repr in the message
            problem = (f"unknown action {word!r}; expected read, write, trim, sync, datasync, "
                       "add, open, close" + (" or wait" if version == 2 else "")
                       if not (is_io[i] or is_file[i] or is_wait[i])
                       else f"wrong number of fields ({count[i]}) for {word!r}")
            raise reading.fail_at(path, row0 + i, problem, skip_rows=1)
        has_data = is_io & (count == data_fields)
        offsets = _ints(path, off, has_data, row0, "offset")
        lengths = _ints(path, length, has_data, row0, "length")
        if version == 3:
            micros = _ints(path, usec, np.ones(len(batch), bool), row0, "time")
        else:
            waits = _ints(path, off, is_wait, row0, "wait")
            micros = clock + np.cumsum(waits)
            clock = int(micros[-1]) if len(micros) else clock
        keep = is_io
        chunk = {
            "ts_ns": micros[keep] * 1000,
            "op": op[keep],
            "offset": offsets[keep],
            "length": lengths[keep],
        }
        kept = filename.filter(pa.array(keep))
        device = np.zeros(len(kept), dtype=np.uint32)
        known = np.zeros(len(kept), dtype=bool)
        for name, number in names.items():
            hit = numpy_bool(pc.equal(kept, name))
            device[hit], known[hit] = number, True
        rows = np.flatnonzero(keep) + row0
        if (bad := ~known).any():
            raise reading.fail_at(path, int(rows[bad.argmax()]), f"I/O on {kept[int(bad.argmax())].as_py()!r}, "
                                  "a file the log never adds", skip_rows=1)
        chunk["device"] = device
        _check_io(path, chunk, rows)
        ts = chunk["ts_ns"]
        if len(ts):
            if last is not None and ts[0] < last:
                raise _back(path, int(rows[0]), last, ts[0])
            if (down := ts[1:] < ts[:-1]).any():
                i = int(down.argmax())
                raise _back(path, int(rows[i + 1]), ts[i], ts[i + 1])
            last = int(ts[-1])
            yield chunk


def _back(path, row, before, after):
    return reading.fail_at(path, row, f"time goes back from {before // 1000} to {after // 1000} us",
                           skip_rows=1)


def _check_io(path, chunk, rows):
    data = chunk["op"] != Op.FLUSH
    if (bad := data & (chunk["length"] <= 0)).any():
        raise reading.fail_at(path, int(rows[bad.argmax()]), "length must be greater than 0 "
                              "for a read, write or trim", skip_rows=1)


_ACTIONS = np.array(["read", "write", "trim", "sync"])


def write(trace, out, options):
    """Write `trace` as a fio iolog v3: each device is one file, named by options["filename"]
    (default tracereplay.img; device N of a multi-device trace adds ".N"). Replay it with
    `fio --read_iolog OUT --replay_redirect /dev/sdX` to send it to a drive.
    """
    base = options.get("filename") or DEFAULT_FILENAME
    has_device = trace.has("device")
    devices = set()
    if has_device:
        for chunk in trace.chunks(["device"]):
            devices.update(np.unique(chunk["device"]).tolist())
    devices = sorted(devices) or [0]
    filenames = {d: (f"{base}.{d}" if has_device and len(devices) > 1 else base) for d in devices}
    columns = ["ts_ns", "op", "offset", "length"] + (["device"] if has_device else [])
    with open(out, "w", encoding="utf-8") as f:
        f.write("fio version 3 iolog\n")
        for name in filenames.values():
            f.write(f"0 {name} add\n")
        for name in filenames.values():
            f.write(f"0 {name} open\n")
        last = 0
        name_table = np.array([filenames[d] for d in devices], dtype=object)
        for chunk in trace.chunks(columns):
            if not len(chunk["ts_ns"]):
                continue
            micros = chunk["ts_ns"] // 1000
            index = np.searchsorted(devices, chunk["device"]) if has_device else np.zeros(len(micros), int)
            lines = pc.binary_join_element_wise(
                pa.array(micros).cast(pa.string()), pa.array(name_table[index], pa.string()),
                pa.array(_ACTIONS[chunk["op"]]), pa.array(chunk["offset"]).cast(pa.string()),
                pa.array(chunk["length"]).cast(pa.string()), " ")
            f.write("\n".join(lines.to_pylist()))
            f.write("\n")
            last = int(micros[-1])
        for name in filenames.values():
            f.write(f"{last} {name} close\n")
