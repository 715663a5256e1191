"""irdma doctor: RDMA checks on a fake /sys tree, FUSE and daemons for real."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from irdma.cli.doctor import (
    Finding,
    Host,
    Level,
    can_read_write,
    check_fuse,
    check_memlock,
    check_rdma,
    parse_ibv_devinfo,
    roce_mtu,
    run_checks,
)
from irdma.cli.local import write_config
from irdma.cluster import load_config, parse_config

from .helpers.cluster import Cluster

pytestmark = pytest.mark.timeout(60)

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
IBV_DEVINFO = """\
hca_id:\trxe0
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t0.0.0
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tactive_mtu:\t\t2048 (4)
\t\t\tlink_layer:\t\tEthernet
"""


def v4_gid(ip: str) -> str:
    a, b, c, d = (int(x) for x in ip.split("."))
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


class FakeHost:
    """A /sys and /dev tree with the files the checks read, as the kernel writes them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sys = root / "sys"
        self.dev = root / "dev"
        (self.sys / "class/infiniband").mkdir(parents=True)
        self.dev.mkdir()

    def port(
        self,
        device: str,
        number: int = 1,
        *,
        state: str = "4: ACTIVE",
        phys: str = "5: LinkUp",
        link_layer: str = "Ethernet",
        gids: Sequence[tuple[str, str, str]] = (),
        uverbs: int | None = 0,
    ) -> None:
        p = self.sys / "class/infiniband" / device / "ports" / str(number)
        for d in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (p / d).mkdir(parents=True, exist_ok=True)
        (p / "state").write_text(state + "\n")
        (p / "phys_state").write_text(phys + "\n")
        (p / "link_layer").write_text(link_layer + "\n")
        for i, (gid, kind, ndev) in enumerate([*gids, (ZERO, "", "")]):
            (p / "gids" / str(i)).write_text(gid + "\n")
            if kind:  # the kernel refuses to read the attributes of an empty entry
                (p / "gid_attrs/types" / str(i)).write_text(kind + "\n")
                (p / "gid_attrs/ndevs" / str(i)).write_text(ndev + "\n")
        if uverbs is not None:
            u = self.sys / "class/infiniband_verbs" / f"uverbs{uverbs}"
            u.mkdir(parents=True, exist_ok=True)
            (u / "ibdev").write_text(device + "\n")
            node = self.dev / "infiniband" / f"uverbs{uverbs}"
            node.parent.mkdir(exist_ok=True)
            node.touch()
            node.chmod(0o666)

    def netdev(self, name: str, mtu: int) -> None:
        d = self.sys / "class/net" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "mtu").write_text(f"{mtu}\n")

    def host(self, **kwargs) -> Host:
        return Host(sysfs=self.sys, dev=self.dev, **{"ibv_devinfo": None, **kwargs})


@pytest.fixture
def fake(tmp_path: Path) -> FakeHost:
    return FakeHost(tmp_path)


def by_subject(findings: list[Finding]) -> dict[str, Finding]:
    return {f.subject: f for f in findings}


def rxe(fake: FakeHost, *, mtu: int = 1500, kinds: tuple[str, ...] = ("RoCE v2",)) -> None:
    gids = [("fe80:0000:0000:0000:5054:00ff:fe12:3456", "IB/RoCE v1", "eth0")]
    gids += [(v4_gid("10.0.0.5"), kind, "eth0") for kind in kinds]
    fake.port("rxe0", gids=gids)
    fake.netdev("eth0", mtu)


