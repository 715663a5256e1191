"""irdma.mounts: the records `irdma status` reads to say where each mount logs."""

from __future__ import annotations

import json
import subprocess
import sys

from irdma import mounts


def test_a_record_left_by_a_dead_mount_is_not_shown_and_is_removed() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    directory = mounts.runtime_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"test-dead-{gone.pid}.json"
    record = {"mountpoint": "/nowhere", "pid": gone.pid, "config": None, "log": "x.log"}
    path.write_text(json.dumps(record))
    try:
        assert all(r.pid != gone.pid for r in mounts.live_mounts(None))
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)
