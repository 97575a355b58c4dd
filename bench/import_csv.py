"""MSR Cambridge CSV import speed: records/s and peak RSS of `replay import` on a generated file.

Usage: python bench/import_csv.py [--quick] [--json PATH] [--records N] [--repeat R]
(default 10 M records, 3 runs; --quick 1 M records, 1 run). The file is made once in a
temporary directory (about 52 bytes a record) and removed after.
"""
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
from _harness import machine, write_json
from _harness import parser as harness_parser

FILETIME_2007 = 128166372000000000


def make_msr(path: Path, records: int, seed=1):
    """MSR-shaped rows in 1 M-row blocks: 70/30 reads, 4-64 KiB, ~2.5 k IOPS."""
    rng = np.random.default_rng(seed)
    options = pacsv.WriteOptions(include_header=False, quoting_style="none")
    start = FILETIME_2007
    with pacsv.CSVWriter(str(path), pa.schema([("t", pa.int64()), ("h", pa.string()), ("d", pa.int64()),
                                               ("y", pa.string()), ("o", pa.int64()), ("s", pa.int64()),
                                               ("r", pa.int64())]), write_options=options) as writer:
        for first in range(0, records, 1 << 20):
            n = min(1 << 20, records - first)
            t = start + np.cumsum(rng.integers(0, 8000, n))
            start = int(t[-1])
            writer.write_batch(pa.record_batch([
                pa.array(t), pa.array(["hm"] * n), pa.array(np.zeros(n, np.int64)),
                pa.array(np.where(rng.random(n) < 0.7, "Read", "Write")),
                pa.array(rng.integers(0, 1 << 24, n) * 4096), pa.array(rng.choice([4096, 8192, 65536], n)),
                pa.array(rng.integers(100, 200000, n))], names=list("thdyosr")))


def main():
    parser = harness_parser(__doc__)
    parser.add_argument("--records", type=int, help="records in the file (default 10 M, quick 1 M)")
    parser.add_argument("--repeat", type=int, help="imports of it, each its own process (default 3, quick 1)")
    args = parser.parse_args()
    args.records = args.records or (1_000_000 if args.quick else 10_000_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        src, out = Path(tmp) / "hm_0.csv", Path(tmp) / "hm_0.parquet"
        began = time.monotonic()
        make_msr(src, args.records)
        print(f"generated {args.records:,} MSR records, {src.stat().st_size / 2**20:,.0f} MiB, "
              f"in {time.monotonic() - began:.1f} s")
        for run in range(args.repeat):
            # One child per run: ru_maxrss of RUSAGE_CHILDREN is the peak over all children,
            # so each run is measured by the child that reports its own peak.
            code = ("import resource, time, sys; from traces.convert import import_trace; t = time.monotonic(); "
                    f"rows = import_trace([{str(src)!r}], {str(out)!r}, 'msr')[1]; "
                    "print(rows, time.monotonic() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
            done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  cwd=Path(__file__).resolve().parents[1],
                                  env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
            if done.returncode:
                sys.exit(done.stderr)
            rows, seconds, rss_kib = done.stdout.split()
            rows, seconds = int(rows), float(seconds)
            runs.append({"records": rows, "seconds": seconds, "records_per_s": rows / seconds,
                         "peak_rss_mib": int(rss_kib) / 1024, "output_mib": out.stat().st_size / 2**20})
            print(f"run {run + 1}: {rows:,} records in {seconds:.2f} s = {rows / seconds / 1e6:.2f} M records/s, "
                  f"peak RSS {int(rss_kib) / 1024:.0f} MiB, output {out.stat().st_size / 2**20:.0f} MiB")
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"CPU over all runs: {cpu.ru_utime + cpu.ru_stime:.1f} s on {os.cpu_count()} cores; "
              f"load average now {os.getloadavg()[0]:.2f} (other work on the machine skews the figures)")
    write_json(args.json, {"machine": machine(), "records": args.records, "runs": runs,
                           "cpu_s": cpu.ru_utime + cpu.ru_stime, "load_average": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
