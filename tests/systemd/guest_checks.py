"""The units of deploy/ under systemd as PID 1: run in the guest by guest_run.sh.

Usage: /opt/irdma/.venv/bin/python guest_checks.py RESULTS.json

The checks share one cluster (three psd@ instances on rdma:// addresses,
two copies of each shard, the units and the venv as deploy/install.sh lays
them out) and run in order, each building on the state the previous one
left:

- ``start_waits_for_ready``: ``systemctl start psd@n1`` returns once the unit
  is active, which systemd only makes it on READY=1; the unit is seen
  "activating" meanwhile, and a HELLO sent at once is answered by its MainPID.
- ``mount_after_daemons``: the units enabled as an operator would, then
  irdma-mount, psd@n2 and psd@n3 started in one transaction, as at boot (a
  target that wants them): the mount's job begins only after every daemon is
  active (psd@ says Before=irdma-mount.service), /mnt/params is a FUSE
  mount, and a tensor written through the client shows there as a .npy file.
- ``rdma_under_hardening``: each sandboxed daemon opened the soft-RoCE device
  and registered its arena (LimitMEMLOCK=infinity), and a client forced onto
  rdma:// writes and reads through them.
- ``sigkill_restarts_and_catches_up``: SIGKILL psd@n2; writes go on (the
  other replicas); systemd restarts it (NRestarts + 1, a new MainPID) and it
  catches up: ready, every shard placement gives it at the newest version.
- ``watchdog_restarts_hung``: SIGSTOP psd@n1's main process: after
  WatchdogSec systemd kills it (Result=watchdog) and restarts it; it rejoins.
- ``stop_leaves_snapshot``: ``systemctl stop psd@n1`` writes the final
  snapshot (snapshot_interval = 0, so only a stop writes one) and exits 0;
  started again, the daemon loads that snapshot.
- ``mount_stops_cleanly``: stopping irdma-mount unmounts /mnt/params.

Each check is recorded as {"name", "ok", "seconds", "detail"} in the JSON
file (rewritten after every check, so a guest that dies midway leaves what
it had); a check that raises is recorded as failed with its traceback. The
journal of the boot goes to journal.txt next to it.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import trio

from irdma.cli.status import gather
from irdma.client import AsyncClient
from irdma.cluster import load_config
from irdma.protocol import tensor_key

CONFIG = "/etc/irdma/cluster.toml"
NODES = ("n1", "n2", "n3")
MOUNT_UNIT = "irdma-mount.service"
MNT = Path("/mnt/params")
T0 = time.monotonic()
# Under qemu's emulation a Python process takes 5-10 s just to import irdma.
READY_TIMEOUT = 180


def psd(node: str) -> str:
    return f"psd@{node}.service"


def say(msg: str) -> None:
    print(f"[checks {time.monotonic() - T0:7.1f}s] {msg}", flush=True)


class CheckFailed(Exception):
    pass


async def run(*cmd: str) -> tuple[int, str]:
    """Run a command; its exit code and its output (stdout and stderr)."""
    done = await trio.run_process(
        list(cmd), capture_stdout=True, stderr=subprocess.STDOUT, check=False
    )
    return done.returncode, done.stdout.decode(errors="replace")


async def show(unit: str, *props: str) -> dict[str, str]:
    _, out = await run("systemctl", "show", unit, "--property=" + ",".join(props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


async def journal(unit: str, since: float) -> str:
    """The unit's journal (its output and systemd's lines about it) since wall time ``since``."""
    _, out = await run(
        "journalctl", "--no-pager", "-o", "short-monotonic", "-u", unit, f"--since=@{int(since)}"
    )
    return out


async def until(what: str, probe: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    """Poll ``probe`` until it returns something true; CheckFailed after ``timeout`` s."""
    deadline = trio.current_time() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if trio.current_time() > deadline:
            raise CheckFailed(f"{what}: not within {timeout:.0f} s")
        await trio.sleep(1.0)


def timespan(text: str) -> float:
    """Seconds in a systemd time span as `systemctl show` prints it ("30s", "1min 30s", "500ms")."""
    units = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
    total = 0.0
    for number, unit in re.findall(r"([\d.]+)\s*(us|ms|min|s|h)", text):
        total += float(number) * units[unit]
    return total


async def cluster_ready(
    client: AsyncClient, last: list[list[dict[str, Any]]] | None = None
) -> list[dict[str, Any]] | None:
    """Every daemon up, caught up (ready) and with no shard behind: their status rows; else
    None (the rows seen go to ``last``, for the failure message)."""
    rows = await gather(client)
    seen = [r.to_dict() for r in rows]
    if last is not None:
        last[:] = [seen]
    if all(r.up and (r.hello or {}).get("ready") and r.skew == 0 for r in rows):
        return seen
    return None


async def shards_behind(client: AsyncClient) -> dict[str, list[dict[str, Any]]]:
    """Per daemon, the shards it keeps (or should) at a version below another copy's:
    each with every daemon's version of it (None: not held there)."""
    config = client.config
    versions: dict[str, dict[tuple[int, int], int]] = {}
    for node in config.nodes:
        mine = versions[node.name] = {}
        for rec in await client.holdings(node):
            for index, version in (rec.shards or {}).items():
                mine[rec.meta.key, index] = version
    shards = {s for held in versions.values() for s in held}
    out: dict[str, list[dict[str, Any]]] = {}
    for node in config.nodes:
        for key, index in sorted(shards):
            newest = max(held.get((key, index), -1) for held in versions.values())
            have = versions[node.name].get((key, index))
            if (have is None and config.holds(node.name, key, index)) or (
                have is not None and have < newest
            ):
                out.setdefault(node.name, []).append(
                    {
                        "key": f"{key:#x}",
                        "shard": index,
                        "primary": config.primary_for(key, index).name,
                        "versions": {n: versions[n].get((key, index)) for n in versions},
                    }
                )
    return out


