"""The null engine's own rate: how many trace rows per CPU second the whole replay pipeline
costs when the "device" completes every I/O at once. 10M rows (quick 1M), AFAP at QD1 and
QD32, and at original timing with speed 1000 (a 1M IOPS trace asked to run at 1G IOPS, so
every row is always due: the pacing path, saturated). fio's null engine, alternating, is the
reference for a tool that does no per-I/O logging.

How to read it: "eng rows/CPU-s" is rows per CPU second of our engine thread alone (pacing,
queueing, reaping, recording four timestamps per row): the ceiling one core gives the engine.
"proc rows/CPU-s" counts every thread of the replay() call (Parquet read, results file,
summary), and "wall rows/s" is what a user sees. fio's figures are per CPU second of its job
thread and of its whole process tree; it writes no per-I/O results. The two ratios are ours
over fio's: the engine thread's rows per CPU second over fio's job's, and our wall rows/s (the
whole replay() call, the trace's scan and the results file's close included) over fio's IOPS
(its job's runtime only).
"""
import statistics
import tempfile
from pathlib import Path

import numpy as np

from _harness import machine, parser, run_fio, run_ours, table, write_json


def make_trace(path, n):
    from traces.schema import Op
    from traces import schema
    from traces.trace import TraceWriter

    import pyarrow as pa
    cols = [(k, pa.from_numpy_dtype(v)) for k, v in schema.TRACE_COLUMNS.items()]
    with TraceWriter(path, cols, {"name": "null-overhead"}) as w:
        step = 1 << 20
        for start in range(0, n, step):
            i = np.arange(start, min(n, start + step), dtype=np.int64)
            w.write({"ts_ns": i * 1000, "op": np.full(len(i), Op.READ, np.uint8),
                     "offset": (i % (1 << 18)) * 4096, "length": np.full(len(i), 4096, np.int64)})
    return path


def main():
    p = parser(__doc__)
    p.add_argument("--rows", type=int)
    p.add_argument("--reps", type=int)
    a = p.parse_args()
    n = a.rows or (1_000_000 if a.quick else 10_000_000)
    reps = a.reps or (1 if a.quick else 2)
    modes = [("afap QD1", dict(afap=True, qd=1), 1), ("afap QD32", dict(afap=True, qd=32), 32),
             ("original x1000", dict(afap=False, speed=1000.0), 1024)]
    results = []
    with tempfile.TemporaryDirectory(prefix="tracereplay-bench-") as tmp:
        trace = make_trace(Path(tmp, "null.parquet"), n)
        for name, opts, depth in modes:
            runs = []
            for rep in range(reps):
                o = run_ours(trace, None, Path(tmp, "out.parquet"), engine="null", **opts)
                f = run_fio(["--name=null", "--ioengine=null", "--rw=randread", "--bs=4k",
                             f"--iodepth={depth}", "--size=1g", f"--io_size={n * 4096}",
                             "--norandommap", "--randrepeat=0"])
                runs.append((o, f))
            med = statistics.median
            row = {
                "mode": name, "rows": n,
                "eng_rows_per_cpu_s": med(o["ios"] / o["engine_cpu_s"] for o, _ in runs),
                "proc_rows_per_cpu_s": med(o["ios"] / o["process_cpu_s"] for o, _ in runs),
                "wall_rows_per_s": med(o["ios"] / o["wall_s"] for o, _ in runs),
                "engine_rows_per_s": med(o["iops"] for o, _ in runs),
                "fio_job_ios_per_cpu_s": med(f["ios"] / f["job_cpu_s"] for _, f in runs),
                "fio_proc_ios_per_cpu_s": med(f["ios"] / f["child_cpu_s"] for _, f in runs),
                "fio_iops": med(f["iops"] for _, f in runs),
                "runs": runs,
            }
            results.append(row)
            print(f"  {name}: engine {row['eng_rows_per_cpu_s']:,.0f} rows/CPU-s", flush=True)

    headers = ["mode", "rows", "eng rows/CPU-s", "proc rows/CPU-s", "wall rows/s", "engine window rows/s",
               "fio job IO/CPU-s", "fio proc IO/CPU-s", "fio IOPS", "eng/fio job", "wall/fio IOPS"]
    rows = [[r["mode"], r["rows"], r["eng_rows_per_cpu_s"], r["proc_rows_per_cpu_s"], r["wall_rows_per_s"],
             r["engine_rows_per_s"], r["fio_job_ios_per_cpu_s"], r["fio_proc_ios_per_cpu_s"], r["fio_iops"],
             r["eng_rows_per_cpu_s"] / r["fio_job_ios_per_cpu_s"],
             r["wall_rows_per_s"] / r["fio_iops"]] for r in results]
    print()
    print(f"null engine, {n:,} rows, medians of {reps} alternating repetitions")
    print(table(headers, rows))
    write_json(a.json, {"machine": machine(), "rows": results})


if __name__ == "__main__":
    main()
