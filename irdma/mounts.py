"""Which irdma mounts this host serves and where each one logs, for ``irdma status``.

A mount's errors (a refused write, an unreachable daemon) reach the shell only
as an errno; the reason is in the mount's log. So each serving mount process
leaves a small record while it serves (JSON in a runtime directory, removed
at unmount) saying where its log goes: a file, or the journal under systemd.
``irdma status`` prints the records of live mounts of the same cluster config.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

FSTYPE = "fuse.irdma"  # the mount's fsname/subtype, as /proc/mounts shows it
SYSTEM_DIR = Path("/run/irdma-mounts")


@dataclass(frozen=True)
class MountRecord:
    mountpoint: str
    pid: int
    config: str | None
    log: str  # where its log goes, in words a user can act on

    def line(self) -> str:
        return f"mount {self.mountpoint} (pid {self.pid}): log in {self.log}"


def runtime_dir() -> Path:
    """Where this user's mount records live (root: /run; others: their runtime dir)."""
    if os.geteuid() == 0:
        return SYSTEM_DIR
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "irdma-mounts"
    return Path(f"/tmp/irdma-mounts-{os.geteuid()}")


LOG_DIR = Path("/var/log/irdma")  # root's mount logs, beside the system's


def default_log(mountpoint: Path) -> Path:
    """Where a background mount of ``mountpoint`` logs unless ``--log`` says: one file
    per mountpoint in the user's state directory (root: /var/log/irdma), so mounting
    again reuses it instead of leaving a new file each time."""
    state = os.environ.get("XDG_STATE_HOME")
    if state:
        directory = Path(state) / "irdma"
    elif os.geteuid() == 0:
        directory = LOG_DIR
    else:
        directory = Path.home() / ".local" / "state" / "irdma"
    # systemd-escape's idea: /mnt/params -> mount-mnt-params.log
    return directory / f"mount-{str(mountpoint).strip('/').replace('/', '-') or 'root'}.log"


def open_log(path: Path) -> int:
    """Open a mount's log file for appending (its directory made); the fd.

    The previous mount's log on the same file is kept as ``NAME.1`` (one
    generation), so a mount that is started again and again does not grow it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if path.stat().st_size:
            path.replace(path.with_name(path.name + ".1"))
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _record_path(directory: Path, mountpoint: str) -> Path:
    return directory / (hashlib.sha1(mountpoint.encode()).hexdigest()[:16] + ".json")


def _systemd_unit() -> str | None:
    """The systemd unit this process runs in (from its cgroup), if any."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        last = line.rsplit("/", 1)[-1]
        if last.endswith(".service"):
            return last
    return None


def log_destination() -> str:
    """Where this process's log (its stderr) goes, as a user would look it up."""
    try:
        st = os.fstat(2)
    except OSError:
        return "nowhere (stderr is closed)"
    journal = os.environ.get("JOURNAL_STREAM", "")
    if journal == f"{st.st_dev}:{st.st_ino}":
        unit = _systemd_unit()
        return f"the journal (journalctl -u {unit})" if unit else "the journal"
    try:
        target = os.readlink("/proc/self/fd/2")
    except OSError:
        target = "stderr"
    if stat.S_ISREG(st.st_mode):
        return target
    return f"the stderr of pid {os.getpid()} ({target})"


def publish(mountpoint: Path, config: Path | None) -> Path | None:
    """Record this process as serving ``mountpoint``; the record's path (None if it
    could not be written: status then just does not show it)."""
    record = MountRecord(
        str(mountpoint), os.getpid(), str(config) if config else None, log_destination()
    )
    directory = runtime_dir()
    path = _record_path(directory, record.mountpoint)
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(record)))
        tmp.replace(path)
    except OSError:
        return None
    return path


def withdraw(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(OSError):
            path.unlink()


def _unescape(field: str) -> str:
    """A /proc/mounts field with its octal escapes (\\040 for a space) decoded."""
    out = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def mounted_here() -> set[str]:
    """Mountpoints of irdma mounts in this mount namespace."""
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return set()
    return {
        _unescape(f[1]) for f in (line.split() for line in lines) if len(f) > 2 and f[2] == FSTYPE
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def live_mounts(config: Path | None) -> list[MountRecord]:
    """Records of mounts that serve now, of cluster config ``config`` (any if None)."""
    mounted = mounted_here()
    found: dict[str, MountRecord] = {}
    for directory in {runtime_dir(), SYSTEM_DIR}:
        try:
            paths = sorted(directory.glob("*.json"))
        except OSError:
            continue
        for path in paths:
            try:
                rec = MountRecord(**json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue
            if not _alive(rec.pid):
                # Its process died without removing it (killed, or a SIGTERM that
                # came while it was already unmounting): tidy up for it.
                withdraw(path)
                continue
            if rec.mountpoint not in mounted:
                continue  # about to mount, or its mount went away
            if config is not None and rec.config != str(config):
                continue
            found[rec.mountpoint] = rec
    return [found[m] for m in sorted(found)]
