"""Run the RDMA suite where there is RDMA: in a qemu guest with soft-RoCE.

This host's kernel has no RDMA; ``vm.sh`` boots a Debian guest (built once,
cached outside the repository) with two rxe devices and this repository
shared read-only, and the guest runs ``pytest tests/rdma`` against real
daemons on real verbs. Here the guest's results are read back from its
JUnit report: every test must have run (none skipped) and passed.
"""

from __future__ import annotations

import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ..helpers.rdma import rdma_problem
from ..helpers.vm import VM_SH, vm_problem

# IRDMA_RDMA_GUEST: collect the device suite even if the device were missing (then it
# fails, where a host without one does not collect it).
GUEST_COMMAND = """\
export IRDMA_RDMA_GUEST=1
exec python3 -m pytest -p no:cacheprovider tests/rdma -ra -v -o timeout=600 \\
    --junitxml=/results/junit.xml --deselect tests/rdma/test_in_vm.py
"""


@pytest.mark.timeout(2400)
def test_rdma_suite_in_a_soft_roce_guest(tmp_path: Path, guest_image: None) -> None:
    problem = (
        "this host has an RDMA device itself: the suite ran directly"
        if rdma_problem() is None
        else vm_problem()
    )
    if problem is not None:
        pytest.skip(problem)
    results = tmp_path / "guest"
    results.mkdir()
    (results / "cmd.sh").write_text(GUEST_COMMAND)
    done = subprocess.run(
        ["bash", str(VM_SH), "run", str(results)],
        capture_output=True,
        text=True,
        timeout=2300,
    )
    log = (
        (results / "guest.log").read_text(errors="replace")
        if (results / "guest.log").exists()
        else ""
    )
    # The guest's pytest output, for whoever reads this run's log.
    print(log[-20_000:])
    print(done.stderr[-4000:])
    junit = results / "junit.xml"
    assert junit.exists(), f"the guest wrote no report (vm.sh exit {done.returncode})"
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    assert counts["tests"] > 0, counts
    assert not failed and done.returncode == 0, (counts, failed)
    # In the guest every test has its device: a skip there is a fault.
    assert counts["skipped"] == 0, counts
