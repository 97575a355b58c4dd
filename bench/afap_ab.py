"""A/B of two or more versions of tracereplay as fast as possible, each against the floor: the
rows of afap_floor.py (zram QD32 with the runner's engine; a loop device over /dev/shm with
io_uring at a given depth), every round running the floor and then each version in a rotating
order, the version chosen by PYTHONPATH (a checkout or git worktree with its engine built).

On this project's VMs single rounds of one row range over 0.80-1.05 of the floor, so an effect
of a few per cent needs many rounds: the script prints each round, then per row the medians of
ours / floor per version and of each version / the first per round.

    python bench/afap_ab.py --rounds 10 --rows zram-read,shm32-rw old=/work/wt/old new=.
"""
import statistics
import tempfile
from pathlib import Path

import targets
from _harness import build_floor, parser, run_floor, run_ours, write_json
from afap_floor import row_setup, same_trace

SPAN = 1 << 30


def measure(tmp, floor, dev, row: str, versions: dict, rounds: int, scale: float) -> dict:
    kind, workload = row.split("-")
    share = {"read": 1.0, "rw": 0.7}[workload]
    # The runner's engine on zram, io_uring on the loop device, as afap_floor.py's rows.
    qd, engine = (32, None) if kind == "zram" else (int(kind.removeprefix("shm")), "io_uring")
    n, mode, arg = row_setup("zram" if kind == "zram" else "shm", qd, scale)
    trace, raw = same_trace(tmp, row, n, SPAN, share)
    names = list(versions)
    ratios = {name: [] for name in names}
    for r in range(rounds):
        floor_iops = run_floor(floor, mode, dev, raw, arg)["iops"]
        for name in names[r % len(names):] + names[:r % len(names)]:
            out = run_ours(trace, dev, Path(tmp, "out.parquet"), afap=True, qd=qd, engine=engine,
                           pythonpath=versions[name])
            ratios[name].append(out["iops"] / floor_iops)
        print(f"  {row} round {r + 1}: floor {floor_iops:,.0f}, ours / floor "
              + ", ".join(f"{k} {v[-1]:.3f}" for k, v in ratios.items()), flush=True)
    trace.unlink()
    raw.unlink()
    med = statistics.median
    first = names[0]
    result = {"row": row, "rounds": ratios, "vs_floor": {k: med(v) for k, v in ratios.items()},
              f"vs_{first}": {k: med(a / b for a, b in zip(v, ratios[first])) for k, v in ratios.items()}}
    print(f"{row}: ours / floor " + ", ".join(f"{k} {v:.3f}" for k, v in result["vs_floor"].items())
          + f"; per round / {first} " + ", ".join(f"{k} {v:.3f}" for k, v in result[f"vs_{first}"].items()
                                                 if k != first), flush=True)
    return result


def main():
    p = parser(__doc__)
    p.add_argument("--rounds", type=int, default=8, help="rounds per row (default 8)")
    p.add_argument("--rows", default="zram-read,zram-rw,shm32-rw,shm128-rw",
                   help="comma-separated: zram-read, zram-rw, shmQD-read, shmQD-rw (QD a queue depth)")
    p.add_argument("versions", nargs="+", metavar="NAME=PATH",
                   help="a version of tracereplay: its name and the directory put on PYTHONPATH")
    a = p.parse_args()
    versions = dict(v.split("=", 1) for v in a.versions)
    versions = {k: str(Path(v).resolve()) for k, v in versions.items()}
    scale = 0.1 if a.quick else 1.0
    rows = a.rows.split(",")
    results = []
    with tempfile.TemporaryDirectory(prefix="tracereplay-bench-") as tmp:
        floor = build_floor(tmp)
        for kind, make in (("zram", targets.zram_device), ("shm", targets.shm_loop_device)):
            mine = [r for r in rows if r.startswith(kind)]
            if mine:
                with make(span=SPAN) as dev:
                    results += [measure(tmp, floor, dev, row, versions, a.rounds, scale) for row in mine]
    write_json(a.json, {"versions": versions, "rows": results})


if __name__ == "__main__":
    main()
