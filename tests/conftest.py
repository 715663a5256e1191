"""Fixtures: real psd daemons on loopback, always torn down. The helpers they use
live in tests/helpers (by role); tests import those from there, not from here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from irdma import Client

from .helpers.cluster import Cluster, make_cluster
from .helpers.mounts import start_mount

# The guest image built beside the other tests: hooks, which cannot be fixtures,
# and the fixture that waits for the build.
pytest_plugins = ("tests.helpers.guest_build", "tests.helpers.mount_sessions")


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, mount_session: str | None
) -> Iterator[Cluster]:
    """Three daemons shared by a test module (64 KiB shards, so tensors span them all);
    one per mount session where the module runs its tests on several."""
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
def mount(cluster: Cluster, tmp_path: Path, mount_session: str | None) -> Iterator[Path]:
    """The module's cluster mounted at a fresh directory; always unmounted. The
    session: the run's default, or each of a module's ``MOUNT_SESSIONS``
    (tests/helpers/mount_sessions.py)."""
    m = start_mount(cluster, tmp_path / "mnt", session=mount_session)
    try:
        yield m.path
    finally:
        m.unmount()
