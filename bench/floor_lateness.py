"""Open-loop lateness against the floor: Poisson-arrival traces of 4 KiB random I/O, 70 %
reads, at 20k, 50k and 100k IOPS (5 s each), on a zram device (a loop device over /dev/shm where
there is no zram), replayed by `replay run` as a user runs it (default engine) and by the
floor (floor.c: one thread that spins on CLOCK_MONOTONIC to each absolute deadline, stamps the
clock and calls pread/pwrite itself), in alternating pairs; and once by fio's read_iolog, for
its duration error.

How to read it. Lateness = issue time - intended time per I/O (ours: issue_ns - intended_ns
from the results; the floor stamps the clock right before its system call, as our psync
engine does). Per rate and tool: p50, p99, p99.9 and the share of I/Os more than 100 us late,
each the median over the pairs; "ratio" is ours / floor of those medians ("-" where the floor
is 0). Goals (issue 23): at 100k IOPS p99 <= 10 us and p99.9 <= 50 us; at every rate each
figure within 1.5x of the floor's. fio's duration error is its job runtime / the trace's
length - 1 (ours is 0.000 % by construction: absolute deadlines).

With --sleeping-floor NS, each pair also runs the floor made to sleep until NS before each
deadline further away (floor.c timed's SLEEP_NS), and its medians print under the table: what
sleeping near a deadline costs on this machine (engine/src/clock.rs's LONG_SPIN_NS).
"""
import statistics
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

import targets
from _harness import (build_floor, machine, parser, run_fio, run_floor, run_ours, table,
                      write_floor_trace, write_json)

BS = 4096


