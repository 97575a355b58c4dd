"""Analysis speed and memory on a 100-million-row results file (quick: 10M): time_series,
fidelity and the run summary, each streamed over the row groups in a fresh process, then all
three from one read of the file (analysis.analyse), the figure the goal is about.

The results file is synthetic but shaped like a real replay: ~100k IOPS open-loop with bursty
exponential gaps, 70/30 reads/writes of 4-64 KiB, lateness of a few us, lognormal device
latency around 100 us, a captured latency_ns column, written with TraceWriter a row group at a
time in a temp directory that is removed afterwards. "rows/s" is rows / wall time of the
analysis process, "CPU s" its user + system time (on a shared machine compare CPU seconds: wall
time depends on the other load); "peak RSS" its ru_maxrss (the imports alone are ~130 MB).
Goal: all three under 30 s and under 1 GB on this machine.
"""
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _harness import machine, parser, table, write_json

HERE = Path(__file__).resolve().parent
STEP = 1 << 20
ANALYSES = ("time_series", "fidelity", "summary", "one_pass")


def make_results(path, n, seed=1):
    import pyarrow as pa

    from traces.schema import OPTIONAL_COLUMNS, RESULT_ARROW_FIELDS, TRACE_COLUMNS, Op
    from traces.trace import TraceWriter

    cols = [(k, pa.from_numpy_dtype(v)) for k, v in TRACE_COLUMNS.items()]
    cols += [("latency_ns", OPTIONAL_COLUMNS["latency_ns"])] + RESULT_ARROW_FIELDS
    meta = {"name": "analysis-bench", "kind": "results", "interrupted": False,
            "trace": {"path": "synthetic", "rows": n, "metadata": {}},
            "target": {"path": "synthetic", "kind": "file"},
            "run": {"engine": "synthetic", "mode": "original", "speed": 1.0, "qd": 32, "workers": 1}}
    rng = np.random.default_rng(seed)
    t = 0
    with TraceWriter(path, cols, meta, compression="lz4") as w:
        for start in range(0, n, STEP):
            k = min(STEP, n - start)
            gaps = rng.exponential(10_000, k) * rng.choice([0.2, 1.8], k)  # bursty, mean 10 us
            ts = t + np.cumsum(gaps).astype(np.int64)
            t = int(ts[-1])
            op = np.where(rng.random(k) < 0.7, Op.READ, Op.WRITE).astype(np.uint8)
            length = (4096 << rng.integers(0, 5, k)).astype(np.int64)
            issue = ts + rng.exponential(3_000, k).astype(np.int64)
            device = rng.lognormal(np.log(100_000), 0.6, k).astype(np.int64)
            w.write({"ts_ns": ts, "op": op, "offset": rng.integers(0, 1 << 26, k) * 4096,
                     "length": length, "latency_ns": rng.lognormal(np.log(90_000), 0.6, k).astype(np.int64),
                     "intended_ns": ts, "issue_ns": issue, "complete_ns": issue + device,
                     "result": length})
    return path


def _measure(argv):
    """Subprocess side: one analysis over the file, one JSON line of figures."""
    what, path = argv
    from analysis.results import load

    r = load(path)
    start = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = start.ru_utime + start.ru_stime
    t0 = time.perf_counter()
    if what == "time_series":
        from analysis.timeseries import time_series

        out = time_series(r.chunks(["op", "length", "intended_ns", "issue_ns", "complete_ns", "result"],
                                   rows=1 << 20))
        check = int(out.counts["all"].sum())
    elif what == "fidelity":
        from analysis.fidelity import fidelity

        check = fidelity(r).issued
    elif what == "summary":
        check = r.summary.total().ios
    else:
        from analysis.analyse import analyse

        a = analyse(r)
        check = a.summary.total().ios
        assert a.fidelity.issued == check == int(a.series.counts["all"].sum())
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - cpu0
    print(json.dumps({"what": what, "wall_s": wall, "cpu_s": cpu, "rows": r.rows, "check": check,
                      "peak_rss": usage.ru_maxrss * 1024}))


def main():
    p = parser(__doc__)
    p.add_argument("--rows", type=int, help="rows in the results file (default 100M, quick 10M)")
    p.add_argument("--dir", help="directory for the results file (default: system temp)")
    p.add_argument("--what", nargs="+", choices=ANALYSES, default=list(ANALYSES),
                   help="analyses to measure (default: all, each alone, then one pass)")
    args = p.parse_args()
    n = args.rows or (10_000_000 if args.quick else 100_000_000)
    tmp = Path(tempfile.mkdtemp(prefix="tracereplay-analysis-", dir=args.dir))
    try:
        path = tmp / "results.parquet"
        t0 = time.perf_counter()
        make_results(path, n)
        print(f"wrote {n:,} rows ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s")
        rows, figures = [], []
        for what in args.what:
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "measure", what, str(path)],
                                  capture_output=True, text=True, check=True, cwd=HERE.parent)
            f = json.loads(done.stdout.strip().splitlines()[-1])
            assert f["check"] == n, f
            figures.append(f)
            rows.append([what, f"{f['wall_s']:.1f}", f"{f['cpu_s']:.1f}", f"{n / f['wall_s'] / 1e6:.2f}M",
                         f"{f['peak_rss'] / 1e6:.0f} MB"])
        alone = [f for f in figures if f["what"] != "one_pass"]
        if len(alone) == 3:
            total = sum(f["wall_s"] for f in alone)
            cpu = sum(f["cpu_s"] for f in alone)
            rows.insert(3, ["the three alone", f"{total:.1f}", f"{cpu:.1f}", f"{n / total / 1e6:.2f}M",
                            f"{max(f['peak_rss'] for f in alone) / 1e6:.0f} MB"])
        print(table(["analysis", "wall s", "CPU s", "rows/s", "peak RSS"], rows))
        write_json(args.json, {"machine": machine(), "rows": n, "figures": figures})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        sys.path.insert(0, str(HERE.parent))
        _measure(sys.argv[2:])
    else:
        main()
