"""Open-loop timing fidelity: Poisson-arrival traces of 4 KiB random reads (10 s at 20k IOPS,
then 50k and 100k) replayed at original timing on a direct-I/O loop device, by us and by fio's
read_iolog (the trace exported as a fio v3 iolog, timestamps in microseconds).

How to read it. Ours: issue error = issue_ns - intended_ns per I/O, from the results file
(p50, p99, p99.9, max, share within 25 us), where issue_ns is when the io_uring_enter that
submitted the I/O returned: the error includes the submission syscall (on a direct-I/O loop
device, some us). duration error = (last issue - first issue) / (last ts - first ts) - 1.
fio: duration error from its job runtime, and per-I/O issue error reconstructed from its
latency log (completion time - total latency, i.e. from before its submission; the log's
times are whole milliseconds, so fio's per-I/O figures are only good to about +-1 ms). Goals: p99 issue error
<= 25 us, duration error <= 0.1 %. A row where the device cannot keep up with the rate (the
loop device tops out near 50-65k IOPS here) measures the device, not the replayer: see the
"late share" and the IOPS columns.
"""
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

import targets
from _harness import machine, parser, run_fio, run_ours, table, write_json

BS = 4096


def poisson_trace(path, rate, seconds, span, seed):
    from traces.schema import Op
    from traces.trace import write_trace

    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    gaps = rng.exponential(1e9 / rate, n)
    gaps[0] = 0
    ts = np.cumsum(gaps).astype(np.int64)
    offset = rng.integers(0, span // BS, n, dtype=np.int64) * BS
    write_trace(path, {"ts_ns": ts, "op": np.full(n, Op.READ, np.uint8), "offset": offset,
                       "length": np.full(n, BS, np.int64)}, {"name": path.stem})
    return ts, offset


def write_iolog_v3(path, dev, ts_ns, offset):
    """fio's v3 iolog: `fio version 3 iolog`, then `<time> <file> <action> [<offset> <length>]`
    lines; fio 3.33 reads the time in microseconds (checked: a gap of 1000 waits 1 ms)."""
    us = ts_ns // 1000
    with open(path, "w") as f:
        f.write(f"fio version 3 iolog\n0 {dev} add\n0 {dev} open\n")
        f.writelines(f"{t} {dev} read {o} {BS}\n" for t, o in zip(us.tolist(), offset.tolist()))
        f.write(f"{int(us[-1])} {dev} close\n")


def pct(x, qs=(50, 99, 99.9)):
    return [float(v) for v in np.percentile(x, qs)] + [float(x.max())]


def ours_figures(res, ts):
    intended = res.column("intended_ns").to_numpy()
    issue = res.column("issue_ns").to_numpy()
    err_us = (issue - intended) / 1e3
    dur = (issue.max() - issue.min()) / (ts[-1] - ts[0])
    p50, p99, p999, mx = pct(err_us)
    complete = res.column("complete_ns").to_numpy()
    return {"p50_us": p50, "p99_us": p99, "p999_us": p999, "max_us": mx,
            "within_25us": float(np.mean(err_us <= 25)),
            "duration_error_pct": (dur - 1) * 100,
            "iops": len(issue) * 1e9 / (complete.max() - intended.min())}


def fio_figures(job, lat_log, ts):
    rows = np.loadtxt(lat_log, delimiter=",", usecols=(0, 1), dtype=np.int64, ndmin=2)
    issue_ms = np.sort(rows[:, 0] - rows[:, 1] / 1e6)  # completion ms - latency
    intended_ms = (ts - ts[0]) / 1e6
    err_ms = issue_ms - intended_ms[: len(issue_ms)]
    err_ms -= err_ms[0]  # both clocks start at the first I/O
    trace_s = (ts[-1] - ts[0]) / 1e9
    p50, p99, p999, mx = pct(err_ms * 1e3)
    return {"p50_us": p50, "p99_us": p99, "p999_us": p999, "max_us": mx,
            "within_25us": float(np.mean(err_ms <= 0.025 + 1)),  # +1 ms: log resolution
            "duration_error_pct": (job["job_runtime"] / 1e3 / trace_s - 1) * 100,
            "duration_error_log_pct": ((issue_ms[-1] - issue_ms[0]) / 1e3 / trace_s - 1) * 100,
            "iops": job["iops"], "logged": len(issue_ms)}


def main():
    p = parser(__doc__)
    p.add_argument("--rates", help="comma-separated IOPS (default 20000,50000,100000)")
    p.add_argument("--seconds", type=float, help="trace length (default 10, quick 2)")
    a = p.parse_args()
    seconds = a.seconds or (2.0 if a.quick else 10.0)
    rates = [int(r) for r in (a.rates or ("20000,50000" if a.quick else "20000,50000,100000")).split(",")]
    span = (256 << 20) if a.quick else (1 << 30)
    results = []
    with tempfile.TemporaryDirectory(prefix="tracereplay-bench-") as tmp, \
            targets.loop_device(span=span) as dev:
        for rate in rates:
            trace = Path(tmp, f"poisson-{rate}.parquet")
            ts, offset = poisson_trace(trace, rate, seconds, span, seed=rate)
            iolog = Path(tmp, f"poisson-{rate}.iolog")
            write_iolog_v3(iolog, dev, ts, offset)
            out = Path(tmp, "out.parquet")
            # Ours first, then fio: one pair per rate, back to back on the same device.
            ours = run_ours(trace, dev, out, afap=False, keep_output=True)
            o = ours_figures(pq.read_table(out, columns=["intended_ns", "issue_ns", "complete_ns"]), ts)
            out.unlink()
            lat = Path(tmp, f"fio-{rate}")
            job = run_fio(["--name=replay", f"--read_iolog={iolog}", "--ioengine=io_uring", "--direct=1",
                           "--iodepth=1024", f"--write_lat_log={lat}", "--log_offset=1"])
            f = fio_figures(job, f"{lat}_lat.1.log", ts)
            for log in Path(tmp).glob(f"fio-{rate}_*.log"):
                log.unlink()
            trace.unlink()
            iolog.unlink()
            results.append({"rate": rate, "seconds": seconds, "ios": len(ts), "ours": o, "fio": f,
                            "ours_run": {k: ours[k] for k in ("engine_cpu_s", "process_cpu_s", "wall_s")}})
            print(f"  {rate} IOPS: ours p99 {o['p99_us']:.1f} us, duration {o['duration_error_pct']:+.3f} %; "
                  f"fio duration {f['duration_error_pct']:+.2f} %", flush=True)

    headers = ["rate", "tool", "IOPS done", "p50 us", "p99 us", "p99.9 us", "max us", "<=25us",
               "duration err %", "p99<=25us", "dur<=0.1%"]
    rows = []
    for r in results:
        for tool in ("ours", "fio"):
            x = r[tool]
            note = " (ms res.)" if tool == "fio" else ""
            rows.append([r["rate"], tool + note, x["iops"], x["p50_us"], x["p99_us"], x["p999_us"],
                         x["max_us"], f"{x['within_25us'] * 100:.1f}%" if tool == "ours" else "-",
                         x["duration_error_pct"],
                         ("ok" if x["p99_us"] <= 25 else "MISS") if tool == "ours" else "-",
                         "ok" if abs(x["duration_error_pct"]) <= 0.1 else "MISS"])
    print()
    print(f"Open-loop replay of {seconds:g} s Poisson traces, 4 KiB random reads, loop device "
          "(direct-io), io_uring; fio issue errors from its ms-resolution latency log")
    print(table(headers, rows))
    write_json(a.json, {"machine": machine(), "rows": results})


if __name__ == "__main__":
    main()
