"""`replay bench steady` at growing durations: peak RSS on the null engine (goal: flat, not
growing with the run's length; an hour at QD32 must fit in a few chunks), and the bytes per
I/O of a results file on a loop device (what an hour of per-I/O results costs on disk).

How to read it: each row is one `replay bench steady` in a fresh process; "peak RSS" is its
ru_maxrss. "B/row" is the steady run's Parquet file size / its rows. The null engine's results
compress far better (identical latencies) than a real device's, so the loop-device row is
the one to price an hour: rows x B/row. "groups" and "footer KB" are the results file's row
groups and its serialised footer, the metadata the Parquet writer holds in memory until it
closes the file: what grows with the run's length. The footer's growth per row group is the
slope between the shortest and the longest null-engine run; what the writer holds in memory
for it is larger, and is measured alone: the RSS growth of a Parquet writer over 18,000 row
groups of the results columns.
"""
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
from _harness import machine, parser, table, write_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

REPO = Path(__file__).resolve().parents[1]


def bench_steady(out, *args):
    """One `replay bench steady ... -o out` in a fresh process: (results.json, peak RSS MB, s)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from replay.cli import main; main()", "bench", "steady", *args,
         "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.monotonic() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"replay bench failed: {proc.stderr.read().decode()}")
    proc.stderr.close()
    return json.loads((out / "results.json").read_text()), usage.ru_maxrss / 1024, elapsed


def row_of(label, duration, out, results, rss, elapsed):
    run = next(r for r in results["runs"] if r["name"] == "steady")
    rows = run["summary"]["total_ios"]
    size = (out / run["file"]).stat().st_size
    footer = pq.ParquetFile(out / run["file"]).metadata
    return [label, duration, round(elapsed, 1), rows, round(run["summary"]["iops"]),
            round(size / max(rows, 1), 2), round(rss), footer.num_row_groups,
            round(footer.serialized_size / 1e3, 1)]


def footer_memory(first=2_000, last=20_000, rows=256) -> tuple[float, float]:
    """What the Parquet writer holds per row group until close, in bytes: the growth of this
    process's RSS from `first` to `last` tiny row groups of the results columns, and the
    serialised footer per group once closed."""
    import numpy as np
    import pyarrow as pa

    from traces.schema import RESULT_COLUMNS, TRACE_COLUMNS

    def rss():
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    table = pa.table({n: np.arange(rows).astype(d) for n, d in {**TRACE_COLUMNS, **RESULT_COLUMNS}.items()})
    with tempfile.TemporaryDirectory(prefix="tracereplay-bench-footer-") as tmp:
        path = Path(tmp) / "groups.parquet"
        writer = pq.ParquetWriter(path, table.schema, compression="zstd")
        for i in range(1, last + 1):
            writer.write_table(table)
            if i == first:
                at_first = rss()
        held = (rss() - at_first) / (last - first)
        writer.close()
        return held, pq.ParquetFile(path).metadata.serialized_size / last


def main():
    p = parser(__doc__)
    args = p.parse_args()
    durations = (5, 15) if args.quick else (10, 30, 60)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tracereplay-bench-suite-", dir="/var/tmp") as tmp:
        for d in durations:
            out = Path(tmp) / f"null-{d}"
            results, rss, elapsed = bench_steady(out, "--engine", "null", "--span", "8G",
                                                 "--duration", str(d))
            rows.append(row_of("null engine", d, out, results, rss, elapsed))
            for f in out.iterdir():  # keep the temp disk small between runs
                f.unlink()
        if os.geteuid() == 0:
            import targets

            d = 5 if args.quick else 20
            with targets.loop_device(size=1 << 30, span=1 << 30) as dev:
                out = Path(tmp) / "loop"
                results, rss, elapsed = bench_steady(out, dev, "--span", "256M", "--duration", str(d))
                rows.append(row_of("loop device", d, out, results, rss, elapsed))
    headers = ["target", "duration s", "wall s", "rows", "IOPS", "B/row", "peak RSS MB", "groups", "footer KB"]
    print(table(headers, rows))
    null = [r for r in rows if r[0] == "null engine"]
    growth = None
    if null[-1][7] > null[0][7]:
        growth = (null[-1][8] - null[0][8]) / (null[-1][7] - null[0][7])
        print(f"footer growth: {growth:.2f} KB per row group of "
              f"{(null[-1][3] - null[0][3]) / (null[-1][7] - null[0][7]):,.0f} rows")
    held, serialised = footer_memory()
    print(f"footer held in memory by the writer: {held / 1e3:.2f} KB per row group "
          f"({serialised / 1e3:.2f} KB once serialised), RSS growth over 18,000 row groups")
    write_json(args.json, {"machine": machine(), "headers": headers, "rows": rows,
                           "footer_kb_per_row_group": growth, "footer_held_kb_per_row_group": held / 1e3,
                           "footer_serialised_kb_per_row_group": serialised / 1e3})


if __name__ == "__main__":
    main()
