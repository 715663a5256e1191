"""deploy/'s units under a real systemd: a qemu guest booted with systemd as PID 1.

``tests/rdma/vm.sh`` boots the soft-RoCE guest image (the RDMA suite's; one
image serves both) with ``GUEST_INIT=systemd``; its oneshot unit runs
``tests/rdma/guest.sh`` (soft-RoCE on 198.18.0.1), which runs
``guest_run.sh``: irdma installed as ``deploy/install.sh`` lays it out (the
units, the sysusers entry and the config by install.sh itself with
``DESTDIR=/``; the venv by ``install_offline.py``, the guest having no
network), three ``psd@`` instances on ``rdma://`` addresses with two copies
of each shard, then ``guest_checks.py``, whose results (checks.json) are
asserted here, one test per check, on one boot. The guest's log and each
check's details are printed.

Under qemu's emulation (TCG) this takes about ten minutes; building the
image, once per package list, about four more. It waits for another qemu
guest on this host to finish first (``VM_WAIT``): two of them on a small
host starve each other's timeouts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..helpers.vm import VM_SH, vm_problem

# The guest's own budget (vm.sh kills qemu after it), the wait for another
# guest, and the image build.
QEMU_TIMEOUT = 900
VM_WAIT = 900
BUILD = 600
pytestmark = pytest.mark.timeout(VM_WAIT + QEMU_TIMEOUT + BUILD + 60)

CHECKS = {
    "start_waits_for_ready": "systemctl start psd@n1 returns once active (READY=1); "
    "'activating' meanwhile; a HELLO at once is answered by its MainPID",
    "mount_after_daemons": "irdma-mount starts only after every psd@ is active and "
    "mounts /mnt/params, which shows a tensor written by a client",
    "rdma_under_hardening": "the sandboxed daemons register their arenas on soft-RoCE "
    "(memlock unlimited) and serve a client forced onto RDMA",
    "sigkill_restarts_and_catches_up": "SIGKILL psd@n2: restarted by systemd, and it "
    "catches up on what was written while it was down",
    "watchdog_restarts_hung": "SIGSTOP psd@n1: killed by the watchdog (Result=watchdog) "
    "and restarted",
    "stop_leaves_snapshot": "systemctl stop psd@n1 writes the final snapshot, which the "
    "next start loads",
    "mount_stops_cleanly": "systemctl stop irdma-mount unmounts /mnt/params",
}


def kill_guest(vm: subprocess.Popen[str], results: Path) -> None:
    """Stop vm.sh and its qemu (which `timeout` runs in a process group of its own)."""
    if vm.poll() is None:
        os.killpg(vm.pid, signal.SIGKILL)
    # Only processes that name this run's results directory: its qemu and timeout.
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if str(results).encode() in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(proc.name), signal.SIGKILL)
    vm.wait()


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory, guest_image: None) -> Iterator[dict[str, Any]]:
    """One boot of the guest; its checks by name, its exit code and log."""
    problem = vm_problem()
    if problem is not None:
        print(f"skipped: {problem}")
        pytest.skip(problem)
    results = tmp_path_factory.mktemp("systemd-guest")
    (results / "cmd.sh").write_text("exec sh /src/tests/systemd/guest_run.sh\n")
    env = {
        **os.environ,
        "GUEST_INIT": "systemd",
        "QEMU_TIMEOUT": str(QEMU_TIMEOUT),
        "VM_WAIT": str(VM_WAIT),
    }
    t = time.monotonic()
    vm = subprocess.Popen(
        ["bash", str(VM_SH), "run", str(results)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = vm.communicate(timeout=VM_WAIT + QEMU_TIMEOUT + BUILD)
    finally:
        kill_guest(vm, results)  # nothing left running, whatever happened
    seconds = time.monotonic() - t
    log_path = results / "guest.log"
    log = log_path.read_text(errors="replace") if log_path.exists() else ""
    print(f"vm.sh exit {vm.returncode} after {seconds:.0f} s:\n{output[-4000:]}")
    print(f"guest log ({log_path}):\n{log[-30_000:]}")
    if not log:
        serial = results / "serial.log"
        if serial.exists():
            print("serial console, last lines:\n" + serial.read_text(errors="replace")[-6000:])
    checks_path = results / "checks.json"
    checks = json.loads(checks_path.read_text()) if checks_path.exists() else []
    yield {
        "rc": vm.returncode,
        "checks": {c["name"]: c for c in checks},
        "results": results,
        "seconds": seconds,
    }


@pytest.mark.parametrize("name", list(CHECKS))
def test_unit_behaviour_under_systemd(guest: dict[str, Any], name: str) -> None:
    check = guest["checks"].get(name)
    assert check is not None, (
        f"the guest did not run {name!r} ({CHECKS[name]}); vm.sh exit {guest['rc']}, "
        f"results in {guest['results']}"
    )
    print(json.dumps(check, indent=1))
    assert check["ok"], f"{name}: {CHECKS[name]}: {json.dumps(check['detail'], indent=1)}"


def test_the_guest_finished_cleanly(guest: dict[str, Any]) -> None:
    """Every check ran and passed, and the guest powered off on its own (exit 0)."""
    assert set(guest["checks"]) == set(CHECKS), sorted(guest["checks"])
    assert guest["rc"] == 0, f"vm.sh exit {guest['rc']}: see the guest log above"