def test_an_active_roce_port_with_a_v2_ipv4_gid(fake: FakeHost) -> None:
    rxe(fake, kinds=("IB/RoCE v1", "RoCE v2"))
    found = by_subject(check_rdma(fake.host(), None))
    assert found["rxe0 port 1"].level == Level.OK
    assert "ACTIVE (LinkUp, Ethernet)" in found["rxe0 port 1"].detail
    gids = found["rxe0 port 1 GIDs"]
    assert gids.level == Level.OK and "[2] 10.0.0.5 on eth0" in gids.detail
    # 1500 - RoCE headers leaves room for 1024-byte RDMA packets: works, but slowly.
    mtu = found["rxe0 port 1 MTU"]
    assert mtu.level == Level.WARN and "RDMA MTU 1024" in mtu.detail
    assert "ip link set dev eth0 mtu 9000" in (mtu.fix or "")
    verbs = found["rxe0 verbs"]
    assert verbs.level == Level.OK and str(fake.dev / "infiniband/uverbs0") in verbs.detail


def test_jumbo_frames_give_4096(fake: FakeHost) -> None:
    rxe(fake, mtu=9000)
    mtu = by_subject(check_rdma(fake.host(), None))["rxe0 port 1 MTU"]
    assert mtu.level == Level.OK and "RDMA MTU 4096" in mtu.detail
    assert [roce_mtu(m) for m in (1500, 2200, 4200, 9000, 576)] == [1024, 2048, 4096, 4096, 256]


def test_the_config_cannot_ask_for_more_than_the_active_mtu(fake: FakeHost) -> None:
    rxe(fake)
    config = parse_config(
        {"rdma_mtu": 4096, "nodes": [{"name": "a", "address": "10.9.9.9:1", "arena_size": "1MiB"}]}
    )
    found = [f for f in check_rdma(fake.host(), config) if f.level == Level.FAIL]
    assert len(found) == 1 and "rdma_mtu 4096 is larger than the active MTU 1024" in found[0].detail


def test_ibv_devinfo_active_mtu_wins_over_the_estimate(fake: FakeHost, tmp_path: Path) -> None:
    assert parse_ibv_devinfo(IBV_DEVINFO) == {("rxe0", 1): 2048}
    tool = tmp_path / "ibv_devinfo"
    tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{IBV_DEVINFO}EOF\n")
    tool.chmod(0o755)
    rxe(fake, mtu=9000)
    mtu = by_subject(check_rdma(fake.host(ibv_devinfo=str(tool)), None))["rxe0 port 1 MTU"]
    assert mtu.level == Level.WARN and "RDMA MTU 2048 (ibv_devinfo; eth0 9000)" in mtu.detail


def test_roce_v1_only_fails_with_the_fix(fake: FakeHost) -> None:
    rxe(fake, kinds=("IB/RoCE v1",))
    gids = by_subject(check_rdma(fake.host(), None))["rxe0 port 1 GIDs"]
    assert gids.level == Level.FAIL and "RoCE v1 only" in gids.detail
    assert "cma_roce_mode -d rxe0 -p 1 -m 2" in (gids.fix or "")


def test_no_ipv4_address_on_the_netdev_fails(fake: FakeHost) -> None:
    rxe(fake, kinds=())
    gids = by_subject(check_rdma(fake.host(), None))["rxe0 port 1 GIDs"]
    assert gids.level == Level.FAIL and "no GID maps an IPv4 address" in gids.detail
    assert "ip addr add A.B.C.D/NN dev eth0" in (gids.fix or "")


def test_a_down_port_fails_unless_another_is_active(fake: FakeHost, tmp_path: Path) -> None:
    fake.port("mlx5_0", 1, state="1: DOWN", phys="3: Disabled")
    alone = by_subject(check_rdma(fake.host(), None))["mlx5_0 port 1"]
    assert alone.level == Level.FAIL and "ip link set ETH up" in (alone.fix or "")
    fake.port("mlx5_0", 2, gids=[(v4_gid("10.0.0.6"), "RoCE v2", "eth1")])
    found = by_subject(check_rdma(fake.host(), None))
    assert found["mlx5_0 port 1"].level == Level.WARN  # an uncabled second port
    assert found["mlx5_0 port 2"].level == Level.OK
    assert "mlx5_0 port 1 GIDs" not in found  # a port that is down is not examined further