async def wait_cluster_ready(client: AsyncClient) -> list[dict[str, Any]]:
    last: list[list[dict[str, Any]]] = []
    try:
        return await until(
            "every daemon up and ready", lambda: cluster_ready(client, last), READY_TIMEOUT
        )
    except CheckFailed as exc:
        # What the cluster looked like at the end, and which shards were behind on
        # whom (a failure seen once under load left nothing else to go on).
        try:
            behind: Any = await shards_behind(client)
        except Exception as inner:
            behind = f"not known: {type(inner).__name__}: {inner}"
        raise CheckFailed(
            f"{exc}; last status: {json.dumps(last[-1] if last else None)}; "
            f"shards behind: {json.dumps(behind)}"
        ) from None


async def restarted(unit: str, restarts_before: int) -> dict[str, str] | None:
    s = await show(unit, "ActiveState", "SubState", "NRestarts", "MainPID", "Result")
    if int(s.get("NRestarts", "0")) > restarts_before and s.get("ActiveState") == "active":
        return s
    return None


# -- the checks ----------------------------------------------------------------
# Each fills ``detail`` as it goes (so a check that fails midway still shows
# what it saw) and returns whether it passed.


async def check_start(detail: dict[str, Any], tcp: AsyncClient) -> bool:
    unit = psd("n1")
    seen: list[str] = detail.setdefault("states_seen_during_start", [])
    stop = trio.Event()

    async def watch() -> None:
        while not stop.is_set():
            s = await show(unit, "ActiveState", "SubState", "StatusText")
            state = f"{s.get('ActiveState')}/{s.get('SubState')} ({s.get('StatusText', '')})"
            if not seen or seen[-1] != state:
                seen.append(state)
            await trio.sleep(0.3)

    t = trio.current_time()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch)
        code, out = await run("systemctl", "start", unit)
        took = trio.current_time() - t
        stop.set()
    after = await show(unit, "ActiveState", "SubState", "MainPID", "StatusText", "Type")
    detail.update(systemctl_start_rc=code, output=out.strip(), start_s=round(took, 1))
    detail["after_start"] = after
    # At once, one attempt: systemctl start has returned, so the daemon answers.
    hello = await tcp.hello(tcp.config.node("n1"))
    detail.update(hello_pid=hello.get("pid"), hello_ready=hello.get("ready"))
    activating = any(state.startswith("activating/") for state in seen)
    detail["activating_seen"] = activating
    return (
        code == 0
        and after.get("Type") == "notify"
        and after.get("ActiveState") == "active"
        and hello.get("pid") == int(after.get("MainPID", "0"))
        # Observable whenever the start took a moment (it takes seconds under TCG).
        and (activating or took < 2.0)
    )


