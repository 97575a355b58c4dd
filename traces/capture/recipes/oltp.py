"""Recipe `oltp`: Debian's PostgreSQL with pgbench's TPC-B-like load, captured on DEVICE.

A private cluster (initdb, pg_ctl, a socket in a private directory, no TCP) lives on the
filesystem on DEVICE. pgbench -i fills it at a scale larger than the memory cgroup, the
filesystem is remounted so the load starts cold, then the server restarts inside the
cgroup and only the pgbench run is captured, with a checkpoint_timeout short enough that
a checkpoint falls inside the window.
"""
import glob
import os
import re
import shutil
from pathlib import Path

from traces.capture.recipes.common import GIB, MIB, RecipeError, Session, parse_knobs, require, version_of
from traces.capture.recipes.common import run as sh
from traces.capture.recipes import timed

DESCRIPTION = ("PostgreSQL with pgbench's TPC-B-like load: 8 KiB random reads and writes of the "
               "tables, the WAL's sequential writes and flushes, and a checkpoint.")

KNOBS = {
    "duration": (float, 40.0, "Seconds of pgbench load to capture."),
    "transactions": (int, None, "Fixed work instead of --duration: this many transactions per client "
                                "(pgbench -t), with --seed; the run takes as long as the drive makes it."),
    "seed": (int, 1, "pgbench --random-seed (with --transactions)."),
    "clients": (int, 8, "pgbench clients (concurrent database sessions)."),
    "scale": (int, 40, "pgbench scale factor: about 15 MiB of tables per unit; keep it above the memory limit."),
    "memory_mb": (int, 256, "Memory cgroup limit for the server and pgbench, MiB (shared buffers and page cache count)."),
    "shared_buffers_mb": (int, 64, "PostgreSQL shared_buffers, MiB."),
    "checkpoint_timeout": (int, 30, "PostgreSQL checkpoint_timeout, seconds (30 is its minimum)."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}

_USER = "postgres"


def _bindir(notices) -> Path:
    """The newest /usr/lib/postgresql/N/bin holding initdb, pg_ctl and pgbench."""
    def find():
        dirs = [Path(d) for d in glob.glob("/usr/lib/postgresql/*/bin")
                if all((Path(d) / t).exists() for t in ("initdb", "pg_ctl", "pgbench", "postgres"))]
        return max(dirs, key=lambda d: int(d.parent.name) if d.parent.name.isdigit() else 0, default=None)

    found = find()
    if found is None:
        require({"pg_ctlcluster": "postgresql"}, notices)
        found = find()
    if found is None:
        raise RecipeError("PostgreSQL's initdb, pg_ctl and pgbench were not found under "
                          "/usr/lib/postgresql/*/bin; install the Debian package postgresql")
    try:
        import pwd
        pwd.getpwnam(_USER)
    except KeyError:
        raise RecipeError("there is no postgres user; install the Debian package postgresql") from None
    return found


def _as_postgres(command) -> list[str]:
    return ["setpriv", f"--reuid={_USER}", f"--regid={_USER}", "--init-groups", *map(str, command)]


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    require({"setpriv": "util-linux"}, notices)
    bindir = _bindir(notices)
    with Session("oltp", knobs, notices) as s:
        table_bytes = knobs["scale"] * 16 * MIB
        dev = s.device(device, destroy_data=destroy_data, scratch_size=max(2 * GIB, 3 * table_bytes + GIB))
        mnt = s.filesystem(dev, knobs["fs"])
        os.chmod(s.tmpdir, 0o755)  # the postgres user reaches its socket and log through it
        data = mnt / "pgdata"
        sock = s.tmpdir / "sock"
        log = s.tmpdir / "postgres.log"
        for d in (data, sock):
            d.mkdir()
            shutil.chown(d, _USER, _USER)
        log.touch()
        shutil.chown(log, _USER, _USER)
        s.provenance["applications"] = {"postgres": version_of(bindir / "postgres", "--version"),
                                        "pgbench": version_of(bindir / "pgbench", "--version")}
        sh(_as_postgres([bindir / "initdb", "-D", data, "-A", "trust", "-U", _USER, "-E", "UTF8"]),
            what="initdb")
        settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{sock}'",
            "shared_buffers": f"'{knobs['shared_buffers_mb']}MB'",
            "checkpoint_timeout": f"'{knobs['checkpoint_timeout']}s'",
            "max_wal_size": "'4GB'",  # checkpoints come from the timeout, not from WAL volume
            "max_connections": str(max(20, knobs["clients"] + 5)),
            "autovacuum": "off",  # its I/O would come and go at random in the window
        }
        with open(data / "postgresql.conf", "a") as conf:
            conf.write("\n# tracereplay recipe oltp\n")
            conf.writelines(f"{k} = {v}\n" for k, v in settings.items())
        s.provenance["postgresql_conf"] = {**settings, "unix_socket_directories": "'SOCKDIR'"}
        pg_ctl = [bindir / "pg_ctl", "-D", data, "-l", log, "-w", "-t", "120"]

        def stop_postgres():
            if (data / "postmaster.pid").exists():
                sh(_as_postgres([*pg_ctl, "stop", "-m", "fast"]), what="pg_ctl stop")

        s.defer(stop_postgres)
        sh(_as_postgres([*pg_ctl, "start"]), what="pg_ctl start (see the server log)")
        client = ["-h", sock, "-U", _USER]
        sh(_as_postgres([bindir / "pgbench", "-i", "-q", "-s", knobs["scale"], *client, "postgres"]),
            what="pgbench -i")
        sh(_as_postgres([*pg_ctl, "stop", "-m", "fast"]), what="pg_ctl stop")
        s.remount()
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        s.defer(stop_postgres)  # before the cgroup's removal ends what is left
        sh(cgroup.wrap(_as_postgres([*pg_ctl, "start"])), what="pg_ctl start (see the server log)")
        fixed = knobs["transactions"] is not None
        work = (["-t", knobs["transactions"], f"--random-seed={knobs['seed']}"] if fixed
                else ["-T", max(1, round(knobs["duration"]))])
        bench = [bindir / "pgbench", "-n", "-c", knobs["clients"], "-j", min(knobs["clients"], os.cpu_count() or 1),
                 *work, *client, "postgres"]
        s.provenance["workload"] = "pgbench " + " ".join(map(str, bench[1:])).replace(str(sock), "SOCKDIR")
        outcome_file = s.tmpdir / "outcome.json"
        length = (f"{knobs['transactions']} transactions per client (seed {knobs['seed']})" if fixed
                  else f"{knobs['duration']:g} s")

        def describe(result):
            s.provenance["outcome"] = outcome(timed.read(outcome_file))
            return (f"{DESCRIPTION} {knobs['clients']} clients, scale {knobs['scale']}, {length}, memory "
                    f"limited to {knobs['memory_mb']} MiB, {knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(_as_postgres(bench))),
                         backend=backend, description=describe, on_start=on_start)


def outcome(recorded: dict) -> dict:
    """The application's own outcome from pgbench's report: elapsed time, transactions,
    transactions per second and average latency as pgbench gives them."""
    text = recorded.get("output", "")

    def number(pattern):
        m = re.search(pattern, text)
        return float(m.group(1)) if m else None

    processed = number(r"number of transactions actually processed: (\d+)")
    return timed.outcome(recorded, transactions=None if processed is None else int(processed),
                         tps=number(r"tps = ([\d.]+)"), latency_ms=number(r"latency average = ([\d.]+) ms"),
                         unit="transactions", reported_by="pgbench")

