"""The trace and results schema: column names, dtypes, units, operation codes and metadata keys.

Every other module imports these names; nothing else spells a column name or an op code.
Units live in names: `_ns` is nanoseconds, `offset` and `length` are bytes.
"""
import enum

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = 1

# All of tracereplay's metadata is one JSON object under this Parquet key-value key.
METADATA_KEY = b"tracereplay"


class Op(enum.IntEnum):
    """Operation codes, in fio's order; the Rust engine uses the same numbers."""

    READ = 0
    WRITE = 1
    DISCARD = 2
    FLUSH = 3


class Flag(enum.IntFlag):
    """Bits of the optional `flags` column."""

    SYNC = 1
    FUA = 2
    META = 4
    READAHEAD = 8


# Required trace columns and their dtypes. `length` may also be uint32 on input.
TRACE_COLUMNS = {
    "ts_ns": np.dtype(np.int64),  # issue time since trace start, non-decreasing
    "op": np.dtype(np.uint8),  # an Op
    "offset": np.dtype(np.int64),  # bytes from the start of the device
    "length": np.dtype(np.int64),  # bytes; 0 only for flushes
}
# The most bytes Linux moves in one read or write (MAX_RW_COUNT: 2 GiB - 4 KiB); the engine's
# buffers stop there too (engine/src/data.rs MAX_DATA_LENGTH).
MAX_IO_BYTES = 0x7FFF_F000
LENGTH_DTYPES = (np.dtype(np.int64), np.dtype(np.uint32))

# Optional trace columns.
OPTIONAL_COLUMNS = {
    "latency_ns": pa.int64(),  # completion - issue as captured
    "pid": pa.int32(),
    "comm": pa.string(),
    "flags": pa.uint8(),  # Flag bits
    "device": pa.uint32(),  # device number within a multi-device trace
}

# Columns the replayer adds, all on one monotonic clock relative to the run's start.
RESULT_COLUMNS = {
    "intended_ns": np.dtype(np.int64),  # when the I/O was due
    "issue_ns": np.dtype(np.int64),  # when it entered the kernel (docs/results.md)
    "complete_ns": np.dtype(np.int64),  # when its completion was seen
    "result": np.dtype(np.int64),  # bytes transferred, or -errno
}

TRACE_ARROW_SCHEMA = pa.schema(
    [
        ("ts_ns", pa.int64()),
        ("op", pa.uint8()),
        ("offset", pa.int64()),
        ("length", pa.int64()),
    ]
)
RESULT_ARROW_FIELDS = [(name, pa.int64()) for name in RESULT_COLUMNS]
