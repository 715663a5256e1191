"""deploy/: the systemd units, the install script, the sysusers entry and the example config.

`systemd-analyze verify` checks that each ExecStart= executable exists. The
units name the installed location (/opt/irdma/.venv/bin/...), which does not
exist here, so they are verified as deploy/install.sh stages them with
DESTDIR= and VENV= this test run's venv, which holds the same psd and irdma
executables: what is verified is exactly what the script would install, with
only the venv path changed. Running the units under a real systemd (PID 1)
is done in a VM: tests/systemd/test_units_in_vm.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from irdma.cluster import load_config

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNIT_SUFFIXES = (".service", ".mount", ".target", ".socket", ".timer")
INSTALLED_AT = "/opt/irdma/.venv"
# Options that give a service its own mount namespace: a FUSE mount made
# there would be invisible to everyone else.
NAMESPACING = (
    "ProtectSystem",
    "ProtectHome",
    "PrivateTmp",
    "PrivateDevices",
    "PrivateMounts",
    "ReadWritePaths",
    "ReadOnlyPaths",
    "InaccessiblePaths",
    "ProtectKernelTunables",
    "ProtectKernelModules",
    "ProtectKernelLogs",
    "ProtectControlGroups",
    "ProtectProc",
    "ProcSubset",
    "TemporaryFileSystem",
    "BindPaths",
    "StateDirectory",
    "DynamicUser",
)


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: deploy/setup.sh installs it (apt package systemd)")
    return path


def units() -> list[Path]:
    return sorted(p for p in DEPLOY.iterdir() if p.suffix in UNIT_SUFFIXES)


def directives(path: Path) -> dict[str, list[str]]:
    """KEY -> values, in order (unit files repeat keys such as After=)."""
    out: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """deploy/install.sh run with DESTDIR (staging only) and this run's venv."""
    dest = tmp_path_factory.mktemp("destdir")
    subprocess.run(
        ["bash", str(DEPLOY / "install.sh")],
        env={**os.environ, "DESTDIR": str(dest), "VENV": sys.prefix},
        check=True,
        capture_output=True,
    )
    return dest


def verify(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("systemd-analyze"), "verify", "--man=no", *map(str, paths)],
        capture_output=True,
        text=True,
    )


def test_the_units_point_at_the_documented_install_location() -> None:
    for unit in units():
        execs = [v for k, vs in directives(unit).items() if k == "ExecStart" for v in vs]
        assert execs and all(e.startswith(f"{INSTALLED_AT}/bin/") for e in execs), unit.name


def test_install_stages_every_unit_pointed_at_its_venv(staged: Path) -> None:
    unit_dir = staged / "etc/systemd/system"
    assert sorted(p.name for p in unit_dir.iterdir()) == [p.name for p in units()]
    for unit in units():
        text = (unit_dir / unit.name).read_text()
        assert text == unit.read_text().replace(INSTALLED_AT, sys.prefix)
    for exe in ("psd", "irdma"):
        assert os.access(Path(sys.prefix) / "bin" / exe, os.X_OK)
    assert (staged / "etc/irdma/cluster.toml").read_text() == (
        DEPLOY / "cluster.toml.example"
    ).read_text()


def test_systemd_analyze_verify_every_unit(staged: Path) -> None:
    unit_dir = staged / "etc/systemd/system"
    # The template is verified as an instance too, with a node name of the example.
    instance = unit_dir / "psd@n1.service"
    shutil.copy(unit_dir / "psd@.service", instance)
    try:
        result = verify(*sorted(unit_dir.iterdir()))
    finally:
        instance.unlink()
    # verify exits 0 on warnings (unknown keys, bad values): they must not be there either.
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result


def test_verify_catches_a_missing_executable_and_a_bad_key(tmp_path: Path) -> None:
    """The check above is only worth something if verify reports what it should."""
    unit = tmp_path / "psd@.service"
    unit.write_text((DEPLOY / "psd@.service").read_text())
    result = verify(unit)  # /opt/irdma/.venv/bin/psd does not exist here
    assert result.returncode != 0 and "not executable" in result.stderr
    unit.write_text(
        (DEPLOY / "psd@.service")
        .read_text()
        .replace(INSTALLED_AT, sys.prefix)
        .replace("Type=notify", "Type=notifyy")
    )
    result = verify(unit)
    assert "notifyy" in result.stdout + result.stderr


def test_sysusers_entry_creates_the_irdma_user(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    result = subprocess.run(
        [
            tool("systemd-sysusers"),
            f"--root={tmp_path}",
            "--dry-run",
            str(DEPLOY / "irdma.sysusers.conf"),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result
    assert "Creating user 'irdma'" in result.stdout + result.stderr


def test_psd_unit_settings() -> None:
    d = directives(DEPLOY / "psd@.service")
    assert d["Type"] == ["notify"]
    assert d["ExecStart"] == [f"{INSTALLED_AT}/bin/psd --config /etc/irdma/cluster.toml --node %i"]
    assert d["LimitMEMLOCK"] == ["infinity"]
    assert d["Restart"] == ["on-failure"]
    assert d["WatchdogSec"] and d["User"] == ["irdma"]
    assert d["StateDirectory"] == ["irdma/%i"]
    assert d["ProtectSystem"] == ["strict"] and d["NoNewPrivileges"] == ["yes"]
    assert "network-online.target" in d["After"] and "network-online.target" in d["Wants"]
    # RDMA needs /dev/infiniband: nothing that closes the device list.
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"):
        assert key not in d
    # Ready daemons on this host come before the mount.
    assert "irdma-mount.service" in d["Before"]


def test_mount_unit_mounts_where_everyone_sees_it() -> None:
    d = directives(DEPLOY / "irdma-mount.service")
    assert d["Type"] == ["notify"]
    (start,) = d["ExecStart"]
    assert " mount /mnt/params --foreground" in start
    assert "network-online.target" in d["After"] and "network-online.target" in d["Wants"]
    for key in (*NAMESPACING, "DeviceAllow", "DevicePolicy", "ProtectClock"):
        assert key not in d, key


def test_example_config_matches_the_units() -> None:
    config = load_config(DEPLOY / "cluster.toml.example")
    for node in config.nodes:
        # StateDirectory=irdma/%i is the only writable place the unit gives psd.
        assert node.data_dir == Path("/var/lib/irdma") / node.name
    assert config.log_level == "INFO"
