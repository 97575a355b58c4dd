"""Recipe `filecopy`: `cp -r` of a folder of pictures, videos, documents and thumbnails onto
the filesystem on DEVICE, then `sync -f` of that filesystem, captured.

The folder is generated (incompressible random bytes, a realistic size mix) on a private
tmpfs, so reading it adds no I/O to the traced device.
"""

import numpy as np

from traces.capture.recipes import timed
from traces.capture.recipes.common import GIB, MIB, Session, parse_knobs, version_of

DESCRIPTION = ("Copying a folder of pictures, videos, documents and thumbnails (generated, "
               "incompressible) with `cp -r` onto the filesystem, then `sync -f` of it.")

KNOBS = {
    "size_mb": (int, 2048, "MiB of files in the copied folder (held in RAM on a tmpfs while copying)."),
    "memory_mb": (int, 256, "Memory cgroup limit for cp, MiB (dirty pages are written back under it)."),
    "seed": (int, 1, "Seed of the file sizes and contents."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}

KIB = 1024
# (folder, extension, share of the bytes, size range in bytes): videos dominate the bytes,
# thumbnails the file count, as in a camera-roll or a user's home folder.
KINDS = (
    ("Videos", "mp4", 0.50, (20 * MIB, 400 * MIB)),
    ("Pictures", "jpg", 0.35, (1 * MIB, 8 * MIB)),
    ("Documents", "pdf", 0.12, (16 * KIB, 4 * MIB)),
    ("Pictures/.thumbnails", "png", 0.03, (4 * KIB, 64 * KIB)),
)

def make_folder(root, size_bytes: int, seed: int) -> dict:
    """Generate the folder under `root`; returns {kind: (files, bytes)}."""
    rng = np.random.default_rng(seed)
    made = {}
    for folder, ext, share, (low, high) in KINDS:
        budget = int(size_bytes * share)
        files = total = 0
        while total < budget:
            size = int(np.exp(rng.uniform(np.log(low), np.log(high))))  # log-uniform in range
            size = max(1, min(size, budget - total))
            year = 2015 + int(rng.integers(0, 10))
            path = root / folder / str(year) / f"{folder.split('/')[-1][:3].upper()}_{files:05d}.{ext}"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                for start in range(0, size, 64 * MIB):
                    f.write(rng.bytes(min(64 * MIB, size - start)))
            files += 1
            total += size
        made[folder] = (files, total)
    return made

def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    size = knobs["size_mb"] * MIB
    with Session("filecopy", knobs, notices) as s:
        dev = s.device(device, destroy_data=destroy_data, scratch_size=max(2 * GIB, 2 * size + GIB))
        mnt = s.filesystem(dev, knobs["fs"])
        source = s.tmpfs(size + size // 8 + 64 * MIB) / "Home"
        made = make_folder(source, size, knobs["seed"])
        s.provenance["applications"] = {"cp": version_of("cp", "--version"),
                                        "sync": version_of("sync", "--version")}
        s.provenance["source_folder"] = {
            "on": "tmpfs", "files": sum(f for f, _ in made.values()),
            "bytes": sum(b for _, b in made.values()),
            "kinds": {k: {"files": f, "bytes": b} for k, (f, b) in made.items()}}
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        dest = mnt / "Home"
        copy = ["sh", "-c", 'cp -r "$0" "$1" && sync -f "$1"', source, dest]
        s.provenance["workload"] = "cp -r SOURCE MOUNTPOINT/Home && sync -f MOUNTPOINT/Home"
        outcome_file = s.tmpdir / "outcome.json"

        def describe(result):
            recorded = timed.read(outcome_file)
            elapsed = recorded.get("elapsed_s")
            nbytes = s.provenance["source_folder"]["bytes"]
            s.provenance["outcome"] = timed.outcome(
                recorded, bytes=nbytes, files=s.provenance["source_folder"]["files"],
                mb_per_s=nbytes / elapsed / MIB if elapsed else None,
                unit="bytes", reported_by="the timer around cp and sync")
            return (f"{DESCRIPTION} {s.provenance['source_folder']['files']} files, {knobs['size_mb']} MiB, "
                    f"memory limited to {knobs['memory_mb']} MiB, {knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(copy)), backend=backend,
                         description=describe, on_start=on_start)