BOOT_TARGET = "irdma-boot-test.target"


async def check_mount(detail: dict[str, Any], client: AsyncClient) -> bool:
    # As an operator does; the units' [Install] sections hang them on multi-user.target.
    units = (*map(psd, NODES), MOUNT_UNIT)
    code, out = await run("systemctl", "enable", *units)
    _, wants = await run("systemctl", "list-dependencies", "--plain", "multi-user.target")
    enabled = code == 0 and all(u in wants for u in units)
    detail.update(systemctl_enable_rc=code, enabled_for_boot=enabled)
    # At boot, multi-user.target pulls them all into one transaction, where the
    # ordering holds. Here a target of our own does the same, with the daemons
    # that are not running yet. (`systemctl start irdma-mount psd@n2` is not
    # one transaction: systemctl asks for each unit in turn, and the mount's
    # job may run before the daemons' jobs exist.)
    Path(f"/etc/systemd/system/{BOOT_TARGET}").write_text(
        "[Unit]\n"
        "Description=irdma test: the enabled units started together, as at boot\n"
        f"Wants={MOUNT_UNIT} {psd('n2')} {psd('n3')}\n"
    )
    await run("systemctl", "daemon-reload")
    code, out = await run("systemctl", "start", BOOT_TARGET)
    detail.update(systemctl_start_rc=code, output=out.strip())
    props = ("ActiveState", "ActiveEnterTimestampMonotonic", "InactiveExitTimestampMonotonic")
    stamps = {u: await show(u, *props) for u in units}
    mount_began = int(stamps[MOUNT_UNIT]["InactiveExitTimestampMonotonic"])
    daemons_active = {n: int(stamps[psd(n)]["ActiveEnterTimestampMonotonic"]) for n in NODES}
    after_all = all(mount_began >= t > 0 for t in daemons_active.values())
    detail.update(
        mount_job_began_us=mount_began,
        daemons_active_us=daemons_active,
        mount_began_after_every_daemon_active=after_all,
        mount_began_s_after_last_daemon=round(
            (mount_began - max(daemons_active.values())) / 1e6, 3
        ),
    )
    # The mount's After= as systemd loaded it: the psd@ instances' Before= reversed.
    after_units = (await show(MOUNT_UNIT, "After"))["After"].split()
    declared = all(psd(n) in after_units for n in NODES)
    detail["mount_after"] = after_units
    fm_code, fm = await run("findmnt", "-n", "-o", "FSTYPE,SOURCE,OPTIONS", str(MNT))
    is_fuse = fm_code == 0 and fm.startswith("fuse")
    detail["findmnt"] = fm.strip()
    detail["cluster"] = await wait_cluster_ready(client)

    data = np.arange(48 * 1024, dtype=np.float32).reshape(48, 1024)  # 192 KiB: 3 shards
    await client.write("sysd/mounted", data)
    path = MNT / "sysd" / "mounted.npy"

    async def shown() -> bool:
        try:
            return bool(np.array_equal(np.load(path), data))
        except (OSError, ValueError):
            return False

    in_mount = await until(f"{path} with the written data", shown, 60)
    detail["tensor_in_mount"] = in_mount
    return code == 0 and enabled and after_all and declared and is_fuse and in_mount


