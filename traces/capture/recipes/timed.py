"""Runs a recipe's workload and records its own outcome: start and end on the monotonic clock,
elapsed time, the CPU time of the command and its children (user and system), exit status and
the tail of what it printed, as JSON, for the trace's metadata.

    python -m traces.capture.recipes.timed OUTCOME.json -- COMMAND ...

The command's output goes to OUTCOME.json.out (recipes parse the application's own figures
from it: pgbench's tps and latency, the BLOB store's operations). Exits with its status.
"""
import json
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
    kept = ("elapsed_s", "status", "start_monotonic_ns", "end_monotonic_ns", "cpu_user_s", "cpu_system_s")
    return {**{k: recorded.get(k) for k in kept}, **figures}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m traces.capture.recipes.timed OUTCOME.json -- COMMAND ...", file=sys.stderr)
        return 2
    outcome, command = Path(argv[0]), argv[2:]
    with open(f"{outcome}.out", "w") as out:
        start = time.monotonic_ns()
        try:
            status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
        except KeyboardInterrupt:
            status = 130
        end = time.monotonic_ns()
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)  # every descendant waited for
    outcome.write_text(json.dumps({"start_monotonic_ns": start, "end_monotonic_ns": end,
                                   "elapsed_s": (end - start) / 1e9, "status": status,
                                   "cpu_user_s": cpu.ru_utime, "cpu_system_s": cpu.ru_stime}))
    return status


if __name__ == "__main__":
    sys.exit(main())
