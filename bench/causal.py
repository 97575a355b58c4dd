"""Ground truth for causal replay: each recipe run for real (fixed work) on a fast and a slow
drive, each capture replayed on the other drive with causal, original and as-fast-as-possible
timing, and the replay's predicted application time set against the application's own run.

    python bench/causal.py [--quick] [--json] [--repeat 2] [--workloads filecopy,blob,oltp,boot] [--dir DIR]
                           [--without-sleeps] [--beside N]

--workloads takes any recipe (`replay capture recipe --list`), each with the fixed work of
WORKLOADS below, or `all`.

The fast drive is a loop device over /dev/shm. The slow one is a direct-I/O loop device
stacked on another one over /var/tmp, and the lower one is throttled in the root block cgroup
(cgroup v1 blkio.throttle.*) to --riops/--wiops and --bps each way: every request to the
slow drive, the kernel's writeback and journal included, waits for the lower device, so the
slowness is the drive's own and a block trace of it sees it as request latency. (Throttling
the traced device itself would hold bios back before they become requests: invisible to the
trace, it would look like the application's own time.) Captures and real runs are kept in
DIR and reused by later runs with the same DIR (delete them to measure again).
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from bench import targets  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
REPLAY = [sys.executable, "-c", "from replay.cli import main; main()"]

# Fixed work per recipe, small enough for a 2-core machine and for the --size drives (2 GiB
# each by default, and recipes given a DEVICE use it whole): (knobs, quick knobs). Every recipe
# of traces.capture.recipes has one (tests/bench checks it), in fixed work with its outcome.
WORKLOADS = {
    "filecopy": (["--size-mb", "384", "--memory-mb", "128"], ["--size-mb", "192", "--memory-mb", "128"]),
    # The store with --ops runs closed-loop, as blobclosed does: a rate-limited run's time is its
    # --duration on any drive that keeps up, which leaves nothing to predict.
    "blob": (["--ops", "2000", "--clients", "4", "--populate-mb", "256", "--memory-mb", "160"],
             ["--ops", "400", "--clients", "4", "--populate-mb", "192", "--memory-mb", "160"]),
    "blobclosed": (["--ops", "3000", "--clients", "4", "--populate-mb", "384", "--memory-mb", "160"],
                   ["--ops", "600", "--clients", "4", "--populate-mb", "256", "--memory-mb", "128"]),
    "oltp": (["--transactions", "800", "--seed", "1", "--clients", "4", "--scale", "8", "--memory-mb", "128",
              "--shared-buffers-mb", "16"],
             ["--transactions", "200", "--seed", "1", "--clients", "4", "--scale", "4", "--memory-mb", "128",
              "--shared-buffers-mb", "16"]),
    "boot": (["--timeout", "240"], ["--timeout", "240"]),
    # The kernel's source (1.3 GB unpacked) fits a 2 GiB drive; the whole tree's build does not
    # fit the time: a few directories of it.
    "build": (["--targets", "init/ kernel/ lib/"], ["--targets", "init/"]),
    # The whole tree's checkout (1.3 GB and its pack) would fill a 2 GiB drive: one directory.
    "gitclone": (["--subtree", "fs"], ["--subtree", "fs"]),
    "dpkg": (["--variant", "buildd"], ["--variant", "minbase"]),
    "mariadb": (["--events", "4000", "--threads", "4", "--tables", "2", "--table-size", "100000"],
                ["--events", "1000", "--threads", "4", "--tables", "1", "--table-size", "50000"]),
    "rocksdb": (["--num", "500000", "--reads", "50000"], ["--num", "150000", "--reads", "5000"]),
    "photos": (["--photos", "16"], ["--photos", "4"]),
    "video": (["--seconds", "20"], ["--seconds", "4"]),
    "web": (["--files", "3000", "--requests", "30000"],
            ["--files", "500", "--requests", "3000", "--memory-mb", "16"]),
    "office": (["--documents", "30"], ["--documents", "6"]),
}
MODES = {"causal": ["--timing", "causal"], "original": [], "afap": ["--afap", "--qd", "32"]}


def fio_7030(device: str) -> float:
    """4 KiB random 70/30 at QD32 for 3 s: read + write IOPS."""
    out = subprocess.run(["fio", "--name=r7030", f"--filename={device}", "--rw=randrw", "--rwmixread=70",
                          "--bs=4k", "--iodepth=32", "--ioengine=io_uring", "--direct=1", "--runtime=3",
                          "--time_based", "--size=256M", "--output-format=json"],
                         capture_output=True, text=True, check=True).stdout
    job = json.loads(out)["jobs"][0]
    return job["read"]["iops"] + job["write"]["iops"]


def replay(*args, check=True):
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160"}
    print("$ replay " + " ".join(map(str, args)), flush=True)
    done = subprocess.run([*REPLAY, *map(str, args)], capture_output=True, text=True, cwd=REPO, env=env)
    if check and done.returncode != 0:
        raise SystemExit(f"replay {args[0]} failed ({done.returncode}): {done.stderr.strip()[-800:]}")
    return done


def trace_facts(path: Path) -> dict:
    """The application's elapsed time (recipe.outcome), the captured I/O's span, and where
    the application started and ended on the trace's clock when the capture says."""
    from traces.trace import open_trace, read_trace

    tf = open_trace(path)
    cols, meta = read_trace(path)
    ts, lat = cols["ts_ns"], cols["latency_ns"]
    done = ts + lat.clip(0)
    outcome = meta["recipe"].get("outcome") or {}
    elapsed = outcome.get("elapsed_s")
    io_span = (int(done.max()) - int(ts.min())) / 1e9
    sleeps = meta["source"].get("sleeps") or {"start_ns": [], "end_ns": []}
    facts = {"elapsed_s": elapsed, "io_span_s": io_span, "rows": tf.num_rows, "outcome": outcome,
             "sleeps": len(sleeps["start_ns"]),
             "slept_s": (sum(sleeps["end_ns"]) - sum(sleeps["start_ns"])) / 1e9}
    t0 = meta["source"].get("start_monotonic_ns")
    if t0 is not None and outcome.get("end_monotonic_ns") is not None:
        start, end = outcome["start_monotonic_ns"] - t0, outcome["end_monotonic_ns"] - t0
        before = np.flatnonzero(done <= end)
        # The application's end waits for the last I/O completed before it, then its own time.
        anchor = int(before[np.argmax(done[before])]) if len(before) else None
        facts.update(app_start_ns=start, app_end_ns=end, anchor=anchor,
                     tail_ns=None if anchor is None else end - int(done[anchor]), first_ts=int(ts[0]))
    return facts


