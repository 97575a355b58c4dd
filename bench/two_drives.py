"""Two drives on one machine, end to end: a fast loop device over /dev/shm and a slow one over the
local disk throttled by a private block cgroup; `replay bench mix` (or, where it is missing, a
70/30 QD32 replay of a generated trace) and the bundled real traces on each (by default with
causal timing, so each one's time to finish is the application's predicted run time; --timed
and --afap replay others with their own timing or as fast as possible), then `replay verdict`
and `replay report`. Prints the verdict; removes the devices, files and cgroup however it ends.

    python bench/two_drives.py [--quick] [--json PATH] [--riops 2000] [--keep DIR]
        [--causal oltp,blob,boot,filecopy] [--timed T,...] [--afap T,...]

--json PATH writes the drives' limits and the verdict (`replay verdict --json`) to PATH.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from bench import targets  # noqa: E402

MIB = 1 << 20
REPLAY = [sys.executable, "-c", "from replay.cli import main; main()"]


def _replay(args, throttle=None, check=True):
    """Run `replay ARGS`, inside the throttle's cgroup when given; returns stdout."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "160"}
    extra = throttle.popen_kwargs() if throttle else {}
    print("$ replay " + " ".join(map(str, args)) + ("   # in the throttled cgroup" if throttle else ""),
          flush=True)
    done = subprocess.run([*REPLAY, *map(str, args)], capture_output=True, text=True, cwd=REPO,
                          env=env, **extra)
    if check and done.returncode != 0:
        raise SystemExit(f"replay {args[0]} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def _has_bench() -> bool:
    return _replay(["bench", "--help"], check=False).returncode == 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller drives and shorter mix points")
    p.add_argument("--size", type=int, default=512, help="MiB per drive (default 512)")
    p.add_argument("--riops", type=int, default=2000, help="slow drive's read IOPS limit")
    p.add_argument("--wiops", type=int, default=2000, help="slow drive's write IOPS limit")
    p.add_argument("--bps", type=int, default=64, help="slow drive's MiB/s limit, each direction")
    p.add_argument("--keep", type=Path, help="keep the results and the report in this directory")
    p.add_argument("--json", metavar="PATH", type=Path, help="also write the limits and the verdict as JSON to PATH")
    p.add_argument("--causal", default="oltp,blob,boot,filecopy",
                   help="traces replayed with causal timing, scored on the application's time to "
                        "finish (comma-separated; default all four bundled captures)")
    p.add_argument("--timed", default="", help="traces replayed with their own timing")
    p.add_argument("--afap", default="",
                   help="traces replayed as fast as possible at QD32, scored on time to finish")
    a = p.parse_args(argv)
    modes = {"causal": ["--timing", "causal"], "timed": [], "afap": ["--afap"]}
    runs = [(t, modes[m]) for m in modes for t in getattr(a, m).split(",") if t]
    names = [t for t, _ in runs]
    if len(set(names)) < len(names):
        p.error("a trace can be replayed in one mode only: the verdict matches results by trace name")
    size = (256 if a.quick else a.size) * MIB
    work = a.keep or Path(tempfile.mkdtemp(prefix="tracereplay-two-drives-"))
    work.mkdir(parents=True, exist_ok=True)
    bench = _has_bench()
    with targets.drive_pair(size, riops=a.riops, wiops=a.wiops, rbps=a.bps * MIB,
                            wbps=a.bps * MIB) as (fast, slow, throttle):
        print(f"fast drive: {fast} (loop over /dev/shm)")
        print(f"slow drive: {slow} (loop over /var/tmp, {throttle.kind}: {throttle.limits})")
        pair = (("slow", slow, throttle), ("fast", fast, None))
        for name, dev, th in pair if bench else ():
            done = _replay(["bench", "mix", dev, "-o", work / f"{name}-mix", "--duration",
                            "0.5" if a.quick else "1", "--span", str(size), "--destroy-data"], th,
                           check=False)
            if done.returncode != 0:
                last = done.stderr.strip().splitlines()[-1:] or ["(no message)"]
                print(f"replay bench mix failed on {dev}: {last[0]}\n"
                      "using a 70/30 QD32 replay of a generated trace on both drives instead")
                bench = False
                break
        if not bench:
            from synth.generators import random_mix, to_trace
            mix = to_trace(random_mix(block_size=4096, read_share=0.7, span=size, span_start=0,
                                      count=20_000 if a.quick else 60_000, queue_depth=32, seed=0),
                           work / "r70-qd32.parquet")
            for name, dev, th in pair:
                _replay(["run", mix, dev, "--afap", "--qd", "32", "--destroy-data",
                         "-o", work / f"{name}-mix.parquet"], th)
        for name, dev, th in pair:
            (work / name).mkdir(exist_ok=True)
            for trace, mode in runs:
                # The traces span up to 9 GB of their capture devices: wrapped onto the drive.
                _replay(["run", trace, dev, *mode, "--remap", "wrap", "--destroy-data",
                         "-o", work / name / f"{trace}.parquet"], th)
    synth = "mix" if bench else "mix.parquet"
    verdict_args = ["verdict", "--synthetic-a", work / f"slow-{synth}", "--synthetic-b",
                    work / f"fast-{synth}", "--traces-a", work / "slow", "--traces-b",
                    work / "fast", "--label-a", "slow", "--label-b", "fast"]
    print(_replay(verdict_args).stdout)
    if a.json:
        a.json.write_text(json.dumps({
            "size_bytes": size, "slow_limits": {"riops": a.riops, "wiops": a.wiops, "mib_per_s": a.bps},
            "bench_mix": bench, "causal": a.causal, "timed": a.timed, "afap": a.afap,
            "verdict": json.loads(_replay([*verdict_args, "--json"]).stdout)}, indent=2) + "\n")
        print(f"figures written to {a.json}")
    inputs = [work / f"{side}-{synth}" for side in ("slow", "fast")]
    inputs += [work / side / f"{trace}.parquet" for side in ("slow", "fast") for trace, _ in runs]
    labels = ["slow", "fast"] + ["slow"] * len(runs) + ["fast"] * len(runs)
    _replay(["report", *inputs, *(x for label in labels for x in ("--label", label)),
             "-o", work / "report.html"])
    if a.keep:
        print(f"results and report kept in {work}")
    else:
        subprocess.run(["rm", "-rf", "--", str(work)], check=False)


if __name__ == "__main__":
    main()