async def check_rdma(detail: dict[str, Any], since: float) -> bool:
    registered = detail.setdefault("arena_registered_log", {})
    limits = detail.setdefault("memlock_limits", {})
    for n in NODES:
        log = await journal(psd(n), since)
        registered[n] = [ln for ln in log.splitlines() if "arena registered" in ln][-1:]
        pid = (await show(psd(n), "MainPID"))["MainPID"]
        text = Path(f"/proc/{pid}/limits").read_text()
        limits[n] = next((ln for ln in text.splitlines() if "locked memory" in ln), "").split()
    detail["dev_infiniband_modes"] = {
        p.name: oct(p.stat().st_mode & 0o777) for p in Path("/dev/infiniband").iterdir()
    }
    data = np.random.default_rng(7).standard_normal(128 * 1024, dtype=np.float32)  # 8 shards
    async with AsyncClient(CONFIG, transport="rdma", timeout=30) as rc:
        await rc.write("sysd/rdma", data)
        back = await rc.read("sysd/rdma")
        transports = {n.name: rc.transport_of(n) for n in rc.config.nodes}
    used = {n: t for n, t in transports.items() if t is not None}
    equal = bool(np.array_equal(back, data))
    detail.update(client_transports=transports, data_equal=equal)
    return (
        all(registered.values())
        and all(lim[3:5] == ["unlimited", "unlimited"] for lim in limits.values())
        and equal
        and len(used) >= 2
        and set(used.values()) == {"rdma"}
    )


async def check_sigkill(detail: dict[str, Any], client: AsyncClient) -> bool:
    unit = psd("n2")
    await wait_cluster_ready(client)
    before = detail["before"] = await show(unit, "NRestarts", "MainPID")
    restarts = int(before["NRestarts"])
    base = np.ones(64 * 1024, dtype=np.float32)  # 256 KiB: 4 shards
    await client.write("sysd/updated", base)
    code, out = await run("systemctl", "kill", "--signal=SIGKILL", unit)
    t = trio.current_time()
    detail.update(systemctl_kill_rc=code, output=out.strip())
    # While it is down: a new tensor and an update of an existing one.
    data = np.random.default_rng(11).standard_normal(160 * 1024, dtype=np.float32)  # 10 shards
    await client.write("sysd/while_n2_down", data)
    await client.accumulate("sysd/updated", base, alpha=2.0)
    detail["writes_took_s"] = round(trio.current_time() - t, 2)
    during = detail["during_writes"] = await show(unit, "ActiveState", "SubState", "MainPID")
    down = during.get("ActiveState") != "active" or during.get("MainPID") != before["MainPID"]
    detail["down_during_writes"] = down
    after = await until(f"{unit} restarted", lambda: restarted(unit, restarts), READY_TIMEOUT)
    detail["after"] = after
    detail["restarted_within_s"] = round(trio.current_time() - t, 1)
    detail["cluster"] = await wait_cluster_ready(client)
    config = client.config
    key = tensor_key("sysd/while_n2_down")
    records = await client.holdings(config.node("n2"), "sysd/while_n2_down")
    held = sorted(i for r in records for i in r.shards or {})
    should = [i for i in range(10) if config.holds("n2", key, i)]
    back = await client.read("sysd/while_n2_down")
    updated = await client.read("sysd/updated")
    detail.update(
        n2_holds_shards=held,
        placement_gives_n2=should,
        data_equal=bool(np.array_equal(back, data)),
        update_applied=bool(np.all(updated == 3.0)),
    )
    return (
        code == 0
        and down
        and int(after["NRestarts"]) == restarts + 1
        and after["MainPID"] != before["MainPID"]
        and held == should
        and len(should) > 0
        and detail["data_equal"]
        and detail["update_applied"]
    )


