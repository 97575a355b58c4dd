"""Recipe `blobclosed`: the BLOB store of recipe `blob` run closed-loop, its clients sharing a
fixed number of operations and issuing each as soon as the last one ended, so the run takes as
long as the drive makes it (`blob` keeps the rate-limited load, whose run time no drive changes).
"""
from traces.capture.recipes import blob
from traces.capture.recipes.common import parse_knobs

DESCRIPTION = ("A SharePoint-like BLOB store run closed-loop: the store of recipe blob (bodies of "
               "64 KiB to 8 MiB in files, metadata in SQLite, WAL, synchronous=FULL; 80 % GET, 15 % "
               "durable PUT, 5 % DELETE), its clients issuing a fixed number of operations back to "
               "back, as fast as the drive lets them.")

# Python's sqlite3 and numpy, nothing from Debian.
TOOLS = {}

KNOBS = {
    "ops": (int, 12000, "Operations in all, shared by the clients and run back to back (fixed work)."),
    "clients": (int, 4, "Client processes, each with its own SQLite connection."),
    "populate_mb": (int, 2048, "MiB of blobs stored before the capture; keep it above the memory limit."),
    "memory_mb": (int, 256, "Memory cgroup limit for the load, MiB."),
    "seed": (int, 1, "Seed of the blob sizes, contents and choices."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    return blob.store(device, output, "blobclosed", DESCRIPTION, parse_knobs(KNOBS, given), notices=notices,
                      destroy_data=destroy_data, backend=backend, on_start=on_start)
