"""Peak memory of a long replay: a 100-million-I/O trace (quick: 10M) replayed AFAP with the
null engine, the trace streamed from Parquet and the results streamed to Parquet.

How to read it: "peak RSS" is the replay process's ru_maxrss (a fresh Python process);
"after imports" is its RSS before replay() starts (numpy, pyarrow, numba), so the difference is
what the run itself holds. Goal: peak < 300 MB whatever the trace length, i.e. memory bounded
by a few chunks. fio's iolog replay holds ~100 B per I/O in memory (measured when the project
began: 2M entries = 226 MB RSS), shown for comparison as rows x 100 B.
"""
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from _harness import machine, parser, run_ours, table, write_json


def make_trace(path, n):
    """Sequential 4 KiB reads 1 us apart, written a row group at a time (compresses well)."""
    import pyarrow as pa
    from traces.schema import TRACE_COLUMNS, Op
    from traces.trace import TraceWriter

    cols = [(k, pa.from_numpy_dtype(v)) for k, v in TRACE_COLUMNS.items()]
    step = 1 << 20
    op = np.full(step, Op.READ, np.uint8)
    length = np.full(step, 4096, np.int64)
    with TraceWriter(path, cols, {"name": "memory"}) as w:
        for start in range(0, n, step):
            i = np.arange(start, min(n, start + step), dtype=np.int64)
            w.write({"ts_ns": i * 1000, "op": op[: len(i)], "offset": i * 4096, "length": length[: len(i)]})
    return path


def main():
    p = parser(__doc__)
    p.add_argument("--rows", type=int)
    p.add_argument("--dir", help="directory for the trace and results (default: system temp)")
    a = p.parse_args()
    n = a.rows or (10_000_000 if a.quick else 100_000_000)
    with tempfile.TemporaryDirectory(prefix="tracereplay-bench-", dir=a.dir) as tmp:
        t0 = time.perf_counter()
        trace = make_trace(Path(tmp, "memory.parquet"), n)
        gen_s = time.perf_counter() - t0
        trace_mb = trace.stat().st_size / 1e6
        print(f"  trace of {n:,} rows written in {gen_s:.1f} s ({trace_mb:.0f} MB)", flush=True)
        out = Path(tmp, "out.parquet")
        r = run_ours(trace, None, out, engine="null", afap=True, qd=32, keep_output=True)
        results_mb = out.stat().st_size / 1e6
        out.unlink()
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    peak_mb = r["maxrss_kib"] * 1024 / 1e6
    base_mb = r["maxrss_before_kib"] * 1024 / 1e6
    row = {"rows": n, "peak_rss_mb": peak_mb, "rss_after_imports_mb": base_mb,
           "run_growth_mb": peak_mb - base_mb, "bytes_per_io": r["maxrss_kib"] * 1024 / n,
           "children_maxrss_mb": children * 1024 / 1e6, "fio_estimate_mb": n * 100 / 1e6,
           "wall_s": r["wall_s"], "trace_mb": trace_mb, "results_mb": results_mb, "gen_s": gen_s}
    headers = ["rows", "peak RSS MB", "after imports MB", "run growth MB", "B/IO", "goal <300MB",
               "fio ~100 B/IO MB", "replay wall s", "trace MB", "results MB"]
    print()
    print("null engine, AFAP QD32, trace and results streamed")
    print(table(headers, [[n, peak_mb, base_mb, peak_mb - base_mb, row["bytes_per_io"],
                           "ok" if peak_mb < 300 else "MISS", row["fio_estimate_mb"], r["wall_s"],
                           trace_mb, results_mb]]))
    write_json(a.json, {"machine": machine(), "rows": [row], "run": r})


if __name__ == "__main__":
    main()
