"""A synthetic OLTP-shaped demo trace, bundled until real captures replace it.

Run `python -m synth.demo` to regenerate `traces/demo.parquet`.
"""
import importlib.metadata

import numpy as np

from traces import schema
from traces.library import library_dir
from traces.schema import Op
from traces.trace import write_trace

PAGE = 8192  # database page: the unit of data-file I/O and of WAL writes
READ_SHARE = 0.7  # of data-file I/O
DATA_SHARE = 0.7  # of reads and writes; the rest are WAL writes
FLUSH_SHARE = 0.15  # of all I/O
# Probability that a WAL write is followed by a flush, chosen so flushes make up
# FLUSH_SHARE of all I/O: per arrival there are 1 + p_wal * q I/Os, p_wal * q of them flushes.
FLUSH_AFTER_WAL = FLUSH_SHARE / (1 - FLUSH_SHARE) / (1 - DATA_SHARE)
FLUSH_DELAY_NS = 50_000  # mean delay from a WAL write to its flush


def oltp_like(duration_s=10.0, iops=2000.0, span=1 << 30, seed=1) -> dict[str, np.ndarray]:
    """Columns of a seeded OLTP-shaped workload with Poisson arrivals at about `iops`.

    Data-file I/O: 8 KiB, 8 KiB-aligned, uniformly random over the first 90% of `span`,
    READ_SHARE reads. WAL: sequential writes of 8-64 KiB (whole pages) over the last 10%,
    wrapping round like a circular log, some followed by a flush (offset 0, length 0).
    """
    data_end = int(span * 0.9) // PAGE * PAGE
    wal_size = (span - data_end) // PAGE * PAGE
    if wal_size < 8 * PAGE:
        raise ValueError(f"span {span} is too small; give at least 1 MiB")
    rng = np.random.default_rng(seed)
    p_wal = 1 - DATA_SHARE
    arrivals_per_s = iops / (1 + p_wal * FLUSH_AFTER_WAL)
    # A Poisson process on [0, duration): a Poisson count of uniformly placed events.
    n = rng.poisson(arrivals_per_s * duration_s)
    ts = np.sort(rng.uniform(0, duration_s * 1e9, n)).astype(np.int64)
    wal = rng.random(n) < p_wal
    n_wal = int(wal.sum())

    op = np.where(rng.random(n) < READ_SHARE, Op.READ, Op.WRITE).astype(np.uint8)
    offset = rng.integers(0, data_end // PAGE, n) * PAGE
    length = np.full(n, PAGE, dtype=np.int64)

    wal_length = rng.integers(1, 9, n_wal) * PAGE
    position = (np.cumsum(wal_length) - wal_length) % wal_size
    # A write that would run past the end of the log stops there; the log wraps.
    wal_length = np.minimum(wal_length, wal_size - position)
    op[wal] = Op.WRITE
    offset[wal] = data_end + position
    length[wal] = wal_length

    flushed = rng.random(n_wal) < FLUSH_AFTER_WAL
    flush_ts = ts[wal][flushed] + rng.exponential(FLUSH_DELAY_NS, int(flushed.sum())).astype(
        np.int64
    )
    n_flush = len(flush_ts)
    ts = np.concatenate([ts, flush_ts])
    order = np.argsort(ts, kind="stable")  # stable: a flush sorts after its write
    return {
        "ts_ns": ts[order],
        "op": np.concatenate([op, np.full(n_flush, Op.FLUSH, dtype=np.uint8)])[order],
        "offset": np.concatenate([offset, np.zeros(n_flush, dtype=np.int64)])[order],
        "length": np.concatenate([length, np.zeros(n_flush, dtype=np.int64)])[order],
    }


def _tool_version() -> str:
    try:
        return importlib.metadata.version("tracereplay")
    except importlib.metadata.PackageNotFoundError:
        return "source tree"


def main() -> None:
    params = {"duration_s": 10.0, "iops": 2000.0, "span": 1 << 30, "seed": 1}
    columns = oltp_like(**params)
    metadata = {
        "schema_version": schema.SCHEMA_VERSION,
        "name": "demo",
        "description": (
            "SYNTHETIC OLTP-shaped trace made by synth.demo, not a capture: 8 KiB random "
            "data-file reads and writes (about 70/30) over the first 90% of the device, a "
            "sequential WAL of 8-64 KiB writes over the last 10%, and flushes. It stands in "
            "until the captured trace library replaces it."
        ),
        "source": {
            "kind": "synth:demo",
            "command": "python -m synth.demo",
            "tool_version": _tool_version(),
            "generator": "synth.demo.oltp_like",
            "parameters": params,
        },
        "device_size": params["span"],
        "logical_block_size": 512,
        "license": "MIT",
        "provenance": "Generated from a seeded numpy random generator; no real system traced.",
    }
    path = write_trace(library_dir() / "demo.parquet", columns, metadata)
    print(f"wrote {len(columns['ts_ns'])} I/Os to {path}")


if __name__ == "__main__":
    main()
