"""Import speed of the binary formats libCacheSim reads (vscsi1, vscsi2, oracleGeneral):
records/s and peak RSS of `import_trace` on generated files, each import its own process.

Usage: python bench/import_binary.py [--quick] [--json PATH] [--records N] [--repeat R]
(default 10 M records, 3 runs per format; --quick 1 M records, 1 run). The files are made
once in a temporary directory (32, 40 and 24 bytes a record) and removed after.
"""
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _harness import machine, timed_import, write_json
from _harness import parser as harness_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from traces.formats import oraclegeneral, vscsi  # noqa: E402


def make(fmt: str, path: Path, records: int, seed=1):
    """`records` records of 70/30 reads and writes, 4-64 KiB, ~2.5 k IOPS, in 1 M-record blocks."""
    rng = np.random.default_rng(seed)
    layout = {"vscsi1": vscsi.V1, "vscsi2": vscsi.V2, "oraclegeneral": oraclegeneral.RECORD}[fmt]
    start = 5_633_898_368_802  # us, a real CloudPhysics trace's first time
    with open(path, "wb") as f:
        for first in range(0, records, 1 << 20):
            n = min(1 << 20, records - first)
            out = np.zeros(n, layout)
            t = start + np.cumsum(rng.integers(0, 800, n))
            start = int(t[-1])
            if fmt == "oraclegeneral":
                out["time"] = (t - 5_633_898_368_802) // 10**6
                out["obj_id"] = rng.integers(0, 1 << 24, n) * 8
                out["size"] = rng.choice([4096, 8192, 65536], n)
                out["next"] = -1
            else:
                out["ver"] = 0x100 if fmt == "vscsi1" else 0x200
                out["cmd"] = np.where(rng.random(n) < 0.7, 0x28, 0x2A)
                out["len"] = rng.choice([4096, 8192, 65536], n)
                out["lbn"] = rng.integers(0, 1 << 24, n) * 8
                out["ts"] = t
                if fmt == "vscsi2":
                    out["rt"] = rng.integers(50, 5000, n)
            f.write(out.tobytes())


def main():
    parser = harness_parser(__doc__)
    parser.add_argument("--records", type=int, help="records in each file (default 10 M, quick 1 M)")
    parser.add_argument("--repeat", type=int, help="imports of each, each its own process (default 3, quick 1)")
    args = parser.parse_args()
    args.records = args.records or (1_000_000 if args.quick else 10_000_000)
    args.repeat = args.repeat or (1 if args.quick else 3)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-import-binary-") as tmp:
        for fmt, name in (("vscsi1", "vscsi"), ("vscsi2", "vscsi"), ("oraclegeneral", "oraclegeneral")):
            src, out = Path(tmp) / f"t.{fmt}", Path(tmp) / "t.parquet"
            make(fmt, src, args.records)
            runs = []
            for run in range(args.repeat):
                runs.append(timed_import(src, out, name))
                rows, seconds, peak = (runs[-1][k] for k in ("records", "seconds", "peak_rss_mib"))
                print(f"{fmt} run {run + 1}: {rows:,} records in {seconds:.2f} s = "
                      f"{rows / seconds / 1e6:.2f} M records/s, peak RSS {peak:.0f} MiB")
            src.unlink()
            results[fmt] = runs
        cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"CPU over all runs: {cpu.ru_utime + cpu.ru_stime:.1f} s on {os.cpu_count()} cores; "
              f"load average now {os.getloadavg()[0]:.2f} (other work on the machine skews the figures)")
    write_json(args.json, {"machine": machine(), "records": args.records, "formats": results,
                           "load_average": os.getloadavg()[0]})


if __name__ == "__main__":
    main()
