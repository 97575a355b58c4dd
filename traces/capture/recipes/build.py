"""Recipe `build`: a software build, the Linux kernel from Debian's linux-source package
configured and built with make -j on the filesystem on DEVICE, captured.

The source tarball is unpacked onto the filesystem first (about 79,000 files, 1.5 GB), the
filesystem is remounted so the build starts cold, then `make CONFIG && make -jJOBS TARGETS`
runs inside the memory cgroup and is captured: it reads the sources and headers and writes
the objects, archives and the image.
"""
import glob
import re
import shlex
import subprocess
from pathlib import Path

from traces.capture.recipes import timed
from traces.capture.recipes.common import GIB, MIB, RecipeError, Session, parse_knobs, require, version_of
from traces.capture.recipes.common import run as sh

DESCRIPTION = ("A software build: the Linux kernel from Debian's linux-source package, unpacked "
               "onto the filesystem, then configured and built with make -j from a cold cache.")

KNOBS = {
    "config": (str, "tinyconfig", "kbuild configuration target made first (tinyconfig builds about "
                                  "450 files; defconfig thousands, and needs libelf-dev and libssl-dev)."),
    "targets": (str, "all", "make targets built, separated by spaces (a directory such as lib/ "
                            "builds only that part)."),
    "jobs": (int, 2, "Parallel jobs (make -j)."),
    "memory_mb": (int, 512, "Memory cgroup limit for the build, MiB (the compilers' memory and the "
                            "page cache count)."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
}

TARBALL = "/usr/src/linux-source-*.tar.xz"
TOOLS = {"make": "make", "gcc": "gcc", "flex": "flex", "bison": "bison", "bc": "bc",
         "xz": "xz-utils", "tar": "tar", TARBALL: "linux-source"}
# Fixed identity strings, so that two builds of the same tree write the same bytes.
_REPRODUCIBLE = ("KBUILD_BUILD_TIMESTAMP=1970-01-01", "KBUILD_BUILD_USER=tracereplay",
                 "KBUILD_BUILD_HOST=tracereplay")
# kbuild's short log: one "  CC      path/file.o" line per C file compiled for the kernel.
_COMPILED = re.compile(r"^\s+CC\s", re.MULTILINE)


def newest_tarball() -> Path:
    """The newest linux-source tarball Debian's package installed."""
    def version(path):
        found = re.search(r"linux-source-([\d.]+)\.tar", path)
        return tuple(int(p) for p in found.group(1).split(".") if p) if found else ()

    return Path(max(glob.glob(TARBALL), key=version))


def package_version(tarball: Path) -> str:
    """The Debian package that installed `tarball` and its version: "linux-source-6.1 6.1.192-2"."""
    package = tarball.name.removesuffix(".tar.xz")
    done = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", package], capture_output=True, text=True)
    return f"{package} {done.stdout.strip() or 'unknown'}"


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    targets = knobs["targets"].split()
    if not re.fullmatch(r"\w+config", knobs["config"]):
        raise RecipeError(f"knob config: {knobs['config']!r} is not a kbuild configuration target "
                          "such as tinyconfig, allnoconfig or defconfig")
    if not targets:
        raise RecipeError("knob targets: name at least one make target, such as all")
    require(TOOLS, notices)
    tarball = newest_tarball()
    with Session("build", knobs, notices) as s:
        dev = s.device(device, destroy_data=destroy_data, scratch_size=6 * GIB)
        mnt = s.filesystem(dev, knobs["fs"])
        sh(["tar", "-xJf", tarball, "-C", mnt, "--no-same-owner"], what=f"unpacking {tarball}")
        tree = next(p for p in mnt.iterdir() if p.is_dir() and p.name.startswith("linux"))
        files = sum(1 for p in tree.rglob("*") if p.is_file())
        s.provenance["applications"] = {"make": version_of("make", "--version"),
                                        "gcc": version_of("gcc", "--version"),
                                        "source": package_version(tarball)}
        s.provenance["source_tree"] = {"from": str(tarball), "files": files,
                                       "tarball_bytes": tarball.stat().st_size}
        s.remount()
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        make = ["make", "-C", str(tree), *_REPRODUCIBLE]
        jobs = f"-j{knobs['jobs']}"
        build = ["sh", "-c", f"{shlex.join([*make, knobs['config']])} && {shlex.join([*make, jobs, *targets])}"]
        s.provenance["workload"] = (f"make {knobs['config']} && make -j{knobs['jobs']} {' '.join(targets)} "
                                    f"(in MOUNTPOINT/{tree.name}, with {' '.join(_REPRODUCIBLE)})")
        outcome_file = s.tmpdir / "outcome.json"

        def describe(result):
            recorded = timed.read(outcome_file)
            s.provenance["outcome"] = timed.outcome(
                recorded, compilations=len(_COMPILED.findall(recorded.get("output", ""))),
                unit="compilations", reported_by="make (kbuild's CC lines)")
            return (f"{DESCRIPTION} {s.provenance['applications']['source']}, make {knobs['config']} "
                    f"then make -j{knobs['jobs']} {' '.join(targets)}, memory limited to "
                    f"{knobs['memory_mb']} MiB, {knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(build)), backend=backend,
                         description=describe, on_start=on_start)
