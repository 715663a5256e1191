"""The guest image built beside the other tests: a pytest plugin (tests/conftest.py
loads it), as hooks cannot be fixtures.

The suites that boot a qemu guest need its image, built once per host (apt and
debootstrap: minutes, mostly downloads). A run that collects them starts the
build at once, in the background, and runs them last: the build then overlaps
every other test instead of holding the run up. Their fixture
(``guest_image``) waits for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

from .rdma import rdma_problem
from .vm import VM_SH, vm_problem

# Where they are, from the repository's root (as pytest names items).
GUEST_SUITES = ("tests/rdma/test_in_vm.py", "tests/systemd/test_units_in_vm.py")
GUEST_BUILD_TIMEOUT = 1800.0  # seconds a test waits for the background build
guest_build_key = pytest.StashKey[tuple[subprocess.Popen, Path]]()


@pytest.hookimpl(trylast=True)  # after --deselect and -k have had their say
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    in_guest = [i for i in items if i.nodeid.split("::")[0] in GUEST_SUITES]
    if not in_guest:
        return
    items[:] = [i for i in items if i not in in_guest] + in_guest
    if (
        config.option.collectonly
        or os.environ.get("IRDMA_RDMA_GUEST")
        or rdma_problem() is None
        or vm_problem() is not None
    ):
        return  # nothing runs, in the guest, a host with RDMA, or no guest boots (they say why)
    log = Path(tempfile.mkstemp(prefix="irdma-guest-build-", suffix=".log")[1])
    with open(log, "w") as out:
        build = subprocess.Popen(
            ["bash", str(VM_SH), "build"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    config.stash[guest_build_key] = (build, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    """A build still running when the run ends (interrupted) is stopped; the log of
    one that succeeded goes (a failed one's stays for whoever looks)."""
    build, log = config.stash.get(guest_build_key, (None, None))
    if build is None or log is None:
        return
    if build.poll() is None:
        os.killpg(build.pid, signal.SIGTERM)
        build.wait(60)
    elif build.returncode == 0:
        log.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def guest_image(pytestconfig: pytest.Config) -> None:
    """The guest image, built: waits for the build this run started (vm.sh run would
    wait on the build's lock too, but would first run apt beside it)."""
    build, log = pytestconfig.stash.get(guest_build_key, (None, None))
    if build is None or log is None:
        return  # nothing started here: vm.sh run builds it if it must
    rc = build.wait(GUEST_BUILD_TIMEOUT)
    if rc != 0:
        pytest.fail(
            f"building the guest image failed (vm.sh build exit {rc}):\n"
            + log.read_text(errors="replace")[-4000:]
        )
