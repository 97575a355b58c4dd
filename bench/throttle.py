"""Does the slow drive of bench/two_drives.py hold our engine at its limit? A 70/30 QD32
replay of 4 KiB random I/O (as fast as possible) on each drive of targets.drive_pair, once per
engine: read and write IOPS on the throttled drive against its limits, and on the unthrottled
fast drive. The replaying process joins the throttle's cgroup before it starts, as
two_drives.py does. Needs root, loop devices and a block cgroup controller.

    python bench/throttle.py [--quick] [--json PATH] [--riops 2000] [--wiops 2000] [--engines io_uring,psync]
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

import targets  # noqa: E402
from _harness import machine, parser, random_trace, table, write_json  # noqa: E402

MIB = 1 << 20


def replay_json(trace, dev, engine, out, throttle=None) -> dict:
    """`replay run TRACE DEV --afap --qd 32 --json` in a fresh process (inside `throttle`'s
    cgroup when given): {"read": IOPS, "write": IOPS, "engine": ...}."""
    cmd = [sys.executable, "-c", "from replay.cli import main; main()", "run", str(trace), dev,
           "--afap", "--qd", "32", "--engine", engine, "--destroy-data", "-o", str(out), "--json"]
    kwargs = throttle.popen_kwargs() if throttle else {}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, **kwargs)
    if done.returncode:
        raise SystemExit(f"replay run failed ({done.returncode}): {done.stderr.strip()}")
    job = json.loads(done.stdout)["jobs"][0]
    out.unlink()
    return {"read": job["read"]["iops"], "write": job["write"]["iops"],
            "ios": job["read"]["total_ios"] + job["write"]["total_ios"]}


def main():
    p = parser(__doc__)
    p.add_argument("--riops", type=int, default=2000, help="slow drive's read IOPS limit")
    p.add_argument("--wiops", type=int, default=2000, help="slow drive's write IOPS limit")
    p.add_argument("--bps", type=int, default=64, help="slow drive's MiB/s limit, each direction")
    p.add_argument("--engines", default="io_uring,psync")
    p.add_argument("--seconds", type=float, help="length of a throttled run at the limits "
                   "(default 10, quick 3): sets the I/O count")
    a = p.parse_args()
    seconds = a.seconds or (3.0 if a.quick else 10.0)
    # Enough I/Os to last `seconds` at the limits (70 % reads): the count is what ends a run.
    count = int(seconds * min(a.riops / 0.7, a.wiops / 0.3))
    size = 256 * MIB
    rows, figures = [], []
    with tempfile.TemporaryDirectory(prefix="tracereplay-bench-throttle-") as tmp, \
            targets.drive_pair(size, riops=a.riops, wiops=a.wiops, rbps=a.bps * MIB,
                               wbps=a.bps * MIB) as (fast, slow, throttle):
        trace = random_trace(Path(tmp, "r70.parquet"), count, size, read_share=0.7)
        print(f"slow drive {slow} ({throttle.kind}: {throttle.limits}), fast drive {fast}; "
              f"{count:,} I/Os per run", flush=True)
        for engine in a.engines.split(","):
            for name, dev, th in (("slow", slow, throttle), ("fast", fast, None)):
                before = th.serviced() if th else {}
                got = replay_json(trace, dev, engine, Path(tmp, "out.parquet"), th)
                after = th.serviced() if th else {}
                got.update(drive=name, engine=engine,
                           serviced={k: after[k] - before.get(k, 0) for k in after})
                figures.append(got)
                limit_r = f"{a.riops:,}" if th else "-"
                limit_w = f"{a.wiops:,}" if th else "-"
                rows.append([name, engine, got["ios"], got["read"], limit_r, got["write"], limit_w])
                print(f"  {name} {engine}: read {got['read']:,.0f} IOPS, write {got['write']:,.0f}", flush=True)
    print()
    print("70/30 QD32, 4 KiB random, as fast as possible")
    print(table(["drive", "engine", "I/Os", "read IOPS", "read limit", "write IOPS", "write limit"], rows))
    write_json(a.json, {"machine": machine(), "limits": {"riops": a.riops, "wiops": a.wiops,
                                                           "mib_per_s": a.bps},
                        "count": count, "runs": figures})


if __name__ == "__main__":
    main()
