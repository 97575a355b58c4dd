"""What causal replay's calibration measures and costs: the replayer's own time per I/O on the
two-drive pair of bench/two_drives.py (a fast loop device over /dev/shm, and a slow one over
/var/tmp throttled in a private block cgroup, replayed from inside it), and the wall time a
causal replay of the bundled filecopy capture takes with and without it, alternating.

    python bench/calibration.py [--quick] [--json PATH] [--reps 3] [--riops 2000]

(--quick: one pair of runs per drive, the slow drive at 20,000 IOPS and 400 MiB/s.)
"""
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _harness import machine, parser, write_json  # noqa: E402

from bench import targets  # noqa: E402
from traces.trace import open_trace  # noqa: E402

MIB = 1 << 20
CLI = [sys.executable, "-c", "from replay.cli import main; main()"]
PAIRS = (("read after read", 0, 0), ("write after write", 1, 1), ("flush after write", 1, 3),
         ("write after flush", 3, 1))


def main():
    p = parser(__doc__)
    p.add_argument("--reps", type=int, help="alternating pairs of runs per drive (default 3, quick 1)")
    p.add_argument("--riops", type=int, help="the slow drive's IOPS limit, each way (default 2,000, quick 20,000)")
    a = p.parse_args()
    a.reps = a.reps or (1 if a.quick else 3)
    a.riops = a.riops or (20_000 if a.quick else 2_000)
    bps = (400 if a.quick else 64) * MIB
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-calibration-") as tmp, \
            targets.drive_pair(512 * MIB, riops=a.riops, wiops=a.riops, rbps=bps, wbps=bps) \
            as (fast, slow, throttle):
        for name, dev, th in (("fast", fast, None), ("slow", slow, throttle)):
            walls = {True: [], False: []}
            costs = []
            for _ in range(a.reps):
                for calibrate in (True, False):
                    out = Path(tmp) / "r.parquet"
                    began = time.monotonic()
                    subprocess.run([*CLI, "run", "filecopy", dev, "--timing", "causal", "--remap", "wrap",
                                    "--destroy-data", "-o", str(out), *([] if calibrate else ["--no-calibrate"])],
                                   check=True, capture_output=True, cwd=REPO, **(th.popen_kwargs() if th else {}))
                    walls[calibrate].append(time.monotonic() - began)
                    if calibrate:
                        costs.append(open_trace(out).metadata["run"]["host_cost_ns"])
            rows.append((name, dev, costs, walls))
    print(f"causal replays of filecopy, {a.reps} alternating pairs per drive (slow: {a.riops:,} IOPS and "
          f"{bps // MIB} MiB/s in the replayer's cgroup)")
    for name, dev, costs, walls in rows:
        per = ", ".join(f"{label} {'/'.join(f'{c[x][y] / 1e3:.0f}' for c in costs)} us" for label, x, y in PAIRS)
        added = [c - n for c, n in zip(walls[True], walls[False])]
        print(f"{name} ({dev}): {per}")
        print(f"  wall time with calibration {statistics.median(walls[True]):.2f} s, without "
              f"{statistics.median(walls[False]):.2f} s: it adds {min(added):.2f}-{max(added):.2f} s")
    write_json(a.json, {"machine": machine(), "reps": a.reps, "riops": a.riops,
                        "drives": [{"name": n, "device": d, "host_cost_ns": c,
                                    "wall_s": {"calibrated": w[True], "not": w[False]}} for n, d, c, w in rows]})


if __name__ == "__main__":
    main()