def test_infiniband_port_without_a_subnet_manager(fake: FakeHost) -> None:
    fake.port("mlx4_0", state="2: INIT", phys="5: LinkUp", link_layer="InfiniBand")
    port = by_subject(check_rdma(fake.host(), None))["mlx4_0 port 1"]
    assert port.level == Level.FAIL and "opensm" in (port.fix or "")


def test_missing_uverbs_device(fake: FakeHost) -> None:
    rxe(fake)
    (fake.dev / "infiniband/uverbs0").unlink()
    verbs = by_subject(check_rdma(fake.host(), None))["rxe0 verbs"]
    assert verbs.level == Level.FAIL and "modprobe ib_uverbs" in (verbs.fix or "")


def test_device_access_by_mode(tmp_path: Path) -> None:
    node = tmp_path / "uverbs0"
    node.touch()
    node.chmod(0o600)
    os.chown(node, 0, 0)
    assert not can_read_write(node, 12345, {12345})
    assert can_read_write(node, 0, {0})
    node.chmod(0o660)
    assert can_read_write(node, 12345, {0, 12345})  # in the file's group
    node.chmod(0o666)
    assert can_read_write(node, 12345, {12345})


def test_no_rdma_device(fake: FakeHost) -> None:
    (found,) = check_rdma(fake.host(), None)
    assert found.level == Level.WARN and "clients use TCP or shared memory" in found.detail
    assert "modprobe rdma_rxe" in (found.fix or "")
    config = parse_config(
        {"nodes": [{"name": "a", "address": "rdma://10.9.9.9:1", "arena_size": "1MiB"}]}
    )
    (found,) = check_rdma(fake.host(), config)
    assert found.level == Level.FAIL and "nodes a are configured as rdma://" in found.detail


def test_a_node_on_this_host_needs_the_gid_of_its_address(fake: FakeHost) -> None:
    def config(scheme: str):
        return parse_config(
            {"nodes": [{"name": "a", "address": f"{scheme}://127.0.0.1:7", "arena_size": "1MiB"}]}
        )

    rxe(fake)  # a GID for 10.0.0.5 only
    node = by_subject(check_rdma(fake.host(), config("tcp")))["node a (127.0.0.1)"]
    assert node.level == Level.WARN and "no RDMA device has a RoCE v2 GID for 127.0.0.1" in (
        node.detail
    )
    node = by_subject(check_rdma(fake.host(), config("rdma")))["node a (127.0.0.1)"]
    assert node.level == Level.FAIL
    fake.port("rxe_lo", gids=[(v4_gid("127.0.0.1"), "RoCE v2", "lo")], uverbs=1)
    node = by_subject(check_rdma(fake.host(), config("rdma")))["node a (127.0.0.1)"]
    assert node.level == Level.OK and node.detail == "RoCE v2 GID [0] on rxe_lo port 1"


# -- memlock --------------------------------------------------------------------------


def fake_proc(root: Path, pid: int, memlock: str, cap_eff: int) -> Path:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "limits").write_text(
        "Limit                     Soft Limit           Hard Limit           Units\n"
        f"Max locked memory         {memlock}              {memlock}              bytes\n"
    )
    (d / "status").write_text(f"Name:\tpsd\nCapEff:\t{cap_eff:016x}\n")
    return root / "proc"


def local_config(tmp_path: Path):
    return load_config(write_config(tmp_path / "c", 1, arena_size=64 << 20))


def test_memlock_below_the_arena_of_a_running_daemon(tmp_path: Path) -> None:
    config = local_config(tmp_path)
    proc = fake_proc(tmp_path, 4242, str(8 << 20), 0)
    (f,) = check_memlock(Host(proc=proc), config, {"n1": 4242}, rdma=True)
    assert f.level == Level.FAIL and f.subject == "psd n1 (pid 4242)"
    assert "RLIMIT_MEMLOCK 8.0 MiB < arena 64.0 MiB" in f.detail
    assert "LimitMEMLOCK=infinity" in (f.fix or "") and "ulimit -l unlimited" in (f.fix or "")
    (f,) = check_memlock(Host(proc=proc), config, {"n1": 4242}, rdma=False)
    assert f.level == Level.WARN and "only RDMA registers it" in f.detail


