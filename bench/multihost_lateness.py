"""Does a multi-host replay add lateness? p99 issue error (issue - intended) of each host of a
`replay run --plan` run against a one-host replay of the same share on the same target, as a
ratio, the median of alternating pairs (the issue asks for within 10 %). The hosts are Ray nodes on 127.0.0.1 (a head and one
more node, started here and shut down after), each replaying to its own file; as they share
this machine's cores, the one-host replays of the two shares run at the same time too, by
plain `replay run` processes, alternating with the multi-host runs.

Usage: python bench/multihost_lateness.py [--quick] [--json PATH] [--iops N] [--seconds S]
       [--engine E] [--reps N]
(default 2,000 IOPS per host for 20 s, 5 pairs; --quick 10 s, 3 pairs).
"""
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _harness import machine, table, write_json  # noqa: E402
from _harness import parser as harness_parser  # noqa: E402

MIB = 1 << 20
CLI = [sys.executable, "-c", "from replay.cli import main; main()"]
# The first seconds are left out of every figure: two one-host `replay run`s started together
# each begin replaying while the other still starts up (imports, reading the trace) on the
# same two cores, which the multi-host hosts, started ahead of a common instant, never do.
SETTLE_NS = 2_000_000_000


def p99_late(path, device=None) -> float:
    import pyarrow.parquet as pq

    t = pq.read_table(path, columns=["intended_ns", "issue_ns"] + (["device"] if device is not None else []))
    intended = t["intended_ns"].to_numpy()
    keep = intended >= SETTLE_NS
    if device is not None:
        keep &= t["device"].to_numpy() == device
    return float(np.percentile((t["issue_ns"].to_numpy() - intended)[keep], 99))


def main():
    parser = harness_parser(__doc__)
    parser.add_argument("--iops", type=int, default=2000, help="I/Os per second per host")
    parser.add_argument("--seconds", type=float, help="trace length (default 20, quick 10)")
    parser.add_argument("--reps", type=int, default=None, help="alternating pairs (default 5, quick 3)")
    parser.add_argument("--engine", default=None, help="engine for every replay (default: the runner's)")
    args = parser.parse_args()
    seconds = args.seconds or (10 if args.quick else 20)
    args.reps = args.reps or (3 if args.quick else 5)
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # keep Ray on loopback
    from ray.cluster_utils import Cluster

    from traces.schema import Op
    from traces.trace import read_trace, write_trace

    node = dict(num_cpus=1, node_ip_address="127.0.0.1", object_store_memory=80 * MIB)
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False,
                                                            "resources": {"host_a": 1}})
    try:
        cluster.add_node(**node, resources={"host_b": 1})
        with tempfile.TemporaryDirectory(prefix="bench-multihost-", dir="/var/tmp") as tmp:
            tmp = Path(tmp)
            n = int(2 * args.iops * seconds)
            i = np.arange(n, dtype=np.int64)
            rng = np.random.default_rng(3)
            trace = tmp / "two.parquet"
            write_trace(trace, {"ts_ns": i * int(1e9 / (2 * args.iops)),
                                "op": np.where(i % 3 == 0, Op.WRITE, Op.READ).astype(np.uint8),
                                "offset": rng.integers(0, 64 * MIB // 4096, n) * 4096,
                                "length": np.full(n, 4096, np.int64), "device": (i % 2).astype(np.uint32)},
                        {"name": "two", "source": {"kind": "synth:bench"}})
            targets = []
            for name in "ab":
                path = tmp / f"{name}.img"
                with open(path, "wb") as f:
                    f.truncate(128 * MIB)
                targets.append(str(path))
            (tmp / "plan.toml").write_text("".join(
                f'[[host]]\nname = "{h}"\nresource = "host_{h}"\ntarget = "{t}"\ndevices = [{d}]\n'
                for d, (h, t) in enumerate(zip("ab", targets))))
            engine = ["--engine", args.engine] if args.engine else []
            cols, meta = read_trace(trace)

            def alone(rep):
                """Each host's share replayed on its target by a plain `replay run`, both at
                once as in the multi-host run (one machine: the same two cores are shared);
                their p99 issue errors."""
                procs = {}
                for d, (h, t) in enumerate(zip("ab", targets)):
                    share = tmp / f"share-{h}.parquet"
                    if not share.exists():
                        write_trace(share, {k: v[cols["device"] == d] for k, v in cols.items()},
                                    {"name": f"share-{h}"})
                    procs[h] = subprocess.Popen([*CLI, "run", str(share), t, "-o",
                                                 str(tmp / f"one-{h}-{rep}.parquet"), *engine],
                                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                for h, proc in procs.items():
                    if proc.wait():
                        raise SystemExit(proc.stderr.read())
                return {h: p99_late(tmp / f"one-{h}-{rep}.parquet") for h in procs}

            # Alternate one-host and multi-host runs: a shared machine drifts, and only
            # pairs taken side by side compare.
            pairs, skews = {h: [] for h in "ab"}, []
            for rep in range(args.reps):
                solo = alone(rep)
                out = tmp / f"run{rep}"
                done = subprocess.run([*CLI, "run", str(trace), "--cluster", cluster.address, "--plan",
                                       str(tmp / "plan.toml"), "-o", str(out), *engine],
                                      capture_output=True, text=True)
                if done.returncode:
                    raise SystemExit(done.stderr)
                record = json.loads((out / "cluster.json").read_text())
                skews.append(record["start_skew_ns"])
                for h in "ab":
                    pairs[h].append((solo[h], p99_late(out / "hosts" / f"{h}.parquet")))
            rows = []
            for h in "ab":
                one, multi = np.array(pairs[h]).T
                ratio = multi / one
                # The noise: how far apart the one-host runs alone are, one from the next.
                noise = one[1:] / one[:-1] if len(one) > 1 else np.ones(1)
                rows.append([h, f"{np.median(one) / 1e3:.1f}", f"{np.median(multi) / 1e3:.1f}",
                             f"{np.median(ratio):.2f}x", f"{ratio.min():.2f}-{ratio.max():.2f}x",
                             f"{noise.min():.2f}-{noise.max():.2f}x"])
    finally:
        cluster.shutdown()
    print(f"{args.iops:,} IOPS per host for {seconds:.0f} s, 4 KiB 2:1 reads/writes on files in /var/tmp")
    print(f"medians of {args.reps} alternating pairs (one-host replays of both shares at once, then the "
          "multi-host run)")
    print(table(["host", "p99 late one-host (us)", "multi-host (us)", "multi / one-host", "range",
                 "one-host / previous"], rows))
    print(f"start skew {', '.join(f'{s / 1e3:.0f}' for s in skews)} us; last clock offsets "
          + ", ".join(f"{h['name']} {h['offset_ns'] / 1e3:+.0f} us (rtt {h['rtt_ns'] / 1e3:.0f} us)"
                      for h in record["hosts"]))
    write_json(args.json, {"machine": machine(), "iops": args.iops, "seconds": seconds, "reps": args.reps,
                           "rows": rows, "start_skew_ns": skews})


if __name__ == "__main__":
    main()