async def check_watchdog(detail: dict[str, Any], client: AsyncClient) -> bool:
    unit = psd("n1")
    await wait_cluster_ready(client)
    before = await show(unit, "NRestarts", "MainPID", "WatchdogUSec", "WatchdogSignal")
    detail["before"] = before
    limit = detail["watchdog_sec"] = timespan(before["WatchdogUSec"])
    if limit <= 0:
        raise CheckFailed(f"{unit} has no watchdog (WatchdogUSec={before['WatchdogUSec']})")
    restarts = int(before["NRestarts"])
    since = time.time()
    os.kill(int(before["MainPID"]), signal.SIGSTOP)
    t = trio.current_time()
    seen: list[str] = detail.setdefault("states_seen", [])

    async def probe() -> dict[str, str] | None:
        s = await show(unit, "ActiveState", "SubState", "Result", "NRestarts", "MainPID")
        state = f"{s['ActiveState']}/{s['SubState']} result={s['Result']}"
        if not seen or seen[-1] != state:
            seen.append(state)
            detail.setdefault("state_changes_at_s", []).append(round(trio.current_time() - t, 1))
        if int(s["NRestarts"]) > restarts and s["ActiveState"] == "active":
            return s
        return None

    after = detail["after"] = await until(
        f"{unit} restarted by the watchdog", probe, limit + READY_TIMEOUT
    )
    detail["restarted_within_s"] = round(trio.current_time() - t, 1)
    log = await journal(unit, since)
    timeout_line = [ln for ln in log.splitlines() if "Watchdog timeout" in ln]
    result_line = [ln for ln in log.splitlines() if "result 'watchdog'" in ln]
    detail.update(journal_watchdog_timeout=timeout_line, journal_result=result_line)
    detail["cluster"] = await wait_cluster_ready(client)
    return (
        bool(timeout_line)
        and bool(result_line)
        and int(after["NRestarts"]) == restarts + 1
        and after["MainPID"] != before["MainPID"]
        and after["ActiveState"] == "active"
    )