def cpu_s(outcome: dict) -> str:
    """The workload's CPU time as its recipe recorded it (user + system), or "-"."""
    if outcome.get("cpu_user_s") is None:
        return "-"
    return f"{outcome['cpu_user_s'] + outcome['cpu_system_s']:.2f} s"


# A real run beside more other work than this (niced CPU time, as a share of the machine's CPU
# time over the run) is named under the table: it measured the machine more than the drive.
SHARED = 0.05


def shared(outcome: dict, cpus: int) -> bool:
    """Whether a real run shared the machine with other work (see SHARED)."""
    niced = outcome.get("niced_cpu_s")
    return niced is not None and niced > SHARED * outcome["elapsed_s"] * cpus


def other_work(outcome: dict) -> str:
    """How busy the machine was while the workload ran, as its recipe's timer recorded it:
    the CPU time of niced processes (other people's builds and tests on a shared machine) and
    the share of the run during which some runnable process waited for a CPU; "-" before the
    timer recorded them. A run beside other work is slower for its CPU, not for its drive."""
    if outcome.get("niced_cpu_s") is None:
        return "-"
    pressure = outcome.get("cpu_pressure")
    return (f"{outcome['niced_cpu_s']:.2f} CPU-s niced" +
            ("" if pressure is None else f", CPU pressure {100 * pressure:.0f} %"))


