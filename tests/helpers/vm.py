"""Whether a qemu guest can be booted here (``tests/rdma/vm.sh``), for the suites
that run in one: tests/rdma/test_in_vm.py and tests/systemd/test_units_in_vm.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VM_SH = REPO / "tests/rdma/vm.sh"


def vm_problem() -> str | None:
    """Why no guest can be booted here, or None."""
    if not (REPO / ".venv/bin/python").exists() and not os.environ.get("PY"):
        return "no .venv here (deploy/setup.sh makes it; the guest's packages are pinned to it)"
    if shutil.which("qemu-system-x86_64") is None and os.geteuid() != 0:
        return "qemu is not installed, and installing it (tests/rdma/vm.sh) needs root"
    return None
