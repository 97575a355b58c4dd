"""`make packages` installs the Debian packages without starting their services: a policy-rc.d
that exits 101 is there while apt-get runs, and removed afterwards even when apt-get fails or
make is interrupted; a host's own policy-rc.d is left as it was.

apt-get is a stand-in on PATH here: the real one would install packages system-wide. It records
what Debian's invoke-rc.d would be told (the policy's exit status) when it runs.
"""
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def make_packages(tmp_path):
    """make_packages(apt_status, sleep_s=0, wait=True): runs `make packages` with POLICY_RC_D in
    tmp_path and an apt-get that logs the policy's answer for nginx, then exits apt_status."""
    if subprocess.run(["make", "--version"], capture_output=True).returncode:
        pytest.skip("make is not installed (Debian package make)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    policy, log = tmp_path / "policy-rc.d", tmp_path / "apt.log"
    apt = bin_dir / "apt-get"
    apt.write_text(f"#!/bin/sh\n"
                   f"if [ -x {policy} ]; then {policy} nginx start; echo \"$1 policy $?\" >> {log}; "
                   f"else echo \"$1 no-policy\" >> {log}; fi\n"
                   f"sleep \"$APT_SLEEP\"\nexit \"$APT_STATUS\"\n")
    apt.chmod(0o755)

    def run(apt_status, sleep_s=0, wait=True):
        env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "APT_STATUS": str(apt_status),
               "APT_SLEEP": str(sleep_s)}
        proc = subprocess.Popen(["make", "-s", "-C", str(REPO), "packages", f"POLICY_RC_D={policy}"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        if wait:
            proc.communicate(timeout=60)
        return proc

    run.policy, run.log = policy, log
    return run


def test_no_service_starts_while_installing_and_the_policy_goes(make_packages):
    done = make_packages(0)
    assert done.returncode == 0
    # update, then install: invoke-rc.d would have been refused (101) both times.
    assert make_packages.log.read_text().splitlines() == ["update policy 101", "install policy 101"]
    assert not make_packages.policy.exists()


def test_the_policy_goes_when_apt_get_fails(make_packages):
    done = make_packages(100)
    assert done.returncode != 0
    assert make_packages.log.read_text().splitlines() == ["update policy 101"]
    assert not make_packages.policy.exists()


def test_the_policy_goes_when_make_is_interrupted(make_packages):
    proc = make_packages(0, sleep_s=30, wait=False)
    try:
        deadline = time.monotonic() + 30
        while not make_packages.log.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert make_packages.policy.exists()  # apt-get is running under it
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode != 0
    assert not make_packages.policy.exists()


def test_a_hosts_own_policy_is_used_and_left_alone(make_packages):
    host_policy = "#!/bin/sh\n# the host's\nexit 0\n"
    make_packages.policy.write_text(host_policy)
    make_packages.policy.chmod(0o755)
    assert make_packages(0).returncode == 0
    assert make_packages.log.read_text().splitlines() == ["update policy 0", "install policy 0"]
    assert make_packages.policy.read_text() == host_policy
