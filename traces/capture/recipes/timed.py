"""Runs a recipe's workload and records its own outcome: start and end on the monotonic clock,
elapsed time, the CPU time of the command and its children (user and system), exit status and
the tail of what it printed, as JSON, for the trace's metadata. And how busy the machine was
meanwhile: the CPU time of niced processes (`niced_cpu_s`: on a shared machine, other
people's builds and tests) and the share of the run during which some runnable process waited
for a CPU (`cpu_pressure`, the kernel's PSI; None without it), so a run slowed by other work
can be told from one slowed by its drive.

    python -m traces.capture.recipes.timed OUTCOME.json -- COMMAND ...

The command's output goes to OUTCOME.json.out (recipes parse the application's own figures
from it: pgbench's tps and latency, the BLOB store's operations). Exits with its status.
"""
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path


def wrap(outcome: Path, command: list) -> list[str]:
    """`command` run under this timer, its outcome written to `outcome`."""
    return [sys.executable, "-m", __name__, str(outcome), "--", *map(str, command)]


def read(outcome: Path) -> dict:
    """The recorded outcome with the command's output as `output` ({} if it never ran)."""
    try:
        result = json.loads(Path(outcome).read_text())
    except (OSError, ValueError):
        return {}
    try:
        result["output"] = Path(f"{outcome}.out").read_text(errors="replace")
    except OSError:
        result["output"] = ""
    return result


def outcome(recorded: dict, **figures) -> dict:
    """The timer's part of a recipe's `outcome` (elapsed time, status, start and end on the
    monotonic clock, CPU time) with the application's own `figures` added."""
    kept = ("elapsed_s", "status", "start_monotonic_ns", "end_monotonic_ns", "cpu_user_s", "cpu_system_s",
            "niced_cpu_s", "cpu_pressure")
    return {**{k: recorded.get(k) for k in kept}, **figures}


def machine_cpu() -> tuple[int, int | None]:
    """(CPU time of niced processes so far, ns: /proc/stat's nice column; time some runnable
    process waited for a CPU so far, ns: /proc/pressure/cpu, None without PSI)."""
    with open("/proc/stat") as f:
        niced = int(f.readline().split()[2]) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
    try:
        with open("/proc/pressure/cpu") as f:
            waited = int(f.readline().rsplit("total=", 1)[1]) * 1000
    except (OSError, ValueError, IndexError):
        waited = None
    return niced, waited


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m traces.capture.recipes.timed OUTCOME.json -- COMMAND ...", file=sys.stderr)
        return 2
    outcome, command = Path(argv[0]), argv[2:]
    with open(f"{outcome}.out", "w") as out:
        niced0, waited0 = machine_cpu()
        start = time.monotonic_ns()
        try:
            status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
        except KeyboardInterrupt:
            status = 130
        end = time.monotonic_ns()
        niced1, waited1 = machine_cpu()
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)  # every descendant waited for
    outcome.write_text(json.dumps({"start_monotonic_ns": start, "end_monotonic_ns": end,
                                   "elapsed_s": (end - start) / 1e9, "status": status,
                                   "cpu_user_s": cpu.ru_utime, "cpu_system_s": cpu.ru_stime,
                                   "niced_cpu_s": (niced1 - niced0) / 1e9,
                                   "cpu_pressure": None if waited0 is None or waited1 is None
                                   else min((waited1 - waited0) / max(end - start, 1), 1.0)}))
    return status


if __name__ == "__main__":
    sys.exit(main())
