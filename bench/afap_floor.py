"""AFAP against the floor and fio's best: 4 KiB random reads and 70/30 random read/write, as
fast as possible, the same I/Os for every tool, alternating runs.

- psync rows, a zram device (whose driver runs each I/O on the submitting CPU): `replay run
  --afap --qd 32` with the engine the runner picks there; the floor's minimal pread/pwrite
  loops, one thread per CPU, each opening the device itself (as fio's jobs do); fio in its best
  configuration of io_uring QD32, libaio QD32 and psync with 1, 2 and 4 jobs (each tried once
  on a quarter of the I/Os first).
- io_uring rows, a loop device over /dev/shm, QD 1, 4, 32 and 128: ours with --engine io_uring;
  the floor's minimal io_uring loop at the same depth (liburing, registered file and buffers;
  up to QD32 each I/O in an enter of its own, as fio submits, deeper all the free slots in
  one; and with up to 4 I/Os in flight a spin of up to 30 us for a completion before it sleeps
  for one, as our engine does: on this VM a sleeping thread's idle vCPU halts, and waking it
  costs more than the I/O); fio io_uring at the same depth.
- both floors write the bytes ours writes (random data, each write from its own place in an
  8 MiB pool). Writing one buffer over and over, the floor's 70/30 rate was 1.08x that on zram
  (whose lzo then compresses one easy block, not random data) and 1.04x at QD128 on the shm
  loop device (medians of 4 alternating rounds): a lighter job than ours.
- the recording floor: the same loops keeping each I/O's times and result as a replayer must
  (`floor ... record`: a clock read per I/O and four stores to arrays laid out before the run),
  which the floor does not: what recording alone costs on this machine.
- the engine alone: our engine as `replay run` starts it, fed the same trace from memory in the
  runner's chunks, its results dropped (`_harness.py engine-alone`): ours without the runner's
  work beside the engine (reading the trace, the results journal, the summary), so a row's gap
  to the floor splits into the engine's part and the runner's.

How to read it. IOPS are medians over the repetitions; "vs floor" and "vs fio" are medians of
the per-repetition ratios ours / floor and ours / fio (goals, issue 23: >= 0.95 against the
floor on every row, >= 1.0 against fio's best, >= 1.2 against fio io_uring on the /dev/shm loop
device), "its range" the lowest and highest ours / floor of the repetitions; "vs rec floor" is
ours / the recording floor, "engine alone vs floor" the engine alone / the floor. CPU is
microseconds of user + system time per I/O of the whole process: ours the replay() call
(Parquet read and results written included), the floor's and fio's process (fio's job
processes included); goal: ours <= fio's.
"""
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np

import targets
from _harness import (build_floor, machine, parser, random_trace, run_engine_alone, run_fio, run_floor, run_ours,
                      table, write_floor_trace, write_json)
from afap_vs_fio import config_name, fio_args

WORKLOADS = {"randread": 1.0, "randrw70": 0.7}


def row_setup(target: str, qd: int, scale: float) -> tuple[int, str, int]:
    """A row's I/O count and its floor's mode and argument: on zram, QD32 rows against one
    pread loop per CPU; on the /dev/shm loop device, an io_uring loop at the row's depth."""
    if target == "zram":
        return int(1_000_000 * scale), "psync", os.cpu_count() or 1
    return int(400_000 * scale), "uring", qd


def same_trace(tmp, name, n, span, read_share):
    """The trace as Parquet for ours and as records for the floor: the same rows."""
    import pyarrow.parquet as pq

    path = random_trace(Path(tmp, f"{name}.parquet"), n, span, read_share=read_share)
    t = pq.read_table(path)
    raw = write_floor_trace(Path(tmp, f"{name}.bin"), t["ts_ns"].to_numpy(), t["offset"].to_numpy(),
                            t["length"].to_numpy(), t["op"].to_numpy())
    return path, raw


