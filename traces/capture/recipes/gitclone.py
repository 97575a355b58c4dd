"""Recipe `gitclone`: `git clone --no-local` of a large repository onto the filesystem on
DEVICE (receiving the pack, indexing it, checking out the tree), then `sync -f`, captured.

The repository is the Linux kernel's tree from Debian's linux-source package committed once
and packed; it is built once and kept in `--cache-dir` (outside the traced device, like a
server's copy), and each run clones it through git's own transport (upload-pack and
index-pack, as over ssh), so only the clone's side is traced.
"""
import fcntl
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from traces.capture.recipes import timed
from traces.capture.recipes.build import TARBALL, newest_tarball, package_version
from traces.capture.recipes.common import GIB, MIB, RecipeError, Session, parse_knobs, require, version_of
from traces.capture.recipes.common import run as sh

DESCRIPTION = ("A git clone of a large repository: the Linux kernel's tree (Debian's linux-source, "
               "one commit, packed) cloned with git clone --no-local, its pack received and indexed "
               "and its tree checked out, then synced.")

DEFAULT_CACHE_DIR = "/var/cache/tracereplay"
KNOBS = {
    "subtree": (str, "", "Only this directory of the kernel's tree goes into the repository (fs, "
                         "kernel); empty for the whole tree, about 79,000 files."),
    "memory_mb": (int, 256, "Memory cgroup limit for git, MiB."),
    "fs": (str, "ext4", "Filesystem made on the device: ext4 or xfs."),
    "cache_dir": (str, DEFAULT_CACHE_DIR, "Directory that keeps the source repository between runs."),
}
TOOLS = {"git": "git", "tar": "tar", "xz": "xz-utils", TARBALL: "linux-source"}
# The commit is made with fixed names and dates, so the repository is the same on every machine.
_IDENTITY = {"GIT_AUTHOR_NAME": "tracereplay", "GIT_AUTHOR_EMAIL": "tracereplay@localhost",
             "GIT_COMMITTER_NAME": "tracereplay", "GIT_COMMITTER_EMAIL": "tracereplay@localhost",
             "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}


def source_repository(cache_dir: Path, tarball: Path, subtree: str, notices: list) -> tuple[Path, dict]:
    """The bare repository of `tarball`'s tree (or its `subtree`) in `cache_dir`, built there
    first if it is missing (a lock makes concurrent runs wait for one build); and its facts.
    Its JSON is written last, so its presence commits a build."""
    version = package_version(tarball)
    stem = re.sub(r"[^\w.+-]+", "_", f"git-{version}-{subtree or 'all'}")
    repo, facts_file = cache_dir / f"{stem}.git", cache_dir / f"{stem}.json"
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        with open(cache_dir / f"{stem}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not facts_file.exists():
                notices.append(f"building the source repository {repo} (once; a few minutes for the whole tree)")
                work = Path(tempfile.mkdtemp(prefix=".build-", dir=cache_dir))
                try:
                    facts = _build(work, repo, tarball, subtree, version)
                finally:
                    shutil.rmtree(work, ignore_errors=True)
                facts_file.with_suffix(".tmp").write_text(json.dumps(facts, indent=1) + "\n")
                os.replace(facts_file.with_suffix(".tmp"), facts_file)
    except OSError as exc:
        raise RecipeError(f"{cache_dir}: cannot keep the source repository there ({exc.strerror}); "
                          "give another --cache-dir") from None
    return repo, json.loads(facts_file.read_text())


def _build(work: Path, repo: Path, tarball: Path, subtree: str, version: str) -> dict:
    top = tarball.name.removesuffix(".tar.xz")  # Debian's tarball holds one directory of its name
    member = f"{top}/{subtree.strip('/')}" if subtree else top
    sh(["tar", "-xJf", tarball, "-C", work, "--no-same-owner", member], what=f"unpacking {member}")
    tree = work / top
    env = {**os.environ, **_IDENTITY}
    # No automatic gc: after the commit it would pack the loose objects in the background,
    # outliving this build, while the bare clone below packs them anyway.
    git = ["git", "-c", "gc.auto=0", "-C", tree]
    sh(["git", "init", "-q", "-b", "master", tree], what="git init")
    # --force: Debian's .gitignore ignores the top level (its packaging's own repository).
    sh([*git, "add", "--all", "--force"], what="git add", env=env)
    sh([*git, "commit", "-q", "-m", f"Linux from Debian's {version}"], what="git commit", env=env)
    shutil.rmtree(repo, ignore_errors=True)  # a build that died before its JSON was written
    sh(["git", "clone", "-q", "--bare", "--no-local", tree, repo], what="packing the repository")
    files = int(sh(["git", "-C", repo, "ls-tree", "-r", "--name-only", "HEAD"]).stdout.count("\n"))
    pack = sum(p.stat().st_size for p in (repo / "objects" / "pack").glob("*.pack"))
    return {"from": str(tarball), "source": version, "subtree": subtree or None, "files": files,
            "pack_bytes": pack, "git": version_of("git", "--version")}


def run(device, output, *, notices, destroy_data=False, backend="auto", on_start=None, **given):
    knobs = parse_knobs(KNOBS, given)
    if knobs["subtree"] and not re.fullmatch(r"[\w.+-]+(/[\w.+-]+)*/?", knobs["subtree"]):
        raise RecipeError(f"knob subtree: {knobs['subtree']!r} is not a directory of the kernel's "
                          "tree, such as fs or kernel")
    require(TOOLS, notices)
    source, facts = source_repository(Path(knobs["cache_dir"]), newest_tarball(), knobs["subtree"], notices)
    with Session("gitclone", knobs, notices) as s:
        # The checked-out tree, the received pack, and room to spare.
        dev = s.device(device, destroy_data=destroy_data, scratch_size=max(2 * GIB, 6 * facts["pack_bytes"] + GIB))
        mnt = s.filesystem(dev, knobs["fs"])
        s.provenance["applications"] = {"git": version_of("git", "--version")}
        s.provenance["repository"] = facts
        cgroup = s.memory_cgroup(knobs["memory_mb"] * MIB)
        dest = mnt / "linux"
        clone = ["sh", "-c", 'git clone --no-local --progress "$0" "$1" && sync -f "$1"', source, dest]
        s.provenance["workload"] = "git clone --no-local --progress SOURCE MOUNTPOINT/linux && sync -f MOUNTPOINT/linux"
        outcome_file = s.tmpdir / "outcome.json"

        def describe(result):
            recorded = timed.read(outcome_file)
            received = re.findall(r"Receiving objects: 100% \((\d+)/\d+\), ([\d.]+ \w+)", recorded.get("output", ""))
            files = sh(["git", "-C", dest, "ls-files", "-z"]).stdout.count("\0")
            s.provenance["outcome"] = timed.outcome(
                recorded, objects=int(received[-1][0]) if received else None,
                received=received[-1][1] if received else None, files=files,
                unit="files checked out", reported_by="git clone (its progress) and git ls-files")
            part = f"{knobs['subtree']}/ of " if knobs["subtree"] else ""
            return (f"{DESCRIPTION} {part}{facts['source']}: {files} files, a {facts['pack_bytes'] / MIB:.0f} MiB "
                    f"pack, memory limited to {knobs['memory_mb']} MiB, {knobs['fs']} on the device.")

        return s.capture(dev, output, command=timed.wrap(outcome_file, cgroup.wrap(clone)), backend=backend,
                         description=describe, on_start=on_start)
