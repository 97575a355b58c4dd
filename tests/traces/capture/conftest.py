"""What the recipe tests share: a check that a recipe's run left nothing behind."""
import json
import os
import subprocess
from pathlib import Path

import pytest


def leftovers(recipe: str, pid: int) -> dict:
    """What a run of `recipe` in process `pid` could leave: loop devices, mounts, cgroups,
    processes (their names carry the recipe and the pid, so concurrent runs do not count)."""
    tag = f"tracereplay-{recipe}-{pid}-"
    listing = subprocess.run(["losetup", "--list", "--json", "--output", "NAME,BACK-FILE"],
                             capture_output=True, text=True).stdout
    loops = {d["name"] for d in json.loads(listing or "{}").get("loopdevices", [])
             if tag in (d.get("back-file") or "")}
    mounts = {line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines() if tag in line}
    cgroups = {str(p) for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/unified")
               for p in Path(root).glob(f"{tag}*") if p.is_dir()}
    procs = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if tag.encode() in (entry / "cmdline").read_bytes():
                    procs.add(int(entry.name))
            except OSError:
                pass
    return {"loops": loops, "mounts": mounts, "cgroups": cgroups, "procs": procs}


@pytest.fixture
def clean():
    """clean(recipe, pid): at the end, asserts a run of `recipe` in `pid` (default: this
    process) left nothing behind that was not there before."""
    def check(recipe, pid=None):
        pid = os.getpid() if pid is None else pid
        checks.append((recipe, pid, leftovers(recipe, pid)))
    checks = []
    yield check
    for recipe, pid, before in checks:
        after = leftovers(recipe, pid)
        left = {k: after[k] - before[k] for k in after if after[k] - before[k]}
        assert not left, f"recipe {recipe} left {left}"