def test_memlock_unlimited_or_cap_ipc_lock(tmp_path: Path) -> None:
    config = local_config(tmp_path)
    proc = fake_proc(tmp_path, 1, "unlimited", 0)
    fake_proc(tmp_path, 2, str(8 << 20), 1 << 14)
    (f,) = check_memlock(Host(proc=proc), config, {"n1": 1}, rdma=True)
    assert f.level == Level.OK and f.detail == "limit unlimited, arena 64.0 MiB"
    (f,) = check_memlock(Host(proc=proc), config, {"n1": 2}, rdma=True)
    assert f.level == Level.OK and "lifted by CAP_IPC_LOCK" in f.detail


def test_memlock_of_a_daemon_not_running_is_this_shells(tmp_path: Path) -> None:
    config = local_config(tmp_path)
    (f,) = check_memlock(Host(), config, {}, rdma=True)
    assert f.subject == "psd n1 (not running here: this shell's limit)"
    assert f.level in (Level.OK, Level.WARN)  # never FAIL: psd@.service sets its own limit


def test_memlock_with_no_node_here() -> None:
    config = parse_config(
        {"nodes": [{"name": "far", "address": "192.0.2.1:7401", "arena_size": "1GiB"}]}
    )
    (f,) = check_memlock(Host(), config, {}, rdma=True)
    assert f.level == Level.OK and "no node" in f.detail


# -- fuse -----------------------------------------------------------------------------


def test_real_dev_fuse_and_fusermount() -> None:
    found = by_subject(check_fuse(Host()))
    fuse = found["/dev/fuse"]
    assert fuse.level == Level.OK and "device 10:229, read-write" in fuse.detail
    fusermount = shutil.which("fusermount3")
    assert fusermount and found[fusermount].level == Level.OK
    kernel = found[f"Linux {os.uname().release}"]
    assert kernel.level == Level.OK and "own session, passthrough" in kernel.detail


@pytest.mark.parametrize(
    ("release", "euid", "level", "said"),
    [
        ("6.18.0-1-amd64", 0, Level.OK, "own session, passthrough"),
        ("6.9.1", 1000, Level.OK, "passthrough needs root"),
        ("6.1.0-27-amd64", 0, Level.OK, "no passthrough before Linux 6.9"),
        ("5.17.0", 0, Level.OK, "no passthrough"),
        ("5.10.0-33-amd64", 0, Level.WARN, "--session pyfuse3"),  # pyfuse3 is installed here
    ],
)
def test_the_kernel_decides_the_mounts_session_and_passthrough(
    release: str, euid: int, level: Level, said: str
) -> None:
    host = dataclasses.replace(Host(), kernel=release, euid=euid)
    kernel = by_subject(check_fuse(host))[f"Linux {release}"]
    assert kernel.level == level and said in kernel.detail, kernel


def test_an_old_kernel_without_pyfuse3_cannot_mount(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "pyfuse3" else real(name, *a)
    )
    host = dataclasses.replace(Host(), kernel="4.18.0-553.el8_10.x86_64")
    kernel = by_subject(check_fuse(host))["Linux 4.18.0-553.el8_10.x86_64"]
    assert kernel.level == Level.FAIL and "irdma[fuse]" in (kernel.fix or ""), kernel


def test_missing_or_fake_dev_fuse(fake: FakeHost) -> None:
    fuse = by_subject(check_fuse(fake.host()))[str(fake.dev / "fuse")]
    assert fuse.level == Level.FAIL and "modprobe fuse" in (fuse.fix or "")
    (fake.dev / "fuse").touch()
    fuse = by_subject(check_fuse(fake.host()))[str(fake.dev / "fuse")]
    assert fuse.level == Level.FAIL and "not a character device" in fuse.detail


