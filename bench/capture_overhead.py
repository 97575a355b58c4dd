"""What `replay capture` costs: fio at its highest rate on a loop device, with and without a
tracefs capture around it, alternating. Prints I/Os captured / I/Os fio issued (goal 100 %)
and the IOPS lost to capture (goal <= 25 %). Also, alternating with the same plain runs, the
IOPS lost to tracing the sleep calls alone (a capture traces them for every process, which
puts every system call on the kernel's tracing path): the psync job makes a call per I/O.

    python bench/capture_overhead.py [--quick] [--runtime S] [--reps N] [--json PATH]
"""
import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import targets  # noqa: E402

MIB = 1 << 20
JOBS = {
    "randread QD32": ["--rw=randread", "--iodepth=32"],
    "randrw 70/30 QD32": ["--rw=randrw", "--rwmixread=70", "--iodepth=32"],
    "randread psync QD1": ["--rw=randread", "--ioengine=psync", "--iodepth=1"],
}


@contextlib.contextmanager
def sleep_tracing():
    """The sleep calls traced in a tracefs instance of their own, as a capture traces them."""
    from traces.capture.tracefs import SLEEP_EVENTS, find_tracefs

    root, mounted = find_tracefs()
    inst = root / "instances" / f"tracereplay-bench-{os.getpid()}"
    inst.mkdir()
    try:
        for event in SLEEP_EVENTS:
            (inst / "events/syscalls" / event / "enable").write_text("1")
        yield
    finally:
        for event in SLEEP_EVENTS:
            (inst / "events/syscalls" / event / "enable").write_text("0")
        inst.rmdir()
        if mounted:
            subprocess.run(["umount", str(root)], check=False)


def fio_cmd(dev, job_args, runtime, report):
    return ["fio", "--name=bench", f"--filename={dev}", "--bs=4k", "--direct=1", "--ioengine=io_uring",
            f"--runtime={runtime}", "--time_based", "--size=256M", "--output-format=json",
            f"--output={report}", *job_args]


def fio_totals(report: Path):
    job = json.loads(report.read_text())["jobs"][0]
    ios = sum(job[d]["total_ios"] for d in ("read", "write", "trim"))
    iops = sum(job[d]["iops"] for d in ("read", "write", "trim"))
    return ios, iops


def one(dev, job_args, runtime, captured: bool, work: Path, sleeps: bool = False):
    report = work / "fio.json"
    if not captured:
        with sleep_tracing() if sleeps else contextlib.nullcontext():
            subprocess.run(fio_cmd(dev, job_args, runtime, report), check=True, capture_output=True)
        ios, iops = fio_totals(report)
        return {"ios": ios, "iops": iops}
    trace = work / "cap.parquet"
    done = subprocess.run([sys.executable, "-c", "from replay.cli import main; main()", "capture", dev,
                           "-o", str(trace), "--backend", "tracefs", "--",
                           *fio_cmd(dev, job_args, runtime, report)], capture_output=True, text=True,
                          cwd=HERE.parent)
    if done.returncode != 0:
        raise SystemExit(f"capture failed: {done.stderr}")
    ios, iops = fio_totals(report)
    from traces.trace import open_trace

    t = open_trace(trace)
    src = t.metadata["source"]
    row = {"ios": ios, "iops": iops, "rows": t.num_rows, "lost": src["lost_events"],
           "events": sum(src["events"].values()), "unmatched": src["unmatched_issues"]}
    trace.unlink()
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="2 s runs, 1 repetition")
    p.add_argument("--runtime", type=int, default=10, help="seconds per fio run (default 10)")
    p.add_argument("--reps", type=int, default=3, help="pairs of runs per job (default 3)")
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args()
    runtime, reps = (2, 1) if args.quick else (args.runtime, args.reps)
    results = {}
    with targets.loop_device(size=512 * MIB, span=256 * MIB) as dev, tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name, job_args in JOBS.items():
            runs = {"plain": [], "captured": [], "sleeps traced": []}
            for _ in range(reps):
                runs["plain"].append(one(dev, job_args, runtime, False, work))
                runs["captured"].append(one(dev, job_args, runtime, True, work))
                runs["sleeps traced"].append(one(dev, job_args, runtime, False, work, sleeps=True))
            results[name] = runs
    print(f"{'job':<20} {'fio IOPS':>10} {'captured IOPS':>14} {'IOPS lost':>10} {'captured/issued':>16} "
          f"{'lost events':>12} {'lost to sleeps alone':>21}")
    summary = {}
    for name, runs in results.items():
        plain = statistics.median(r["iops"] for r in runs["plain"])
        cap = statistics.median(r["iops"] for r in runs["captured"])
        ratio = min(r["rows"] / r["ios"] for r in runs["captured"])
        lost = sum(r["lost"] for r in runs["captured"])
        sleeps = statistics.median(r["iops"] for r in runs["sleeps traced"])
        summary[name] = {"fio_iops": plain, "captured_iops": cap, "iops_lost": 1 - cap / plain,
                         "captured_over_issued_min": ratio, "lost_events": lost,
                         "iops_lost_to_sleep_tracing": 1 - sleeps / plain}
        print(f"{name:<20} {plain:>10,.0f} {cap:>14,.0f} {100 * (1 - cap / plain):>9.1f}% "
              f"{100 * ratio:>15.2f}% {lost:>12} {100 * (1 - sleeps / plain):>20.1f}%")
    print("captured/issued: trace rows / fio's total_ios (the worst repetition); a request or two "
          "completing after fio's runtime can put it just above 100 %.")
    if args.json:
        args.json.write_text(json.dumps({"runs": results, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