def measure(tmp, floor, dev, kind, wl, read_share, n, span, reps, *, engines, qd, floor_mode, floor_arg,
            fio_candidates):
    """One row per engine of `engines` (None: the runner's choice), each against the same
    floor and fio runs: every repetition runs them all, in a rotating order."""
    trace, raw = same_trace(tmp, f"{wl}-{qd}", n, span, read_share)
    rw = "randread" if read_share == 1 else "randrw"
    tried = {c: run_fio(fio_args(dev, rw, c, max(n // 4, 5000), span))["iops"] for c in fio_candidates}
    best = max(tried, key=tried.get)
    runs = []
    order = [("ours", e) for e in engines] + [("alone", e) for e in engines] + ["floor", "floor_rec", "fio"]
    for rep in range(reps):
        run = {}
        for who in order[rep % len(order):] + order[:rep % len(order)]:
            if who in ("floor", "floor_rec"):
                f = run_floor(floor, floor_mode, dev, raw, floor_arg, *(["record"] if who == "floor_rec" else []))
                run[who] = {"iops": f["iops"], "us_per_io": f["cpu_s"] / f["ios"] * 1e6}
            elif who == "fio":
                f = run_fio(fio_args(dev, rw, best, n, span))
                run["fio"] = {"iops": f["iops"], "us_per_io": f["child_cpu_s"] / f["ios"] * 1e6}
            elif who[0] == "alone":
                o = run_engine_alone(trace, dev, qd=qd, engine=who[1])
                run[who] = {"iops": o["iops"], "us_per_io": o["engine_cpu_s"] / o["ios"] * 1e6}
            else:
                o = run_ours(trace, dev, Path(tmp, "out.parquet"), afap=True, qd=qd, engine=who[1])
                run[who] = {"iops": o["iops"], "us_per_io": o["process_cpu_s"] / o["ios"] * 1e6,
                            "engine": o["engine"]}
        runs.append(run)
    trace.unlink()
    raw.unlink()
    med = statistics.median
    rows = []
    for ours in order[:len(engines)]:
        row = {"target": kind, "workload": wl, "qd": qd, "ios": n, "engine": runs[0][ours]["engine"],
               "fio_config": config_name(best), "fio_tried": {config_name(c): v for c, v in tried.items()},
               "runs": [{"ours": r[ours], "alone": r[("alone", ours[1])], "floor": r["floor"],
                         "floor_rec": r["floor_rec"], "fio": r["fio"]} for r in runs]}
        for who in ("ours", "alone", "floor", "floor_rec", "fio"):
            row[f"{who}_iops"] = med(r[who]["iops"] for r in row["runs"])
            row[f"{who}_us"] = med(r[who]["us_per_io"] for r in row["runs"])
        per_rep = [r["ours"]["iops"] / r["floor"]["iops"] for r in row["runs"]]
        row["vs_floor"] = med(per_rep)
        # The repetitions' spread: on this project's VMs one row moves by up to 0.14 between runs.
        row["vs_floor_range"] = f"{min(per_rep):.2f}-{max(per_rep):.2f}"
        row["vs_floor_rec"] = med(r["ours"]["iops"] / r["floor_rec"]["iops"] for r in row["runs"])
        row["alone_vs_floor"] = med(r["alone"]["iops"] / r["floor"]["iops"] for r in row["runs"])
        row["vs_fio"] = med(r["ours"]["iops"] / r["fio"]["iops"] for r in row["runs"])
        row["cpu_vs_fio"] = med(r["ours"]["us_per_io"] / r["fio"]["us_per_io"] for r in row["runs"])
        print(f"  {kind} {wl} QD{qd}: ours ({row['engine']}) {row['ours_iops']:,.0f}, floor "
              f"{row['floor_iops']:,.0f}, recording floor {row['floor_rec_iops']:,.0f}, fio {row['fio_config']} "
              f"{row['fio_iops']:,.0f} IOPS", flush=True)
        rows.append(row)
    return rows


def main():
    p = parser(__doc__)
    p.add_argument("--reps", type=int, help="repetitions per row (default 3, quick 1)")
    p.add_argument("--targets", default="zram,shm", help="zram, shm or both (default)")
    p.add_argument("--depths", default="1,4,32,128", help="io_uring rows' queue depths")
    p.add_argument("--zram-engines", default="auto",
                   help="our engines on zram, each a row against the same floor and fio runs: auto "
                        "(the runner's choice, psync there), psync, io_uring (default auto; "
                        "auto,io_uring compares the default with the other)")
    a = p.parse_args()
    reps = a.reps or (1 if a.quick else 3)
    span = (256 << 20) if a.quick else (1 << 30)
    scale = 0.1 if a.quick else 1.0
    engines = [None if e == "auto" else e for e in a.zram_engines.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="tracereplay-bench-") as tmp:
        floor = build_floor(tmp)
        if "zram" in a.targets:
            with targets.zram_device(span=span) as dev:
                fio_best = [("io_uring", 1, 32), ("libaio", 1, 32), ("psync", 1, 1), ("psync", 2, 1), ("psync", 4, 1)]
                n, floor_mode, floor_arg = row_setup("zram", 32, scale)
                for wl, share in WORKLOADS.items():
                    results += measure(tmp, floor, dev, "zram", wl, share, n, span, reps, engines=engines, qd=32,
                                       floor_mode=floor_mode, floor_arg=floor_arg, fio_candidates=fio_best)
        if "shm" in a.targets:
            with targets.shm_loop_device(span=span) as dev:
                for qd in [int(d) for d in a.depths.split(",")]:
                    n, floor_mode, floor_arg = row_setup("shm", qd, scale)
                    for wl, share in WORKLOADS.items():
                        results += measure(tmp, floor, dev, "shm loop", wl, share, n, span, reps,
                                           engines=["io_uring"], qd=qd, floor_mode=floor_mode, floor_arg=floor_arg,
                                           fio_candidates=[("io_uring", 1, qd)])
    headers = ["target", "workload", "QD", "engine", "ours IOPS", "floor IOPS", "rec floor IOPS", "fio config",
               "fio IOPS", "vs floor", "its range", "vs rec floor", "engine alone vs floor", "vs fio", "ours us/IO",
               "floor us/IO", "rec floor us/IO", "fio us/IO", "CPU vs fio"]
    rows = [[r["target"], r["workload"], r["qd"], r["engine"], r["ours_iops"], r["floor_iops"], r["floor_rec_iops"],
             r["fio_config"], r["fio_iops"], r["vs_floor"], r["vs_floor_range"], r["vs_floor_rec"],
             r["alone_vs_floor"], r["vs_fio"], r["ours_us"], r["floor_us"], r["floor_rec_us"], r["fio_us"],
             r["cpu_vs_fio"]]
            for r in results]
    print()
    print(f"AFAP, 4 KiB, O_DIRECT; medians of {reps} alternating repetitions; ratios ours/floor and ours/fio "
          "(goals >= 0.95 and >= 1.0; >= 1.2 vs fio io_uring on the shm loop device); CPU: user + system per I/O")
    print(table(headers, rows))
    write_json(a.json, {"machine": machine(), "reps": reps, "span": span, "rows": results})


if __name__ == "__main__":
    main()
