"""Fixtures for the RDMA suite: real daemons serving a real verbs device.

These hosts have no RDMA, so ``test_in_vm.py`` boots a qemu guest with
soft-RoCE (rxe0 on 198.18.0.1) and runs this suite there. On a host
without a device the suite is not collected (a run reports no skips: it
is the guest's ``test_in_vm.py`` that runs it); in the guest
(``IRDMA_RDMA_GUEST=1``, set by ``test_in_vm.py``) it always is, and a
missing device fails each test instead of skipping it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from ..helpers.cluster import Cluster, make_cluster
from ..helpers.rdma import RDMA_IP, SHARD, rdma_problem

IN_GUEST = os.environ.get("IRDMA_RDMA_GUEST") == "1"

# The device suite, where it can run (or must: in the guest).
collect_ignore = (
    []
    if IN_GUEST or rdma_problem() is None
    else ["test_rdma_transport.py", "test_rdma_versions.py"]
)


@pytest.fixture(scope="session")
def rdma_device() -> str:
    problem = rdma_problem()
    if problem is not None:
        pytest.fail(
            f"needs an RDMA device with a RoCE v2 GID for {RDMA_IP}: {problem} "
            "(tests/rdma/test_in_vm.py runs these in a soft-RoCE guest)"
        )
    return RDMA_IP


@pytest.fixture(scope="module")
def rdma_cluster(rdma_device: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two daemons on the RDMA device's address, clients told to use rdma://."""
    cluster = make_cluster(
        tmp_path_factory.mktemp("rdma"),
        2,
        arena_size=320 << 20,
        shard_size=SHARD,
        timeout=10.0,
        host=rdma_device,
        scheme="rdma",
    )
    try:
        yield cluster
    finally:
        cluster.close()
