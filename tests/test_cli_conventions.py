"""How ``irdma`` behaves as a command: help, options, Ctrl-C, pipes, completion."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from irdma import __version__

from .helpers.cluster import Cluster, make_cluster
from .test_cli import irdma


def test_version_and_python_m() -> None:
    assert irdma(None, "--version").stdout.strip() == f"irdma {__version__}"
    out = subprocess.run(
        [sys.executable, "-m", "irdma", "--version"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == f"irdma {__version__}"
    psd = subprocess.run(
        [sys.executable, "-m", "irdma_psd.main", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert psd.returncode == 0 and psd.stdout.strip() == f"psd {__version__}"


@pytest.mark.parametrize(
    "command",
    ["local", "put", "get", "cp", "mv", "ls", "stat", "rm", "status", "doctor", "bench", "mount"],
)
def test_every_subcommand_has_a_description_and_every_option_help(command: str) -> None:
    from irdma.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices[command]
    assert p.description and len(p.description) > 30
    for action in p._actions:
        assert action.help, f"irdma {command}: {action.option_strings or action.dest} has no help"
    text = p.format_help()
    if command == "local":
        assert "(default: 3)" in text and "(default: 1GiB)" in text


def test_global_options_after_the_subcommand(cluster: Cluster, tmp_path: Path) -> None:
    env = {"IRDMA_CONFIG": str(tmp_path / "wrong.toml")}
    assert irdma(None, "ls", "--config", str(cluster.config_path), env=env).returncode == 0
    assert irdma(None, "--config", str(cluster.config_path), "ls", env=env).returncode == 0
    proc = irdma(None, "status", "--config", str(tmp_path / "nope.toml"), check=False)
    assert proc.returncode == 2 and "nope.toml: config file not found" in proc.stderr


def test_ls_lh_does_not_print_help(cluster: Cluster) -> None:
    proc = irdma(cluster, "ls", "-lh")
    assert "usage:" not in proc.stdout and "usage:" not in proc.stderr
    assert "usage:" in irdma(cluster, "ls", "--help").stdout


def connected_to(pid: int, port: int) -> bool:
    """Whether process ``pid`` has an established TCP connection to local port ``port``."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        remote_port = int(f[2].split(":")[1], 16)
        if remote_port == port and f[3] == "01" and f[9] in inodes:
            return True
    return False


def default_sigint() -> None:
    """In the child before exec: Ctrl-C's default disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("command", [["status"], ["stat", "x"], ["ls"]])
def test_ctrl_c_while_a_daemon_hangs_exits_130_without_traceback(
    tmp_path: Path, command: list[str]
) -> None:
    cluster = make_cluster(tmp_path, nodes=1, timeout=60.0)
    try:
        cluster.signal("n1", signal.SIGSTOP)
        port = cluster.config.node("n1").address.port
        env = dict(os.environ, IRDMA_CONFIG=str(cluster.config_path), IRDMA_TRANSPORT="tcp")
        proc = subprocess.Popen(
            [sys.executable, "-m", "irdma", *command, "--timeout", "60"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            # As in a terminal: a suite started in the background by a script
            # (`tests/run.sh &`) has SIGINT ignored, which its children inherit
            # and Python then keeps (no KeyboardInterrupt, by convention).
            preexec_fn=default_sigint,
        )
        try:
            # The command waits for the hung daemon once it has connected to it.
            deadline = time.monotonic() + 30
            while not connected_to(proc.pid, port):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "never connected to the daemon"
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            err = proc.communicate(timeout=30)[1]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 130
        assert "Traceback" not in err and "KeyboardInterrupt" not in err
        assert err.strip() == ""
    finally:
        cluster.close()


def test_a_closed_pipe_ends_quietly(cluster: Cluster) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head` that has already exited
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "irdma", "status", "--json"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ, IRDMA_CONFIG=str(cluster.config_path)),
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert proc.returncode == 141
    assert proc.stderr == ""


def test_status_does_not_wait_the_whole_timeout_for_a_paused_daemon(tmp_path: Path) -> None:
    cluster = make_cluster(tmp_path, timeout=60.0)
    try:
        cluster.signal("n2", signal.SIGSTOP)
        proc = irdma(cluster, "status", check=False)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        rows = [line for line in proc.stdout.splitlines() if line.startswith("n2")]
        assert len(rows) == 2, proc.stdout + proc.stderr
        assert rows[0].split()[3] == "down"
        assert rows[1] == "n2: no answer within 2 s (hung, overloaded or unreachable)"
    finally:
        cluster.close()


def test_shell_completion() -> None:
    pytest.importorskip("argcomplete", reason="argcomplete is the optional 'completion' extra")
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"irdma-complete-{os.getpid()}"
    try:
        env = dict(
            os.environ,
            _ARGCOMPLETE="1",
            COMP_LINE="irdma st",
            COMP_POINT="8",
            _ARGCOMPLETE_STDOUT_FILENAME=str(out),
        )
        subprocess.run([sys.executable, "-m", "irdma"], env=env, timeout=60, check=True)
        assert sorted(out.read_text().split("\v")) == ["stat", "status"]
    finally:
        out.unlink(missing_ok=True)
