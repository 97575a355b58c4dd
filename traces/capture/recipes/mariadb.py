"""Recipe `mariadb`: Debian's MariaDB (InnoDB) with sysbench's oltp_read_write, captured on
DEVICE.

A private server (mariadb-install-db, mariadbd on a socket in a private directory,
--skip-networking, so no TCP at all) keeps its data on the filesystem on DEVICE. sysbench
prepares tables larger than the memory cgroup, the server stops, the filesystem is
remounted so the load starts cold, then the server restarts inside the cgroup and only
sysbench's fixed number of transactions is captured.
"""
import re
import subprocess
import time
from pathlib import Path

from traces.capture.recipes import timed
from traces.capture.recipes.common import (GIB, MIB, RecipeError, Session, parse_knobs, require, stop_process,
                                           version_of)
from traces.capture.recipes.common import run as sh

DESCRIPTION = ("MariaDB (InnoDB) with sysbench's oltp_read_write: 16 KiB random page reads and writes, "
               "the redo log's sequential writes and flushes on every commit, and background "
               "flushing of dirty pages.")

KNOBS = {
    "events": (int, 20_000, "Fixed work: this many sysbench transactions (20 queries each with BEGIN and "
                          "COMMIT), shared by the threads; the run takes as long as the drive makes it."),
    "threads": (int, 8, "sysbench threads (concurrent client sessions)."),
    "tables": (int, 4, "sysbench tables."),
    "table_size": (int, 250_000, "Rows per table, about 240 bytes each with the indexes; keep the whole "
                                 "above the memory limit."),
    "seed": (int, 1, "sysbench --rand-seed."),
    "memory_mb": (int, 256, "Memory cgroup limit for the server and sysbench, MiB (the buffer pool and "
                            "page cache count)."),
    "buffer_pool_mb": (int, 64, "InnoDB buffer pool, MiB."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}
# mariadb-install-db runs my_print_defaults, which the client package ships.
TOOLS = {"mariadbd": "mariadb-server-core", "mariadb-install-db": "mariadb-server-core",
         "my_print_defaults": "mariadb-client-core", "sysbench": "sysbench"}
_READY = "ready for connections"
_STOP_S = 120


class Server:
    """One mariadbd of ours, started by pid and stopped by pid (SIGTERM: a clean shutdown)."""

    def __init__(self, command: list, log: Path):
        self.log = log
        self.proc = subprocess.Popen([str(c) for c in command], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + _STOP_S
        while _READY not in self._log_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = " | ".join(self._log_text().strip().splitlines()[-3:])
                raise RecipeError(f"mariadbd did not start (its log: {tail})")
            time.sleep(0.1)

    def _log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.proc, _STOP_S)


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    require(TOOLS, notices)
    with Session("mariadb", knobs, notices) as s:
        table_bytes = knobs["tables"] * knobs["table_size"] * 240
        dev = s.device(device, destroy_data=destroy_data, scratch_size=max(2 * GIB, 3 * table_bytes + GIB))
        mnt = s.filesystem(dev, knobs["fs"])
        data, sock, log = mnt / "mariadb", s.tmpdir / "mariadb.sock", s.tmpdir / "mariadb.log"
        init = s.tmpdir / "init.sql"
        init.write_text("CREATE DATABASE IF NOT EXISTS sbtest;\n")
        s.provenance["applications"] = {"mariadbd": version_of("mariadbd", "--version"),
                                        "sysbench": version_of("sysbench", "--version")}
        sh(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root", "--skip-test-db"],
           what="mariadb-install-db")
        # MariaDB's defaults otherwise (O_DIRECT data files, a flush of the redo log per commit).
        settings = [f"--innodb-buffer-pool-size={knobs['buffer_pool_mb']}M"]
        server = ["mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={sock}", "--skip-networking",
                  "--user=root", f"--log-error={log}", f"--pid-file={s.tmpdir / 'mariadb.pid'}", *settings]
        s.provenance["server_options"] = ["--skip-networking", *settings]
        sysbench = ["sysbench", "oltp_read_write", f"--mysql-socket={sock}", "--mysql-user=root",
                    "--mysql-db=sbtest", f"--tables={knobs['tables']}", f"--table-size={knobs['table_size']}"]
        first = Server([*server, f"--init-file={init}"], log)
        s.defer(first.stop)
        sh([*sysbench, f"--threads={min(knobs['tables'], 2)}", "prepare"], what="sysbench prepare")
        first.stop()
        s.remount()
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        log.write_text("")  # the restarted server's readiness, not the first one's
        second = Server(cgroup.wrap(server), log)
        s.defer(second.stop)  # before the cgroup's removal ends what is left
        load = [*sysbench, f"--threads={knobs['threads']}", f"--events={knobs['events']}", "--time=0",
                f"--rand-seed={knobs['seed']}", "run"]
        s.provenance["workload"] = "sysbench " + " ".join(load[1:]).replace(str(sock), "SOCKET")
        outcome_file = s.tmpdir / "outcome.json"

        def describe(result):
            s.provenance["outcome"] = outcome(timed.read(outcome_file))
            return (f"{DESCRIPTION} {knobs['events']} transactions by {knobs['threads']} threads over "
                    f"{knobs['tables']} tables of {knobs['table_size']} rows, buffer pool {knobs['buffer_pool_mb']} "
                    f"MiB, memory limited to {knobs['memory_mb']} MiB, {knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(load)), backend=backend,
                         description=describe, on_start=on_start)


def outcome(recorded: dict) -> dict:
    """The application's own outcome from sysbench's report: transactions, their rate, queries,
    and the latency per transaction as sysbench gives them."""
    text = recorded.get("output", "")

    def number(pattern):
        found = re.search(pattern, text)
        return float(found.group(1)) if found else None

    transactions, queries = number(r"transactions:\s+(\d+)"), number(r"queries:\s+(\d+)")
    return timed.outcome(recorded, transactions=None if transactions is None else int(transactions),
                         tps=number(r"transactions:\s+\d+\s+\(([\d.]+) per sec"),
                         queries=None if queries is None else int(queries),
                         # A deadlock rolls a transaction back and sysbench runs it again: its
                         # queries count twice.
                         ignored_errors=int(number(r"ignored errors:\s+(\d+)") or 0),
                         latency_ms={k: number(rf"{k}:\s+([\d.]+)") for k in ("avg", "95th percentile", "max")},
                         unit="transactions", reported_by="sysbench")
