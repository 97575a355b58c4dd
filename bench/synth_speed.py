"""Generation speed and memory of synth's generators: I/Os per CPU second, one core, and the
peak RSS of consuming a one-hour QD32 closed-loop 4 KiB random-write generator in chunks.

How to read it: "M IO/s" is rows generated per second of this process's CPU time (numpy and
Numba run on one thread here), after a warm-up that compiles the kernels. The goal is well
above the engine's fastest rate (~0.5 M IOPS on zram), so generation is never the bottleneck.
"peak RSS" is ru_maxrss after iterating the whole hour, measured first in a fresh process (the
chunks are dropped as they come, nothing is written); "after imports" is the RSS just before
it (numpy, pyarrow, numba loaded); their gap is what generation holds, kernel compilation
included.
"""
import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from synth.generators import (  # noqa: E402
    act_load, precondition, random_mix, sequential_mix,
)

GIB = 1 << 30


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """Current resident set size (ru_maxrss is a peak, so it cannot give the 'before')."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1 << 20)


def consume(gen, rows):
    """Iterate every chunk; returns (rows, CPU seconds)."""
    n = 0
    cpu = time.process_time()
    for chunk in gen.chunks(rows):
        n += len(chunk["ts_ns"])
    return n, time.process_time() - cpu


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    p.add_argument("--iops", type=float, default=500_000,
                   help="IOPS the one-hour closed-loop run is sized for (default 500k: 1.8 G I/Os)")
    p.add_argument("--json", help="also write the figures as JSON to this path")
    args = p.parse_args()
    n = 2_000_000 if args.quick else 20_000_000
    cases = {
        "random 4K 70/30 uniform, closed": lambda: random_mix(count=n, span=16 * GIB, seed=1),
        "random 4K 70/30 zipf:1.2, closed": lambda: random_mix(count=n, span=16 * GIB, distribution="zipf:1.2", seed=1),
        "random 4K 70/30 hotcold:90/10, poisson": lambda: random_mix(count=n, span=16 * GIB, rate=5e5, distribution="hotcold:90/10", seed=1),
        "random size mix + 50 % sequential (fitted shape)": lambda: random_mix(count=n, span=16 * GIB, block_size={4096: 0.6, 8192: 0.3, 65536: 0.1}, sequential_share=0.5, seed=1),
        "sequential 128K, 4 streams": lambda: sequential_mix(count=n, span=16 * GIB, streams=4, seed=1),
        "precondition fill + random writes": lambda: precondition(span=16 * GIB, random_writes=n - 16 * GIB // (128 << 10), seed=1),
        "ACT-like 150x (poisson)": lambda: act_load(multiple=150, span=16 * GIB, duration_s=n / 309_000, seed=1),
    }
    figures = {"rows_per_case": n, "cases": {}}
    hour = int(3600 * args.iops) if not args.quick else int(60 * args.iops)
    before = rss_mb()
    wall = time.perf_counter()
    gen = random_mix(block_size=4096, read_share=0.0, span=16 * GIB, count=hour, queue_depth=32, seed=1)
    rows, cpu = consume(gen, 1 << 16)
    wall = time.perf_counter() - wall
    peak = peak_rss_mb()
    label = "one hour" if not args.quick else "one minute (quick)"
    print(f"{label} QD32 closed-loop 4K random writes at {args.iops:,.0f} IOPS: {rows:,} rows")
    print(f"  {cpu:.1f} CPU s, {wall:.1f} s wall, {rows / cpu / 1e6:.1f} M IO/s per core")
    print(f"  RSS after imports {before:.0f} MB, peak {peak:.0f} MB")
    figures["hour"] = {"rows": rows, "cpu_s": cpu, "wall_s": wall, "rss_after_imports_mb": before,
                       "peak_rss_mb": peak, "iops": args.iops, "quick": args.quick}
    # Warm-up: compile (or load cached) kernels outside the timing.
    for make in cases.values():
        for _ in make().chunks(1 << 16):
            break
    print(f"\n{'generator':52} {'rows':>12} {'CPU s':>7} {'M IO/s':>7}")
    for name, make in cases.items():
        rows, cpu = consume(make(), 1 << 16)
        rate = rows / cpu / 1e6
        figures["cases"][name] = {"rows": rows, "cpu_s": cpu, "mio_per_cpu_s": rate}
        print(f"{name:52} {rows:12,} {cpu:7.2f} {rate:7.1f}")

    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