async def check_stop(detail: dict[str, Any], client: AsyncClient) -> bool:
    unit = psd("n1")
    await wait_cluster_ready(client)
    snap = Path("/var/lib/irdma/n1/snapshot.irdma")
    detail["snapshot_existed_before"] = snap.exists()
    since = time.time()
    code, out = await run("systemctl", "stop", unit)
    after = await show(unit, "ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    detail.update(systemctl_stop_rc=code, output=out.strip(), after_stop=after)
    st = snap.stat() if snap.exists() else None
    fresh = st is not None and st.st_mtime >= since - 1
    owner = None if st is None else pwd.getpwuid(st.st_uid).pw_name
    detail["snapshot"] = None if st is None else {"size": st.st_size, "owner": owner}
    detail["snapshot_written_by_the_stop"] = fresh
    log = await journal(unit, since)
    written = [ln for ln in log.splitlines() if re.search(r"snapshot \d+ written", ln)]
    detail["journal_written"] = written
    # Started again, it loads what the stop wrote.
    since2 = time.time()
    code2, out2 = await run("systemctl", "start", unit)
    detail.update(systemctl_start_rc=code2, start_output=out2.strip())
    log2 = await journal(unit, since2)
    loaded = [ln for ln in log2.splitlines() if "loaded snapshot" in ln]
    detail["journal_loaded_on_restart"] = loaded
    detail["cluster"] = await wait_cluster_ready(client)
    return (
        code == 0
        and after.get("ActiveState") == "inactive"
        and after.get("Result") == "success"
        and fresh
        and bool(written)
        and owner == "irdma"
        and code2 == 0
        and bool(loaded)
    )


async def check_mount_stop(detail: dict[str, Any]) -> bool:
    before = detail["before_stop"] = await show(MOUNT_UNIT, "ActiveState", "NRestarts")
    code, out = await run("systemctl", "stop", MOUNT_UNIT)
    after = await show(MOUNT_UNIT, "ActiveState", "Result")
    fm_code, fm = await run("findmnt", "-n", str(MNT))
    detail.update(systemctl_stop_rc=code, output=out.strip(), after_stop=after)
    detail["still_mounted"] = fm.strip() or None
    return (
        before.get("ActiveState") == "active"
        and before.get("NRestarts") == "0"  # it never failed meanwhile
        and code == 0
        and after.get("ActiveState") == "inactive"
        and after.get("Result") == "success"
        and fm_code != 0
    )


# -- driver --------------------------------------------------------------------


async def main(out_path: Path) -> int:
    results: list[dict[str, Any]] = []
    boot = time.time()

    def save() -> None:
        out_path.write_text(json.dumps(results, indent=1, default=str))

    async def check(name: str, fn: Callable[[dict[str, Any]], Awaitable[bool]]) -> bool:
        say(f"{name} ...")
        t = trio.current_time()
        detail: dict[str, Any] = {}
        try:
            ok = bool(await fn(detail))
        except Exception as exc:
            ok = False
            detail["error"] = f"{type(exc).__name__}: {exc}"
            detail["traceback"] = traceback.format_exc()
        seconds = round(trio.current_time() - t, 1)
        results.append({"name": name, "ok": ok, "seconds": seconds, "detail": detail})
        save()
        say(f"{name}: {'ok' if ok else 'FAILED'} ({seconds} s)")
        print(json.dumps(detail, indent=1, default=str), flush=True)
        return ok

    config = load_config(CONFIG)
    say(f"config {config.path}: {[(n.name, str(n.address)) for n in config.nodes]}")
    try:
        async with (
            AsyncClient(config, timeout=10) as client,
            AsyncClient(config, timeout=10, transport="tcp") as tcp,
        ):
            started = await check("start_waits_for_ready", lambda d: check_start(d, tcp))
            mounted = await check("mount_after_daemons", lambda d: check_mount(d, client))
            if started and mounted:
                await check("rdma_under_hardening", lambda d: check_rdma(d, boot))
                await check("sigkill_restarts_and_catches_up", lambda d: check_sigkill(d, client))
                await check("watchdog_restarts_hung", lambda d: check_watchdog(d, client))
                # IRDMA_GUEST_REPEAT=N (tests/systemd/loop-in-guest.sh): the watchdog
                # check N times more, until one fails (a failure seen once, hunted).
                for k in range(int(os.environ.get("IRDMA_GUEST_REPEAT", "0"))):
                    name = f"watchdog_restarts_hung#{k + 2}"
                    if not await check(name, lambda d: check_watchdog(d, client)):
                        break
                await check("stop_leaves_snapshot", lambda d: check_stop(d, client))
            else:
                say("the cluster did not come up: the checks that need it are not run")
            await check("mount_stops_cleanly", check_mount_stop)
    finally:
        with trio.CancelScope(shield=True):
            for unit in (MOUNT_UNIT, *map(psd, NODES)):
                _, out = await run("systemctl", "status", "--no-pager", "-n", "0", unit)
                print(out, flush=True)
            _, out = await run("systemd-analyze", "security", "--no-pager", psd("n1"))
            print("systemd-analyze security psd@n1:", out.strip().splitlines()[-1:], flush=True)
            await run("systemctl", "stop", MOUNT_UNIT, *map(psd, NODES))
            _, out = await run("journalctl", "-b", "--no-pager", "-o", "short-monotonic")
            (out_path.parent / "journal.txt").write_text(out)
            save()
    failed = [r["name"] for r in results if not r["ok"]]
    say(f"{len(results)} checks, failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: guest_checks.py RESULTS.json")
    sys.exit(trio.run(main, Path(sys.argv[1])))