def poisson(rate, seconds, span, seed, read_share=0.7):
    """(ts_ns, offset, length, op) of a Poisson trace, `read_share` reads."""
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    ts = np.cumsum(rng.exponential(1e9 / rate, n)).astype(np.int64)
    ts -= ts[0]
    offset = rng.integers(0, span // BS, n, dtype=np.int64) * BS
    op = (rng.random(n) >= read_share).astype(np.uint8)  # 0 read, 1 write: traces.schema.Op
    return ts, offset, np.full(n, BS, np.int64), op


def write_parquet(path, ts, offset, length, op):
    from traces.trace import write_trace

    write_trace(path, {"ts_ns": ts, "op": op, "offset": offset, "length": length}, {"name": path.stem})
    return path


def write_iolog(path, dev, ts, offset, op):
    """fio's v3 iolog (times in microseconds, as fio 3.33 reads them)."""
    us = ts // 1000
    names = np.where(op == 0, "read", "write")
    with open(path, "w") as f:
        f.write(f"fio version 3 iolog\n0 {dev} add\n0 {dev} open\n")
        f.writelines(f"{t} {dev} {a} {o} {BS}\n" for t, a, o in zip(us.tolist(), names.tolist(), offset.tolist()))
        f.write(f"{int(us[-1])} {dev} close\n")


def figures(late_ns) -> dict:
    us = np.asarray(late_ns) / 1e3
    p50, p99, p999 = np.percentile(us, [50, 99, 99.9])
    return {"p50_us": float(p50), "p99_us": float(p99), "p999_us": float(p999),
            "over_100us": float(np.mean(us > 100)), "max_us": float(us.max())}


KEYS = ("p50_us", "p99_us", "p999_us", "over_100us")


def main():
    p = parser(__doc__)
    p.add_argument("--rates", help="comma-separated IOPS (default 20000,50000,100000)")
    p.add_argument("--seconds", type=float, help="trace length (default 5, quick 1)")
    p.add_argument("--pairs", type=int, help="alternating floor/ours pairs per rate (default 3, quick 1)")
    p.add_argument("--engine", help="our engine (default: the runner's choice for the device)")
    p.add_argument("--sleeping-floor", type=int, metavar="NS",
                   help="also run the floor sleeping until NS before each deadline")
    a = p.parse_args()
    seconds = a.seconds or (1.0 if a.quick else 5.0)
    pairs = a.pairs or (1 if a.quick else 3)
    rates = [int(r) for r in (a.rates or "20000,50000,100000").split(",")]
    span = (256 << 20) if a.quick else (1 << 30)
    results = []
    with tempfile.TemporaryDirectory(prefix="tracereplay-bench-") as tmp, \
            targets.zram_or_shm(span=span) as (kind, dev):
        floor = build_floor(tmp)
        for rate in rates:
            cols = poisson(rate, seconds, span, seed=rate)
            trace = write_parquet(Path(tmp, f"poisson-{rate}.parquet"), *cols)
            raw = write_floor_trace(Path(tmp, f"poisson-{rate}.bin"), *cols)
            runs = {"floor": [], "ours": []} | ({"sleeping floor": []} if a.sleeping_floor else {})
            for k in range(pairs):
                for who in (tuple(runs) if k % 2 == 0 else tuple(runs)[::-1]):
                    if who.endswith("floor"):
                        late = Path(tmp, "late.bin")
                        run_floor(floor, "timed", dev, raw, late, *([a.sleeping_floor] if who != "floor" else []))
                        runs[who].append(figures(np.fromfile(late, np.int64)))
                    else:
                        out = Path(tmp, "out.parquet")
                        res = run_ours(trace, dev, out, afap=False, keep_output=True, engine=a.engine)
                        t = pq.read_table(out, columns=["intended_ns", "issue_ns"])
                        runs["ours"].append({**figures(t["issue_ns"].to_numpy() - t["intended_ns"].to_numpy()),
                                             "engine": res["engine"], "process_cpu_s": res["process_cpu_s"]})
                        out.unlink()
            iolog = Path(tmp, f"poisson-{rate}.iolog")
            write_iolog(iolog, dev, *cols[:2], cols[3])
            job = run_fio(["--name=replay", f"--read_iolog={iolog}", "--ioengine=psync", "--direct=1"])
            fio_dur = (job["job_runtime"] / 1e3 / (cols[0][-1] / 1e9) - 1) * 100
            for f in (trace, raw, iolog):
                f.unlink()
            med = {who: {k: statistics.median(r[k] for r in rs) for k in KEYS} for who, rs in runs.items()}
            results.append({"rate": rate, "target": kind, "seconds": seconds, "pairs": pairs, "runs": runs,
                            "median": med, "fio_duration_error_pct": fio_dur,
                            "engine": runs["ours"][0]["engine"]})
            print(f"  {rate} IOPS: floor p99 {med['floor']['p99_us']:.1f} us, ours {med['ours']['p99_us']:.1f} us; "
                  f"fio duration {fio_dur:+.1f} %", flush=True)

    headers = ["rate", "engine", "floor p50", "p99", "p99.9", ">100us", "ours p50", "p99", "p99.9", ">100us",
               "ratio p50", "p99", "p99.9", ">100us", "fio dur %"]
    rows = []
    for r in results:
        f, o = r["median"]["floor"], r["median"]["ours"]
        ratio = [f"{o[k] / f[k]:.2f}" if f[k] > 0 else "-" for k in KEYS]
        pct = lambda x: f"{x * 100:.3f}%"
        rows.append([r["rate"], r["engine"], f["p50_us"], f["p99_us"], f["p999_us"], pct(f["over_100us"]),
                     o["p50_us"], o["p99_us"], o["p999_us"], pct(o["over_100us"]), *ratio,
                     r["fio_duration_error_pct"]])
    print()
    print(f"Open-loop lateness (us), Poisson 4 KiB 70/30 random, {seconds:g} s per run, on {results[0]['target']}; "
          f"medians of {pairs} alternating floor/ours pairs; ratios ours/floor (goal <= 1.5)")
    print(table(headers, rows))
    if a.sleeping_floor:
        print(f"\nThe floor sleeping until {a.sleeping_floor / 1e3:g} us before each deadline (medians; p50, p99, "
              "p99.9 in us, share > 100 us):")
        for r in results:
            s = r["median"]["sleeping floor"]
            print(f"  {r['rate']}: {s['p50_us']:.3f} / {s['p99_us']:.2f} / {s['p999_us']:.1f} / "
                  f"{s['over_100us'] * 100:.3f} %")
    write_json(a.json, {"machine": machine(), "rows": results})


if __name__ == "__main__":
    main()
