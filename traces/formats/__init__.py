"""Trace formats that `replay import` reads and `replay export` writes, one module each.

Every format module defines:
    NAME: str                 the --format name
    DESCRIPTION: str          one line for help texts
    sniff(path, head) -> bool whether `head` (the first 64 KiB, decompressed) is this format
    read(paths, options) -> (metadata: dict, chunks: Iterator[dict[str, np.ndarray]])
        streams the trace in chunks in the common schema (traces.schema), in bounded memory,
        raising traces.errors.TraceFormatError with the file and line or byte offset; where
        it counts times from other than the file's zero, metadata["source"]["time_origin_ns"]
        says from where, in ns on the file's clock (the import then starts the trace at its
        first I/O and adds that I/O's time)
and optionally
    write(trace: traces.trace.TraceFile, out: Path, options: dict) -> None   (export)
    EMPTY_FILES_OK = True     an empty input file is no mistake (blktrace's idle CPUs)

What the formats share, in modules that are not formats: `inputs` (opening compressed
inputs, the sniffing head), `reading` (lines and blocks of delimited text, errors located to
a line) and `ordering` (time order, outliers, merging several inputs).
"""
import importlib
from pathlib import Path

from traces.errors import TraceFormatError
from traces.formats.inputs import read_head

# In sniffing order: the binary and self-describing formats first, bare CSVs last.
NAMES = ("blktrace", "vscsi", "oraclegeneral", "fio", "blkparse", "blkreplay", "fiu", "disksim", "netapp", "msr",
         "umass", "alibaba", "tencent", "csv")

# The formats that `replay export` writes (their modules define `write`), in its order.
WRITERS = ("fio", "blktrace", "csv", "oraclegeneral")

# The registry, the format modules and what they share.
__all__ = ["NAMES", "WRITERS", "get", "sniff", "inputs", "ordering", "reading", *NAMES]


def get(name: str):
    """The module of format `name`; a clear error for an unknown one."""
    if name not in NAMES:
        raise TraceFormatError(name, f"unknown trace format; use one of {', '.join(NAMES)}")
    return importlib.import_module(f"traces.formats.{name}")


def sniff(path) -> str:
    """The name of the first format that recognises `path`."""
    head = read_head(Path(path))
    for name in NAMES:
        if get(name).sniff(Path(path), head):
            return name
    raise TraceFormatError(
        path, f"cannot tell the trace format; name it with --format ({', '.join(NAMES)})"
    )
