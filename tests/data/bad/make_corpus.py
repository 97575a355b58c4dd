"""Writes the malformed traces and results of this directory (trace-*.parquet,
results-*.parquet), each a few rows, with pyarrow directly so that nothing of ours checks
them on the way out. The option sets (options-*.args) are hand-written text.

Run from the repository root: python tests/data/bad/make_corpus.py
"""
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ROWS = 4
GOOD = {
    "ts_ns": pa.array([0, 1000, 2000, 3000], pa.int64()),
    "op": pa.array([0, 1, 0, 1], pa.uint8()),
    "offset": pa.array([0, 4096, 8192, 12288], pa.int64()),
    "length": pa.array([4096] * ROWS, pa.int64()),
}
RESULTS = {name: pa.array([10, 20, 30, 40], pa.int64()) for name in ("intended_ns", "issue_ns")}
RESULTS["complete_ns"] = pa.array([15, 25, 35, 45], pa.int64())
RESULTS["result"] = pa.array([4096] * ROWS, pa.int64())


def write(name, columns, metadata=None, rows=None):
    table = pa.table(columns)
    if rows is not None:
        table = table.slice(0, rows)
    meta = {"schema_version": 1, "name": name, **(metadata or {})}
    table = table.replace_schema_metadata({b"tracereplay": json.dumps(meta).encode()})
    path = HERE / f"{name}.parquet"
    pq.write_table(table, path, compression="none", store_schema=False)
    return path


def with_(name, values, type_=pa.int64()):
    return {**GOOD, name: pa.array(values, type_)}


def main():
    write("trace-wrong-dtype", {**GOOD, "ts_ns": pa.array([0.0, 1.0, 2.0, 3.0], pa.float64())})
    write("trace-negative-ts", with_("ts_ns", [-5, 0, 1, 2]))
    write("trace-unsorted-ts", with_("ts_ns", [0, 3000, 1000, 4000]))
    write("trace-negative-offset", with_("offset", [0, -4096, 0, 0]))
    write("trace-negative-length", with_("length", [4096, -4096, 4096, 4096]))
    write("trace-unknown-op", with_("op", [0, 9, 0, 1], pa.uint8()))
    write("trace-missing-column", {k: v for k, v in GOOD.items() if k != "length"})
    write("trace-empty", GOOD, rows=0)
    # Seconds since 1970 as nanoseconds: the first I/O is due 55 years after the start.
    write("trace-absolute-times", with_("ts_ns", [1_735_000_000_000_000_000 + i for i in range(ROWS)]))
    (HERE / "trace-not-parquet.parquet").write_text("ts_ns,op,offset,length\n0,0,0,4096\n")
    good = write("trace-truncated", GOOD).read_bytes()
    (HERE / "trace-truncated.parquet").write_bytes(good[: len(good) // 2])

    run = {"kind": "results", "trace": {"path": "x.parquet", "rows": ROWS}, "target": {"path": "/dev/x"},
           "run": {"mode": "original", "speed": 1.0, "engine": "null"}, "interrupted": False}
    write("results-empty", {**GOOD, **RESULTS}, run, rows=0)
    write("results-interrupted-empty", {**GOOD, **RESULTS}, {**run, "interrupted": True}, rows=0)
    write("results-a-trace", GOOD)
    write("results-no-result-column", {**GOOD, **{k: v for k, v in RESULTS.items() if k != "result"}}, run)
    (HERE / "results-not-parquet.parquet").write_text("not a results file\n")
    good = write("results-truncated", {**GOOD, **RESULTS}, run).read_bytes()
    (HERE / "results-truncated.parquet").write_bytes(good[: len(good) // 2])


if __name__ == "__main__":
    main()
