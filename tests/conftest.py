"""Fixtures: real psd daemons on loopback, always torn down. The helpers they use
live in tests/helpers (by role); tests import those from there, not from here."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from irdma import Client

from .helpers.cluster import Cluster, make_cluster
from .helpers.mounts import start_mount
from .helpers.rdma import rdma_problem
from .helpers.vm import VM_SH, vm_problem

# The suites that boot a qemu guest. The guest image is built once per host
# (debootstrap and apt: minutes, mostly downloads), so a run that collects them
# starts the build at once, in the background, and runs them last: the build
# then overlaps every other test instead of holding the run up.
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
    """A build still running when the run ends (interrupted) is stopped."""
    build, _ = config.stash.get(guest_build_key, (None, None))
    if build is not None and build.poll() is None:
        os.killpg(build.pid, signal.SIGTERM)
        build.wait(60)


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


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three daemons shared by a test module (64 KiB shards, so tensors span them all)."""
    c = make_cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """Three daemons for one test that may kill or pause them (2 s client timeout)."""
    c = make_cluster(tmp_path, timeout=2.0)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def client(cluster: Cluster) -> Iterator[Client]:
    c = Client(cluster.config_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def mount(cluster: Cluster, tmp_path: Path) -> Iterator[Path]:
    """The module's cluster mounted at a fresh directory; always unmounted."""
    m = start_mount(cluster, tmp_path / "mnt")
    try:
        yield m.path
    finally:
        m.unmount()