def other_sessions(n: int) -> list[subprocess.Popen]:
    """`n` CPU-bound processes at nice 19, each in a session of its own: other people's builds
    and tests on a shared machine. With the kernel's autogroup scheduling each such session
    weighs as much as any other, whatever the nice of its processes."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                             preexec_fn=lambda: os.nice(19)) for _ in range(n)]


def without_sleeps(trace: Path, into: Path) -> Path:
    """A copy of `trace` in `into` whose metadata has no recorded sleeps."""
    from traces.trace import read_trace, write_trace

    copy = into / f"{trace.stem}-no-sleeps.parquet"
    if not copy.exists():
        cols, meta = read_trace(trace)
        meta["source"]["sleeps"] = None
        write_trace(copy, cols, meta)
    return copy


def predict(facts: dict, results: Path) -> tuple[float, float]:
    """(the replay's span, the application's elapsed time it predicts), in s. With the
    application's start and end on the trace's clock, its end is placed after the replayed
    completion of the I/O that completed last before it, plus the same tail of its own time
    (the causal rule applied to the end); else the replay's span plus the time the
    application ran outside its I/O on the capturing drive."""
    from traces.trace import read_trace

    cols, meta = read_trace(results)
    ok = cols["complete_ns"] >= 0
    span = (int(cols["complete_ns"][ok].max()) - int(np.min(cols["issue_ns"][ok]))) / 1e9
    if facts.get("anchor") is None or meta.get("rows_done", len(ok)) != facts["rows"]:
        return span, facts["elapsed_s"] - facts["io_span_s"] + span
    # Replay time 0 is trace time 0 with original and causal timing; with afap it is the first I/O.
    offset = facts["first_ts"] - int(cols["intended_ns"][0]) if meta["run"]["mode"] == "afap" else 0
    end = int(cols["complete_ns"][facts["anchor"]]) + offset + facts["tail_ns"]
    return span, (end - facts["app_start_ns"]) / 1e9


def critical_path(trace: Path, results: Path, heuristic: str) -> dict:
    """What a causal replay's span is made of: the chain of I/Os, each released by the parent
    that completed last, back from the last completion; on it, the application's own time
    (think), the device time replayed and captured, and the replayer's own delay in issuing
    (lateness: its submission, which the capture counts inside the think time already)."""
    from analysis.causal import BARRIER, annotate, sleeps_of
    from traces.trace import read_trace

    cols, meta = read_trace(trace)
    res, _ = read_trace(results)
    ann = annotate(cols, heuristic, sleeps=sleeps_of(meta))
    rows = np.arange(len(cols["ts_ns"]))
    parents = [np.where(ann[k] > 0, rows - ann[k], -1) for k in ("parent", "parent2")]
    done = res["complete_ns"]
    path, i = [], int(np.argmax(done))
    while i >= 0:
        path.append(i)
        if ann["parent2"][i] == BARRIER:  # a flush after every earlier I/O
            i = int(np.argmax(done[:i])) if i else -1
        else:
            i = max((int(p[i]) for p in parents), key=lambda j: done[j] if j >= 0 else -1)
    path = np.array(path[::-1])
    flush = cols["op"][path] == 3
    replayed = done[path] - res["issue_ns"][path]
    captured = cols["latency_ns"][path].clip(0)
    return {"ios": len(path), "of": len(rows), "think_s": ann["think_ns"][path].sum() / 1e9,
            "device_s": replayed.sum() / 1e9, "captured_device_s": captured.sum() / 1e9,
            "flushes": int(flush.sum()), "flush_device_s": replayed[flush].sum() / 1e9,
            "captured_flush_device_s": captured[flush].sum() / 1e9,
            "late_s": (res["issue_ns"][path] - res["intended_ns"][path]).sum() / 1e9}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller fixed work")
    p.add_argument("--repeat", type=int, default=2, help="real runs per workload and drive (the noise)")
    p.add_argument("--workloads", default="filecopy,blob,oltp",
                   help="recipes to run, comma-separated, or all: " + ",".join(WORKLOADS) +
                        " (boot needs its image built once: several minutes)")
    p.add_argument("--modes", default="causal,original,afap")
    p.add_argument("--heuristics", default="hybrid,chains,recent", help="causal heuristics to compare")
    p.add_argument("--without-sleeps", action="store_true",
                   help="also replay each capture causally as if its sleeps had not been recorded "
                        "(mode causal:HEURISTIC/no-sleeps): what they change")
    p.add_argument("--beside", type=int, default=0, metavar="N",
                   help="run the applications for real beside N CPU-bound processes at nice 19, each in a "
                        "session of its own (other people's work on a shared machine): what it does to the "
                        "ground truth; the replays run without them")
    p.add_argument("--size", type=int, default=2048, help="MiB per drive")
    p.add_argument("--riops", type=int, default=4000)
    p.add_argument("--wiops", type=int, default=4000)
    p.add_argument("--bps", type=int, default=64, help="slow drive's MiB/s, each way")
    p.add_argument("--dir", type=Path, help="keep captures and results here (and reuse them)")
    p.add_argument("--capture-only", action="store_true", help="run the applications, replay nothing")
    p.add_argument("--json", action="store_true", help="print the results as JSON instead of a table")
    a = p.parse_args(argv)
    workloads = list(WORKLOADS) if a.workloads == "all" else [w for w in a.workloads.split(",") if w]
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown:
        p.error(f"no fixed work for {', '.join(unknown)}; the workloads are: {', '.join(WORKLOADS)}")

    def stop(signum, frame):
        raise KeyboardInterrupt  # so the drives and the throttle are removed on SIGTERM too

    signal.signal(signal.SIGTERM, stop)
    work = a.dir or Path(tempfile.mkdtemp(prefix="tracereplay-causal-"))
    work.mkdir(parents=True, exist_ok=True)
    heuristics = [h for h in a.heuristics.split(",") if h]
    size = a.size * MIB
    table = []
    with targets.shm_loop_device(size=size, span=64 * MIB) as fast, \
            targets.loop_device(size=size, span=64 * MIB) as lower, \
            targets.root_throttle(lower, a.riops, a.wiops, a.bps * MIB) as limits, \
            targets.stacked_loop(lower) as slow:
        drives = {"fast": fast, "slow": slow}
        print(f"fast drive: {fast} (loop over /dev/shm)")
        print(f"slow drive: {slow} (loop over {lower}, a loop over /var/tmp throttled in the root "
              f"blkio cgroup: {limits})")
        iops = {name: fio_7030(dev) for name, dev in drives.items()}
        print(f"70/30 QD32: fast {iops['fast']:,.0f} IOPS, slow {iops['slow']:,.0f} IOPS: "
              f"{iops['fast'] / iops['slow']:.1f}x", flush=True)
        facts = {}
        beside = other_sessions(a.beside)
        try:
            for w in workloads:
                knobs = WORKLOADS[w][1 if a.quick else 0]
                for name, dev in drives.items():
                    for r in range(a.repeat):
                        out = work / "captures" / f"{w}-{name}-{r}.parquet"
                        out.parent.mkdir(exist_ok=True)
                        for attempt in range(3):  # a recipe's set-up step fails now and then (umount: busy)
                            if out.exists():
                                break
                            done = replay("capture", "recipe", w, dev, "-o", out, "--destroy-data", *knobs,
                                          check=attempt == 2)
                            if done.returncode:
                                print(f"  failed, again: {done.stderr.strip()[-300:]}", flush=True)
                        facts[w, name, r] = trace_facts(out)
                        f = facts[w, name, r]
                        print(f"  {w} on {name} #{r}: {f['elapsed_s']:.2f} s, {f['rows']} I/Os over "
                              f"{f['io_span_s']:.2f} s, {f['sleeps']} sleeps ({f['slept_s']:.2f} s), "
                              f"CPU {cpu_s(f['outcome'])}; other work: {other_work(f['outcome'])}", flush=True)
        finally:  # never left running, whatever ends the runs
            for hog in beside:
                hog.kill()
                hog.wait()
        if a.capture_only:
            return
        for w in workloads:
            for src, dst in (("fast", "slow"), ("slow", "fast"), ("fast", "fast"), ("slow", "slow")):
                trace = work / "captures" / f"{w}-{src}-0.parquet"
                reals = [facts[w, dst, r]["elapsed_s"] for r in range(a.repeat)]
                real = statistics.mean(reals)
                runs = [(m, None) for m in a.modes.split(",") if m and m != "causal"]
                if "causal" in a.modes.split(","):
                    runs = [("causal", h) for h in heuristics] + runs
                    if a.without_sleeps:
                        runs += [("causal", f"{h}/no-sleeps") for h in heuristics]
                if src == dst:
                    runs = [r for r in runs if r[0] == "causal"]
                for mode, heuristic in runs:
                    label = mode if heuristic is None else f"{mode}:{heuristic}"
                    res = work / "replays" / f"{w}-{src}-on-{dst}-{label.replace(':', '-').replace('/', '-')}.parquet"
                    res.parent.mkdir(exist_ok=True)
                    replayed = without_sleeps(trace, res.parent) if label.endswith("/no-sleeps") else trace
                    heuristic = heuristic and heuristic.removesuffix("/no-sleeps")
                    if not res.exists():
                        extra = ["--heuristic", heuristic] if heuristic else []
                        replay("run", replayed, drives[dst], *MODES[mode], *extra, "--remap", "wrap",
                               "--destroy-data", "-o", res)
                    span, predicted = predict(facts[w, src, 0], res)
                    noise = (max(reals) - min(reals)) / real if len(reals) > 1 else None
                    table.append({"workload": w, "captured": src, "replayed": dst, "mode": label,
                                  "replay_span_s": span, "predicted_s": predicted,
                                  "real_s": real, "real_runs_s": reals, "noise": noise,
                                  "error": (predicted - real) / real,
                                  "critical_path": critical_path(replayed, res, heuristic) if heuristic else None})
    doc = json.dumps({"iops_7030_qd32": iops, "limits": limits, "rows": table}, indent=2)
    (work / "ground_truth.json").write_text(doc)
    if a.json:
        print(doc)
        return
    print()
    width = max([15] + [len(row["mode"]) for row in table])
    print(f"{'workload':<9} {'direction':<13} {'mode':<{width}} {'predicted':>9} {'real':>8} {'error':>7}  noise")
    for row in table:
        noise = "-" if row["noise"] is None else f"{100 * row['noise']:.0f}%"
        print(f"{row['workload']:<9} {row['captured'] + ' -> ' + row['replayed']:<13} {row['mode']:<{width}} "
              f"{row['predicted_s']:>8.2f}s {row['real_s']:>7.2f}s {100 * row['error']:>+6.0f}%  {noise}")
    print()
    print("causal replays' critical paths (s): the application's own time, the device time replayed "
          "(captured), flushes' part of it, and the replayer's lateness")
    for row in table:
        c = row["critical_path"]
        if c is None or not row["mode"].endswith(":hybrid"):
            continue
        print(f"{row['workload']:<9} {row['captured'] + ' -> ' + row['replayed']:<13} {c['ios']:>6,} of "
              f"{c['of']:>6,} I/Os  think {c['think_s']:6.3f}  device {c['device_s']:6.3f} "
              f"({c['captured_device_s']:6.3f})  {c['flushes']:>5,} flushes {c['flush_device_s']:6.3f} "
              f"({c['captured_flush_device_s']:6.3f})  late {c['late_s']:6.3f}")
    cross = [r for r in table if r["captured"] != r["replayed"]]
    busy = [f"{w} on {name} #{r} ({other_work(f['outcome'])})" for (w, name, r), f in facts.items()
            if shared(f["outcome"], os.cpu_count() or 1)]
    if busy:
        print(f"\nreal runs beside other work (niced CPU over {100 * SHARED:.0f} % of the machine's; "
              "their times are the machine's as much as the drive's): " + "; ".join(busy))
    print()
    for mode in dict.fromkeys(r["mode"] for r in cross):
        errs = [abs(r["error"]) for r in cross if r["mode"] == mode]
        print(f"mean |error| {mode:<{width}} {100 * statistics.mean(errs):5.1f}%  (max {100 * max(errs):.0f}%)")
    print(f"results in {work / 'ground_truth.json'}")


if __name__ == "__main__":
    main()