def test_fusermount_for_a_user_must_be_setuid_root(tmp_path: Path) -> None:
    real = shutil.which("fusermount3")
    assert real is not None
    st = os.stat(real)
    assert st.st_mode & stat.S_ISUID, "fuse3's fusermount3 is installed setuid root"
    user = by_subject(check_fuse(Host(euid=1000, fuse_conf=tmp_path / "none")))
    assert user[real].level == Level.OK and user[real].detail == "setuid root"
    copy = tmp_path / "fusermount3"
    shutil.copy(real, copy)
    copy.chmod(0o755)  # installed without the setuid bit
    f = by_subject(check_fuse(Host(euid=1000, fusermount=str(copy))))[str(copy)]
    assert f.level == Level.FAIL and "chmod u+s" in (f.fix or "")
    f = by_subject(check_fuse(Host(euid=1000, fusermount=None)))["fusermount3"]
    assert f.level == Level.FAIL and f.fix == "apt install fuse3"
    assert by_subject(check_fuse(Host(euid=0, fusermount=None)))["fusermount3"].level == Level.WARN


def test_user_allow_other_for_non_root(tmp_path: Path) -> None:
    conf = tmp_path / "fuse.conf"
    conf.write_text("# mount_max = 1000\n")
    f = by_subject(check_fuse(Host(euid=1000, fuse_conf=conf)))[conf.as_posix()]
    assert f.level == Level.WARN and "user_allow_other" in (f.fix or "")
    conf.write_text("user_allow_other\n")
    assert by_subject(check_fuse(Host(euid=1000, fuse_conf=conf)))[conf.as_posix()].level == (
        Level.OK
    )
    assert conf.as_posix() not in by_subject(check_fuse(Host(euid=0, fuse_conf=conf)))


# -- daemons, for real ----------------------------------------------------------------


async def test_one_daemon_down_fails_naming_it(fresh_cluster: Cluster) -> None:
    fresh_cluster.stop("n2")
    findings = await run_checks(Host(), fresh_cluster.config, ["daemons", "memlock"], 1.0)
    daemons = {f.subject.split()[0]: f for f in findings if f.topic == "daemons"}
    assert daemons["n1"].level == Level.OK and "answers (pid" in daemons["n1"].detail
    assert daemons["n3"].level == Level.OK
    assert daemons["n2"].level == Level.FAIL and "n2" in daemons["n2"].detail
    assert "systemctl start psd@n2" in (daemons["n2"].fix or "")
    memlock = {f.subject: f for f in findings if f.topic == "memlock"}
    assert f"psd n1 (pid {fresh_cluster.pid('n1')})" in memlock  # read from the daemon itself
    assert "psd n2 (not running here: this shell's limit)" in memlock


def doctor(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "irdma",
            "--config",
            str(config),
            "--timeout",
            "1",
            "doctor",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_cli_exit_status(fresh_cluster: Cluster) -> None:
    # rdma is skipped: what this host has is not up to the test.
    ok = doctor(fresh_cluster.config_path, "--skip", "rdma")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "FAIL" not in ok.stdout and ok.stdout.count("OK   daemons") == 3
    fresh_cluster.stop("n3")
    bad = doctor(fresh_cluster.config_path, "--skip", "rdma", "--skip", "fuse")
    assert bad.returncode == 1
    (line,) = [x for x in bad.stdout.splitlines() if x.startswith("FAIL")]
    assert line.startswith("FAIL daemons n3 tcp://127.0.0.1:") and "fix: systemctl start" in line
    assert "1 FAIL" in bad.stderr


def test_cli_reports_a_broken_config(tmp_path: Path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text("nodes = 3\n")
    result = doctor(path, "--skip", "rdma", "--json")
    assert result.returncode == 1
    assert '"level": "FAIL"' in result.stdout and '"topic": "config"' in result.stdout
