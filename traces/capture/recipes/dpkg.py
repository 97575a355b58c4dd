"""Recipe `dpkg`: installing a set of Debian packages into a chroot on the filesystem on
DEVICE, captured: debootstrap unpacks them, then runs dpkg inside the chroot to install and
configure each one, and dpkg makes every file it unpacks durable (fsync before rename).

The packages come from a tarball that `debootstrap --make-tarball` downloads once into
`--cache-dir`, so the captured run reads nothing from the network: debootstrap puts the
.deb files into the chroot's /var/cache/apt/archives, where apt would have downloaded them,
and dpkg reads them from there.
"""
import hashlib
import os
import re
import subprocess
from pathlib import Path

from traces.capture.recipes import boot_image, timed
from traces.capture.recipes.common import (GIB, MIB, RecipeError, Session, mounts_under, parse_knobs, require,
                                           version_of)
from traces.capture.recipes.common import run as sh

DESCRIPTION = ("Installing a set of Debian packages into a chroot: debootstrap from a local tarball "
               "of the packages, whose second stage runs dpkg in the chroot to install and configure "
               "each one, with dpkg's fsync of every file it unpacks.")

KNOBS = {
    "suite": (str, boot_image.host_suite(), "Debian suite installed (default: the host's)."),
    "variant": (str, "buildd", "debootstrap variant: buildd (a build toolchain, build-essential: about "
                               "145 packages), minbase (about 90), or standard (Debian's required and "
                               "important ones)."),
    "include": (str, "", "More packages to install, separated by commas."),
    "memory_mb": (int, 256, "Memory cgroup limit for debootstrap and dpkg, MiB."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
    "cache_dir": (str, str(boot_image.DEFAULT_CACHE_DIR), "Directory that keeps the packages' tarball "
                                                          "between runs."),
    "mirror": (str, boot_image.DEFAULT_MIRROR, "Debian mirror the packages are downloaded from, once."),
}
TOOLS = {"debootstrap": "debootstrap", "dpkg-query": "dpkg"}
VARIANTS = ("buildd", "minbase", "standard")


def _variant_args(knobs: dict) -> list[str]:
    args = [] if knobs["variant"] == "standard" else [f"--variant={knobs['variant']}"]
    return args + ([f"--include={knobs['include']}"] if knobs["include"] else [])


def packages_tarball(knobs: dict, notices: list) -> Path:
    """The tarball of the packages for these knobs in the cache directory, downloaded there
    first with `debootstrap --make-tarball` if it is missing (renamed into place when whole)."""
    key = hashlib.sha256(" ".join([knobs["suite"], *_variant_args(knobs)]).encode()).hexdigest()[:12]
    cache_dir = Path(knobs["cache_dir"])
    tarball = cache_dir / f"debootstrap-{knobs['suite']}-{knobs['variant']}-{key}.tgz"
    if tarball.exists():
        return tarball
    notices.append(f"downloading the packages into {tarball} (debootstrap --make-tarball; once)")
    partial = tarball.with_name(f".{tarball.name}.{os.getpid()}")
    work = tarball.with_name(f".{tarball.stem}.{os.getpid()}.d")
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        sh(["debootstrap", *_variant_args(knobs), f"--make-tarball={partial}", knobs["suite"], work, knobs["mirror"]],
           what=f"downloading the {knobs['suite']} packages from {knobs['mirror']} (is it reachable?)")
        os.replace(partial, tarball)
    except OSError as exc:
        raise RecipeError(f"{cache_dir}: cannot keep the packages there ({exc.strerror}); "
                          "give another --cache-dir") from None
    finally:
        partial.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", "--one-file-system", work], capture_output=True)
    return tarball


def unmount_under(path: Path) -> None:
    """Unmount what debootstrap mounted in the chroot (/proc, /sys) when it was killed before
    its own exit trap could (SIGTERM lets it clean up; the SIGKILL after the grace does not)."""
    for point in sorted(mounts_under(path), key=len, reverse=True):
        sh(["umount", "--lazy", point])


def installed(root: Path) -> dict:
    """The packages installed in `root` ({name: version}), from its dpkg database."""
    listing = sh(["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W",
                  "-f", "${db:Status-Abbrev} ${Package} ${Version}\n"]).stdout
    return {f[1]: f[2] for f in (line.split() for line in listing.splitlines()) if f and f[0] == "ii"}


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    if knobs["variant"] not in VARIANTS:
        raise RecipeError(f"knob variant: {knobs['variant']!r} is not one of {', '.join(VARIANTS)}")
    if not re.fullmatch(r"[a-z][a-z0-9-]*", knobs["suite"]):
        raise RecipeError(f"knob suite: {knobs['suite']!r} is not a Debian suite name, such as bookworm")
    if knobs["include"] and not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*(,[a-z0-9][a-z0-9.+-]*)*", knobs["include"]):
        raise RecipeError(f"knob include: {knobs['include']!r} is not package names separated by commas")
    require(TOOLS, notices)
    tarball = packages_tarball(knobs, notices)
    with Session("dpkg", knobs, notices) as s:
        dev = s.device(device, destroy_data=destroy_data, scratch_size=4 * GIB)
        mnt = s.filesystem(dev, knobs["fs"])
        root = mnt / "chroot"
        s.defer(unmount_under, root)  # runs before the filesystem's unmount
        s.provenance["applications"] = {"debootstrap": version_of("dpkg-query", "-W", "-f", "debootstrap ${Version}",
                                                                  "debootstrap"),
                                        "dpkg (host)": version_of("dpkg", "--version")}
        s.provenance["packages_from"] = {"tarball": tarball.name, "bytes": tarball.stat().st_size,
                                         "mirror": knobs["mirror"]}
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        install = ["debootstrap", *_variant_args(knobs), f"--unpack-tarball={tarball}", knobs["suite"], root,
                   knobs["mirror"]]
        s.provenance["workload"] = " ".join(map(str, install)).replace(str(root), "MOUNTPOINT/chroot").replace(
            str(tarball), tarball.name)
        outcome_file = s.tmpdir / "outcome.json"

        def describe(result):
            recorded = timed.read(outcome_file)
            packages = installed(root) if recorded.get("status") == 0 else {}
            s.provenance["applications"]["dpkg"] = f"dpkg {packages.get('dpkg', 'unknown')} (in the chroot)"
            s.provenance["outcome"] = timed.outcome(recorded, packages=len(packages), unit="packages",
                                                    reported_by="dpkg's database in the chroot")
            return (f"{DESCRIPTION} {len(packages)} packages of Debian {knobs['suite']} "
                    f"({knobs['variant']}{', with ' + knobs['include'] if knobs['include'] else ''}), memory "
                    f"limited to {knobs['memory_mb']} MiB, {knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(install)), backend=backend,
                         description=describe, on_start=on_start)
