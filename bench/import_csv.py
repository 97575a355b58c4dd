"""CSV import speed: records/s and peak RSS of `replay import` on a generated file.

Usage: python bench/import_csv.py [--quick] [--json PATH] [--records N] [--repeat R]
[--format msr|netapp] (default 10 M records, 3 runs, MSR; --quick 1 M records, 1 run). The
file is made once in a temporary directory (MSR about 52 bytes a record, NetApp in hfplayer's
16 columns about 80) and removed after.
"""
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from _harness import machine, timed_import, write_json
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


DECIMALS = ("ELAPSED_USECS", "LATENCY_USECS")
NETAPP_HEADER = ("#DUMP_OFFSET.I,ELAPSED_USECS.D,ELAPSED_TICKS.I,CMD.S,INFLIGHT_IOS.I,TS.I,SEQID.I,"
                 "LUN_SSID.I,OP.I,PHASE.I,LBA.I,NBLKS.I,LATENCY_TICKS.I,HOST_ID.I,HOST_LUN.I,LATENCY_USECS.D")


def _decimal(ns):
    """Nanoseconds as decimal microseconds with three decimals ("1234.567"), in Arrow."""
    whole = pc.cast(pa.array(ns // 1000), pa.string())
    frac = pc.utf8_lpad(pc.cast(pa.array(ns % 1000), pa.string()), 3, "0")
    return pc.binary_join_element_wise(whole, frac, ".")


def make_netapp(path: Path, records: int, seed=1):
    """Rows in hfplayer's sample layout, in 1 M-row blocks: 70/30 reads, 4-64 KiB, ~2.5 k IOPS,
    times and latencies in decimal microseconds with three decimals."""
    rng = np.random.default_rng(seed)
    names = [n.split(".")[0] for n in NETAPP_HEADER[1:].split(",")]
    options = pacsv.WriteOptions(include_header=False, quoting_style="none")
    path.write_text(NETAPP_HEADER + "\n")
    start = 0
    schema = pa.schema([(n, pa.string() if n in ("CMD", *DECIMALS) else pa.int64()) for n in names])
    with open(path, "ab") as f, pacsv.CSVWriter(f, schema, write_options=options) as writer:
        for first in range(0, records, 1 << 20):
            n = min(1 << 20, records - first)
            ns = start + np.cumsum(rng.integers(0, 800_000, n))
            start = int(ns[-1])
            op = (rng.random(n) >= 0.7).astype(np.int64)
            ticks = ns // 100
            columns = {"DUMP_OFFSET": 4096 + 28 * np.arange(first, first + n), "ELAPSED_USECS": _decimal(ns),
                       "ELAPSED_TICKS": ticks, "CMD": pa.array(np.where(op == 1, "WR", "RD")),
                       "INFLIGHT_IOS": rng.integers(1, 32, n), "TS": ticks,
                       "SEQID": np.arange(first, first + n), "LUN_SSID": rng.integers(0, 4, n), "OP": op,
                       "PHASE": np.zeros(n, np.int64), "LBA": rng.integers(0, 1 << 24, n) * 8,
                       "NBLKS": rng.choice([8, 16, 128], n), "LATENCY_TICKS": rng.integers(1000, 2_000_000, n),
                       "HOST_ID": np.full(n, 7), "HOST_LUN": rng.integers(0, 4, n),
                       "LATENCY_USECS": _decimal(rng.integers(100_000, 200_000_000, n))}
            writer.write_batch(pa.record_batch([pa.array(columns[n]) for n in names], names=names))


MAKERS = {"msr": (make_msr, "hm_0.csv"), "netapp": (make_netapp, "sampleTrace.csv")}


def main():
    parser = harness_parser(__doc__)
    parser.add_argument("--records", type=int, help="records in the file (default 10 M, quick 1 M)")
    parser.add_argument("--repeat", type=int, help="imports of it, each its own process (default 3, quick 1)")
    parser.add_argument("--format", choices=sorted(MAKERS), default="msr", help="the CSV format (default msr)")
    args = parser.parse_args()
    args.records = args.records or (1_000_000 if args.quick else 10_000_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-import-") as tmp:
        make, name = MAKERS[args.format]
        src, out = Path(tmp) / name, Path(tmp) / "out.parquet"
        began = time.monotonic()
        make(src, args.records)
        print(f"generated {args.records:,} {args.format} records, {src.stat().st_size / 2**20:,.0f} MiB, "
              f"in {time.monotonic() - began:.1f} s")
        for run in range(args.repeat):
            runs.append({**timed_import(src, out, args.format), "output_mib": out.stat().st_size / 2**20})
            rows, seconds, peak = (runs[-1][k] for k in ("records", "seconds", "peak_rss_mib"))
            print(f"run {run + 1}: {rows:,} records in {seconds:.2f} s = {rows / seconds / 1e6:.2f} M records/s, "
                  f"peak RSS {peak:.0f} MiB, output {out.stat().st_size / 2**20:.0f} MiB")
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"CPU over all runs: {cpu.ru_utime + cpu.ru_stime:.1f} s on {os.cpu_count()} cores; "
              f"load average now {os.getloadavg()[0]:.2f} (other work on the machine skews the figures)")
    write_json(args.json, {"machine": machine(), "format": args.format, "records": args.records, "runs": runs,
                           "cpu_s": cpu.ru_utime + cpu.ru_stime, "load_average": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
