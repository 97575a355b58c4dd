"""Parallel library work: records per second of `replay import FILE... -o DIR` and of
characterisation (`replay traces catalog`) against the number of workers, up to the cores
here (or as Ray tasks with --cluster), and what the Alibaba 2020 set would take on a
100-node cluster, on paper, from the measured rate per core.

Usage: python bench/library_parallel.py [--quick] [--json PATH] [--files N] [--records N]
       [--cluster HOST:PORT]
(default 8 files of 1 M MSR records; --quick 4 files of 200 k). Files are made once in a
temporary directory and removed after.
"""
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import machine, table, write_json  # noqa: E402
from _harness import parser as harness_parser  # noqa: E402
from import_csv import make_msr  # noqa: E402

from analysis.catalog import describe_file, import_file  # noqa: E402
from replay.cluster import default_jobs, run_each  # noqa: E402

# Alibaba's 2020 block traces: 751 GB of CSV lines like "419,W,8792928256,4096,1577808000000099"
# (about 38 bytes each): some 20 billion records.
ALIBABA_RECORDS = 751e9 / 38


def timed(fn, items, cluster, jobs) -> float:
    began = time.monotonic()
    failed = [d for d in run_each(fn, items, cluster, jobs) if d.error]
    if failed:
        raise SystemExit(f"{failed[0].item}: {failed[0].error}")
    return time.monotonic() - began


def main():
    parser = harness_parser(__doc__)
    parser.add_argument("--files", type=int, help="input files (default 8, quick 4)")
    parser.add_argument("--records", type=int, help="records per file (default 1 M, quick 200 k)")
    parser.add_argument("--cluster", help="also run as Ray tasks on the cluster at HOST:PORT")
    args = parser.parse_args()
    files = args.files or (4 if args.quick else 8)
    records = args.records or (200_000 if args.quick else 1_000_000)
    rows, runs = [], []
    with tempfile.TemporaryDirectory(prefix="bench-library-") as tmp:
        tmp = Path(tmp)
        inputs = []
        for i in range(files):
            inputs.append(tmp / f"vol{i}.csv")
            make_msr(inputs[-1], records, seed=i + 1)
        total = files * records
        setups = [(None, j) for j in range(1, default_jobs() + 1)]
        if args.cluster:
            setups.append((args.cluster, None))
        for cluster, jobs in setups:
            out = tmp / f"out-{jobs or 'ray'}"
            out.mkdir()
            work = [{"input": str(p), "output": str(out / f"{p.stem}.parquet"), "format": "msr"}
                    for p in inputs]
            t_import = timed(import_file, work, cluster, jobs)
            t_char = timed(describe_file, [w["output"] for w in work], cluster, jobs)
            label = "ray" if cluster else f"{jobs} local"
            runs.append({"workers": label, "import_s": t_import, "characterise_s": t_char,
                         "import_rps": total / t_import, "characterise_rps": total / t_char})
    base = runs[0]
    for r in runs:
        rows.append([r["workers"], f"{r['import_rps']:,.0f}", f"{r['import_rps'] / base['import_rps']:.2f}x",
                     f"{r['characterise_rps']:,.0f}", f"{r['characterise_rps'] / base['characterise_rps']:.2f}x"])
    print(f"{files} files x {records:,} MSR records (import includes characterising each new trace "
          "for the catalog)")
    print(table(["workers", "import rec/s", "vs 1", "characterise rec/s", "vs 1"], rows))
    per_core = base["import_rps"]
    print(f"\nOn paper: the Alibaba 2020 set, ~{ALIBABA_RECORDS / 1e9:.0f} billion records, imported "
          f"and cataloged at {per_core:,.0f} records/s per worker (1 local worker, measured here; an import also overlaps parsing and writing on a second thread)")
    for cores in (2, 16):
        seconds = ALIBABA_RECORDS / (100 * cores * per_core)
        print(f"  100 nodes x {cores:>2} cores: {seconds / 60:,.1f} min, if every core keeps that rate "
              f"and the shared filesystem delivers {100 * cores * per_core * 38 / 1e9:.1f} GB/s")
    write_json(args.json, {"machine": machine(), "files": files, "records": records, "runs": runs})


if __name__ == "__main__":
    main()
