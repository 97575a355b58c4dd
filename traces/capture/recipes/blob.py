"""Recipe `blob`: a SharePoint-like document store (files for the bodies, SQLite for the
index), populated first, then its mixed GET/PUT/DELETE phase captured on DEVICE.

The load runs as its own process (`python -m traces.capture.recipes.blob_load`) inside the
memory cgroup, so reads of blobs that are not hot reach the device.
"""
import json
import sqlite3
import sys

from traces.capture.recipes import blob_load, timed
from traces.capture.recipes.common import GIB, MIB, Session, parse_knobs
from traces.capture.recipes.common import run as sh

DESCRIPTION = ("A SharePoint-like BLOB store: bodies of 64 KiB to 8 MiB (median 256 KiB, "
               "incompressible) in files, metadata in SQLite (WAL, synchronous=FULL); 80 % GET "
               "skewed to recent and popular blobs, 15 % PUT made durable (fsync, rename, "
               "directory fsync, commit), 5 % DELETE.")

KNOBS = {
    "duration": (float, 60.0, "Seconds of mixed load to capture."),
    "ops": (int, None, "Fixed work instead of --duration and --rate: this many operations, shared by "
                       "the clients and run back to back, so the run takes as long as the drive makes it."),
    "clients": (int, 4, "Client processes, each with its own SQLite connection."),
    "rate": (float, 200.0, "Operations per second over all clients (Poisson arrivals)."),
    "populate_mb": (int, 2048, "MiB of blobs stored before the capture; keep it above the memory limit."),
    "memory_mb": (int, 256, "Memory cgroup limit for the load, MiB."),
    "seed": (int, 1, "Seed of the blob sizes, contents and choices."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    return store(device, output, "blob", DESCRIPTION, parse_knobs(KNOBS, given), notices=notices,
                 destroy_data=destroy_data, backend=backend, on_start=on_start)


def store(device, output, recipe, description, knobs, *, notices, destroy_data, backend, on_start):
    """Populate the store, remount, and capture its mixed phase: rate-limited for `duration`
    seconds, or with knobs["ops"] that many operations back to back. Recipe `blobclosed` shares
    it; `recipe` and `description` name the trace."""
    with Session(recipe, knobs, notices) as s:
        # The populated store, what PUTs add in the window, and room to spare.
        puts = knobs["ops"] if knobs.get("ops") is not None else knobs["rate"] * knobs["duration"]
        need = knobs["populate_mb"] * MIB * 2 + int(puts * 0.15 * 2 * MIB)
        dev = s.device(device, destroy_data=destroy_data, scratch_size=max(2 * GIB, need + GIB))
        root = s.filesystem(dev, knobs["fs"])
        s.provenance["applications"] = {"sqlite": sqlite3.sqlite_version,
                                        "python": sys.version.split()[0]}
        load = [sys.executable, "-m", blob_load.__name__]
        sh([*load, "populate", root, "--mb", knobs["populate_mb"], "--seed", knobs["seed"]],
           what="populating the BLOB store")
        s.remount()
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        fixed = knobs.get("ops") is not None
        store_outcome = s.tmpdir / "store.json"
        work = (["--ops", knobs["ops"], "--outcome", store_outcome] if fixed
                else ["--duration", knobs["duration"], "--rate", knobs["rate"]])
        mixed = [*load, "mixed", root, *work, "--clients", knobs["clients"], "--seed", knobs["seed"] + 1]
        s.provenance["workload"] = ("blob_load " + " ".join(map(str, mixed[3:])).replace(str(root), "MOUNTPOINT")
                                    .replace(str(store_outcome), "OUTCOME"))
        outcome_file = s.tmpdir / "outcome.json"
        length = (f"{knobs['ops']} operations back to back" if fixed
                  else f"at {knobs['rate']:g} operations/s for {knobs['duration']:g} s")

        def describe(result):
            recorded = timed.read(outcome_file)
            store = {}
            if fixed:
                try:
                    store = json.loads(store_outcome.read_text())
                except (OSError, ValueError):
                    pass
            # The store's own report repeats `unit`: one dict, its keys overriding, as before.
            figures = {"unit": "operations", **{k: v for k, v in store.items() if k != "elapsed_s"},
                       "store_elapsed_s": store.get("elapsed_s")}
            s.provenance["outcome"] = timed.outcome(recorded, **figures)
            return (f"{description} {knobs['clients']} clients, {length} over {knobs['populate_mb']} MiB of "
                    f"blobs, memory limited to {knobs['memory_mb']} MiB, {knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(mixed)), backend=backend,
                         description=describe, on_start=on_start)
