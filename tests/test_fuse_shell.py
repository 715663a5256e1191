"""The mount as a shell user meets it: errors at the write, one wait per unreachable
daemon, and where to read why (``irdma status`` names each mount's log)."""

from __future__ import annotations

import errno
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from irdma import Client

from .helpers.cluster import Cluster, make_cluster
from .helpers.mounts import mount_command, start_mount
from .test_cli import irdma

# Each test that mounts runs on the own session and on pyfuse3, the fallback.
MOUNT_SESSIONS = ("own", "pyfuse3")


def bash(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_echo_garbage_into_a_npy_fails_at_the_write(
    cluster: Cluster, mount: Path, tmp_path: Path
) -> None:
    (mount / "shell").mkdir()
    proc = bash(f"echo garbage > {mount}/shell/bad.npy")
    assert proc.returncode != 0
    assert "Invalid argument" in proc.stderr  # bash: echo: write error: Invalid argument
    with Client(cluster.config_path) as c:
        assert [i.name for i in c.list("shell/")] == ["shell/.irdma-dir"]  # nothing stored
    log = (tmp_path / "mnt.log").read_text()
    assert "shell/bad.npy: not a .npy file: it starts with b'garbag'" in log


def test_a_valid_header_written_in_pieces_is_accepted(mount: Path) -> None:
    """A header that arrives a few bytes per write is right so far at each one."""
    (mount / "pieces").mkdir()
    x = np.arange(1000, dtype=np.int32)
    buf = io.BytesIO()
    np.save(buf, x)
    data = buf.getvalue()
    path = mount / "pieces" / "x.npy"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        for i in range(0, len(data), 7):
            os.write(fd, data[i : i + 7])
    finally:
        os.close(fd)
    assert np.array_equal(np.load(path), x)


def test_garbage_into_an_accumulate_file_fails_at_the_write(mount: Path) -> None:
    (mount / "accshell").mkdir()
    np.save(mount / "accshell" / "w.npy", np.zeros(3))
    proc = bash(f"printf 'not numbers' > {mount}/accshell/.accumulate/w.npy")
    assert proc.returncode != 0 and "Invalid argument" in proc.stderr
    assert np.array_equal(np.load(mount / "accshell" / "w.npy"), np.zeros(3))


def test_put_of_a_name_ending_in_npy_shows_once_in_the_mount(
    cluster: Cluster, mount: Path, tmp_path: Path
) -> None:
    np.save(tmp_path / "w.npy", np.arange(4))
    irdma(cluster, "put", "putnpy/w.npy", str(tmp_path / "w.npy"))
    assert os.listdir(mount / "putnpy") == ["w.npy"]
    assert np.array_equal(np.load(mount / "putnpy" / "w.npy"), np.arange(4))


def test_a_paused_daemon_costs_a_lookup_one_timeout(fresh_cluster: Cluster, tmp_path: Path) -> None:
    m = start_mount(fresh_cluster, tmp_path / "mnt")
    try:
        # A file at the root: the kernel keeps a directory's entry and
        # attributes a little while (ATTR_TIMEOUT), and the walk through one
        # would ask a getattr or nothing, depending on how long ago it asked.
        np.save(m.path / "slow.npy", np.zeros(3))
        fresh_cluster.signal("n1", signal.SIGSTOP)
        try:
            before = m.log().count("lookup: daemon n1")
            try:
                os.stat(m.path / "slow.npy")  # its entry is cached: revalidated, then looked up
                raise AssertionError("stat answered while a daemon is paused")
            except OSError as exc:
                assert exc.errno == errno.EIO
            assert m.log().count("lookup: daemon n1") - before == 1
        finally:
            fresh_cluster.signal("n1", signal.SIGCONT)
    finally:
        m.unmount()


def test_a_mount_whose_daemons_are_down_answers_eio_not_empty(tmp_path: Path) -> None:
    """With replicas, a listing skips a daemon that is down (its copies answer):
    with every daemon down, nothing answered and the root must not look empty."""
    cluster = make_cluster(tmp_path / "cluster", 2, replicas=2, timeout=2.0)
    try:
        m = start_mount(cluster, tmp_path / "mnt")
        try:
            (m.path / "d").mkdir()
            np.save(m.path / "w.npy", np.arange(3.0))
            assert sorted(os.listdir(m.path)) == ["d", "w.npy"]
            for name in cluster.names:
                cluster.stop(name)
            for call in (os.listdir, os.stat):
                for path in (m.path, m.path / "d", m.path / "w.npy"):
                    if call is os.stat and path == m.path:
                        continue  # the root's attributes need no daemon
                    with pytest.raises(OSError) as err:
                        call(path)
                    assert err.value.errno == errno.EIO, (call, path)
            proc = bash(f"ls -la {m.path}")
            assert proc.returncode != 0 and "Input/output error" in proc.stderr
            assert re.search(r"opendir: daemon n\d .* is unavailable", m.log()), m.log()
            status = irdma(cluster, "status", check=False)
            assert status.returncode == 1
            assert f"mount {m.path} (pid {m.proc.pid}): log in {m.log_path}" in status.stdout
        finally:
            m.unmount()
    finally:
        cluster.close()


def test_status_names_each_mounts_log(cluster: Cluster, tmp_path: Path) -> None:
    fg = start_mount(cluster, tmp_path / "fg")  # its stderr goes to a file
    try:
        (tmp_path / "bg").mkdir()
        (tmp_path / "bg.log").write_text("the last mount's log\n")
        started = subprocess.run(
            mount_command(
                cluster.config_path, str(tmp_path / "bg"), "--log", str(tmp_path / "bg.log")
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        try:
            assert started.returncode == 0, started.stderr
            bg_log = re.search(r"\(pid \d+, log (\S+);", started.stderr)[1]
            assert bg_log == str(tmp_path / "bg.log")
            # The previous log is kept once, beside it: no new file per mount.
            assert (tmp_path / "bg.log.1").read_text() == "the last mount's log\n"
            out = irdma(cluster, "status").stdout.splitlines()
            mounts = sorted(line for line in out if line.startswith("mount "))
            assert mounts[0].startswith(f"mount {tmp_path / 'bg'} (pid ")
            assert mounts[0].endswith(f"): log in {bg_log}")
            assert mounts[1] == f"mount {fg.path} (pid {fg.proc.pid}): log in {fg.log_path}"
        finally:
            subprocess.run(["fusermount3", "-u", str(tmp_path / "bg")], check=False, timeout=60)
    finally:
        fg.unmount()
    lines = irdma(cluster, "status").stdout.splitlines()
    assert not [line for line in lines if line.startswith("mount ")]  # gone once unmounted


def test_a_foreground_mount_logs_to_the_file_log_names(cluster: Cluster, tmp_path: Path) -> None:
    mnt = tmp_path / "fglog"
    mnt.mkdir()
    log = tmp_path / "fg.log"
    proc = subprocess.Popen(
        mount_command(cluster.config_path, str(mnt), "--foreground", "--log", str(log)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not os.path.ismount(mnt):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        status = irdma(cluster, "status").stdout
        assert f"mount {mnt} (pid {proc.pid}): log in {log}" in status
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], check=False, timeout=60)
        _, err = proc.communicate(timeout=60)
    assert err == b""  # everything went to the file
    assert f"serving {mnt}; this log goes to {log}" in log.read_text()


def test_mount_help_and_version_of_the_plugin_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "irdma", "mount", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "irdma status shows each mount" in proc.stdout
    text = " ".join(proc.stdout.split())  # as one line: argparse wraps the help
    assert text.count("(default: 16GiB)") == 1 and "17179869184" not in text
    assert "--log FILE" in text
