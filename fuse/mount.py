"""``irdma mount MOUNTPOINT``: serve the cluster as a filesystem.

Unmount with ``fusermount3 -u MOUNTPOINT`` or SIGTERM/Ctrl-C (pending writes
are pushed first). Without ``--foreground`` the command returns once the
mount is up and the filesystem keeps running in the background. Where the
mount logs (a file, or the journal under systemd) is shown by ``irdma status``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from irdma import (
    AsyncClient,
    ClusterConfig,
    Notifier,
    SharedRegion,
    load_config,
    mounts,
    parse_size,
    spawn,
)
from irdma.errors import ConfigError, IrdmaError

from .buffers import SHARED_SIZE
from .filesystem import Filesystem
from .kernel.backing import DEFAULT_LIMIT as BACKING_MEMORY
from .kernel.device import DeviceError
from .kernel.init import UnsupportedKernel
from .mover import Mover

log = logging.getLogger("irdma.fuse")

DESCRIPTION = """\
Serve the cluster's tensors as files under MOUNTPOINT: DIR/NAME.npy for each tensor
(np.load, np.save, cp, dd), any other name as raw bytes, mkdir/rm/mv for names.
Without --foreground it returns once mounted and logs to a file; under systemd it logs
to the journal. irdma status shows each mount and where it logs.
Unmount: fusermount3 -u MOUNTPOINT (pending writes are pushed first)."""

READ_AHEAD_KB = 4096  # the page cache asks for up to this much at once (default 128)
MOUNT_WAIT = 30.0


class MountError(Exception):
    """The mount cannot be made (bad mountpoint, no daemons, no FUSE)."""


def check_mountpoint(path: Path) -> None:
    """Raise MountError unless ``path`` is an existing, empty-or-not, unmounted directory."""
    if not path.exists():
        raise MountError(f"{path}: mountpoint does not exist")
    if not path.is_dir():
        raise MountError(f"{path}: mountpoint is not a directory")
    if os.path.ismount(path):
        raise MountError(f"{path}: something is already mounted there (busy)")
    if not os.path.exists("/dev/fuse"):
        raise MountError("/dev/fuse is missing: load the fuse module (modprobe fuse)")


async def check_daemons(config: ClusterConfig) -> None:
    """Raise MountError if no daemon answers; warn about the ones that do not."""
    up = []
    async with AsyncClient(config, timeout=min(config.timeout, 5.0)) as client:
        # The daemons in force: a config naming only etcd has them from its epoch.
        for node in client.config.nodes:
            try:
                await client.hello(node)
                up.append(node.name)
            except IrdmaError as exc:
                log.warning("daemon %s is not answering: %s", node.name, exc)
    if not up:
        raise MountError(f"no daemon of {config.path} is reachable")


def raise_read_ahead(mountpoint: Path) -> int | None:
    """Raise the mount's read-ahead to READ_AHEAD_KB; return the read-ahead in force (KiB).

    Stats the mountpoint: call it while the filesystem is being served.
    """
    st = os.stat(mountpoint)
    bdi = Path(f"/sys/class/bdi/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/read_ahead_kb")
    try:
        bdi.write_text(str(READ_AHEAD_KB))
    except OSError as exc:
        log.info("could not raise read-ahead (%s): buffered reads use small requests", exc)
    try:
        return int(bdi.read_text())
    except (OSError, ValueError):
        return None


@dataclass
class Served:
    """A FUSE session as ``serve`` drives it: mount, serve, stop serving, unmount."""

    fs: Filesystem
    mount: Callable[[], None]
    main: Callable[[], Awaitable[None]]
    terminate: Callable[[], None]
    close: Callable[[], None]


def pyfuse3_session(
    fs_args: dict, mountpoint: Path, allow_other: bool, backing_memory: int
) -> Served:
    """The mount served by pyfuse3 (libfuse)."""
    import pyfuse3

    from .ops import IrdmaOperations

    ops = IrdmaOperations(**fs_args, keep_memory=backing_memory)
    options = set(pyfuse3.default_options) | {"fsname=irdma", "subtype=irdma"}
    if allow_other:
        options.add("allow_other")
    return Served(
        ops.fs,
        lambda: pyfuse3.init(ops, str(mountpoint), options),
        pyfuse3.main,
        pyfuse3.terminate,
        lambda: pyfuse3.close(unmount=True),
    )


def own_session(
    fs_args: dict,
    mountpoint: Path,
    allow_other: bool,
    backing_memory: int,
    passthrough: bool = True,
) -> Served:
    """The mount served by irdma's own session on /dev/fuse (``kernel``)."""
    from .kernel.session import Session

    fs = Filesystem(**fs_args)
    session = Session(
        fs,
        mountpoint,
        allow_other=allow_other,
        passthrough=passthrough,
        backing_limit=backing_memory,
    )
    return Served(fs, session.mount, session.run, session.stop, session.close)


async def serve(
    config: ClusterConfig,
    mountpoint: Path,
    *,
    allow_other: bool,
    direct_io: bool,
    timeout: float | None = None,
    shared_memory: int = SHARED_SIZE,
    session: str = "own",
    backing_memory: int = BACKING_MEMORY,
    passthrough: bool = True,
) -> None:
    """Mount, serve until unmounted or signalled, push pending writes, unmount.

    ``shared_memory``: the address space of the region the mount's large
    buffers come from (0: none; buffers are then pushed through staging).
    ``session``: "own" (irdma's own, with passthrough), or "pyfuse3" (libfuse).
    ``backing_memory`` bounds the readers' files kept while no open holds them
    (for the next open of the same version: the page cache, or passthrough).
    ``passthrough``: the own session asks the kernel for it (root only); without
    it the session serves file data itself, as for another user's mount.
    """
    # The mount's large buffers live in memory the same-host daemons map: a
    # writer's bytes are pushed from its buffer without a copy into staging.
    shared = SharedRegion(shared_memory) if shared_memory else None
    fs_args = {"direct_io": direct_io, "shared": shared}
    if session == "own":
        served = own_session(fs_args, mountpoint, allow_other, backing_memory, passthrough)
    else:
        served = pyfuse3_session(fs_args, mountpoint, allow_other, backing_memory)
    fs = served.fs
    notifier = Notifier.from_environ()  # under systemd (deploy/irdma-mount.service)
    # Recorded before mounting, so `irdma status` shows it as soon as it is mounted
    # (status shows only records of live mounts).
    record = mounts.publish(mountpoint, config.path)
    try:
        async with AsyncClient(config, timeout=timeout, shared_memory=shared) as client:
            fs.backend.client = client
            served.mount()
            # Mounted: a process that opens a file now is served once main() runs.
            log.info("serving %s; this log goes to %s", mountpoint, mounts.log_destination())
            notifier.ready(f"serving {mountpoint}")
            try:
                async with trio.open_nursery() as nursery:
                    fs.backend.nursery = nursery  # readers' snapshots stream in here
                    mover = Mover(config, timeout, shared)
                    await nursery.start(mover.run)
                    fs.backend.mover = mover

                    async def on_signals() -> None:
                        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                            async for signum in signals:
                                log.info(
                                    "%s: pushing pending writes, then unmounting",
                                    signal.Signals(signum).name,
                                )
                                notifier.stopping("pushing pending writes, then unmounting")
                                await fs.flush_all()
                                served.terminate()
                                return

                    async def tune() -> None:
                        kb = await trio.to_thread.run_sync(raise_read_ahead, mountpoint)
                        log.info("read-ahead %s KiB", kb)

                    async def trim_buffers() -> None:
                        # Free buffers unused for a while go back to the system
                        # even when no new file is opened.
                        while True:
                            await trio.sleep(fs.backend.buffers.idle)
                            fs.backend.buffers.trim()

                    nursery.start_soon(on_signals)
                    nursery.start_soon(tune)
                    nursery.start_soon(trim_buffers)
                    await served.main()
                    nursery.cancel_scope.cancel()
            finally:
                await fs.flush_all()
                # Never stat the mountpoint here: nothing serves it any more, so
                # the call would wait forever. Unmounting twice is harmless.
                served.close()
                notifier.close()
    finally:
        mounts.withdraw(record)


def run(args: argparse.Namespace) -> int:
    """The ``irdma mount`` command."""
    if args.log and args.foreground:
        # The log takes this process's stderr, so libfuse's messages go there too.
        try:
            fd = mounts.open_log(Path(args.log))
        except OSError as exc:
            print(f"irdma mount: cannot write the log {args.log}: {exc}", file=sys.stderr)
            return 1
        os.dup2(fd, sys.stderr.fileno())
        os.close(fd)
    logging.basicConfig(
        level=logging.INFO, format="irdma mount: %(levelname)s %(message)s", stream=sys.stderr
    )
    mountpoint = Path(args.mountpoint).absolute()
    try:
        if args.session == "pyfuse3":
            import pyfuse3  # noqa: F401
    except ImportError:
        print(
            "irdma mount: pyfuse3 is not installed (pip install 'irdma[fuse]'; it needs "
            "libfuse3-dev and pkg-config to build)",
            file=sys.stderr,
        )
        return 1
    try:
        config = load_config(args.config)
        check_mountpoint(mountpoint)
        trio.run(check_daemons, config)
    except ConfigError as exc:
        print(f"irdma mount: {exc}", file=sys.stderr)
        return 2
    except MountError as exc:
        print(f"irdma mount: {exc}", file=sys.stderr)
        return 1
    if not args.foreground:
        return _background(args, mountpoint)
    try:
        trio.run(
            lambda: serve(
                config,
                mountpoint,
                allow_other=args.allow_other,
                direct_io=args.direct_io,
                timeout=args.timeout,
                shared_memory=args.shared_memory,
                session=args.session,
                backing_memory=args.backing_memory,
                passthrough=not args.no_passthrough,
            )
        )
    except (RuntimeError, DeviceError, UnsupportedKernel) as exc:
        # pyfuse3.init failures (permissions, fusermount); the own session's mount(2),
        # or a kernel it cannot speak to
        print(f"irdma mount: cannot mount {mountpoint}: {exc}", file=sys.stderr)
        return 1
    return 0


def _background(args: argparse.Namespace, mountpoint: Path) -> int:
    """Start the same mount in the foreground of a detached child; wait until it is up."""
    argv = spawn.python_module("irdma")
    if args.config:
        argv += ["--config", args.config]
    if args.timeout is not None:
        argv += ["--timeout", str(args.timeout)]
    argv += ["mount", str(mountpoint), "--foreground"]
    if args.allow_other:
        argv.append("--allow-other")
    if args.direct_io:
        argv.append("--direct-io")
    argv += ["--shared-memory", str(args.shared_memory)]
    argv += ["--session", args.session, "--backing-memory", str(args.backing_memory)]
    if args.no_passthrough:
        argv.append("--no-passthrough")
    # The detached child must not hold our caller's stdout/stderr open (a
    # caller reading them would wait for the mount to end); it logs to a file,
    # or under systemd to the journal our own stderr goes to.
    if args.log is None and mounts.log_destination().startswith("the journal"):
        log_path = None
        child = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True
        )
    else:
        log_path = Path(args.log) if args.log else mounts.default_log(mountpoint)
        try:
            fd = mounts.open_log(log_path)
        except OSError as exc:
            print(f"irdma mount: cannot write the log {log_path}: {exc}", file=sys.stderr)
            return 1
        with os.fdopen(fd, "wb") as log:
            child = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
    deadline = time.monotonic() + MOUNT_WAIT
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            where = log_path or "the journal"
            print(
                f"irdma mount: {mountpoint} mounted (pid {child.pid}, log {where}; irdma status "
                f"shows it); unmount with fusermount3 -u {mountpoint}",
                file=sys.stderr,
            )
            return 0
        if child.poll() is not None:
            if log_path:
                sys.stderr.write(Path(log_path).read_text(errors="replace"))
            return child.returncode or 1
        time.sleep(0.05)
    child.terminate()
    print(f"irdma mount: {mountpoint} did not come up within {MOUNT_WAIT:g} s", file=sys.stderr)
    return 1


def size_argument(value: str) -> int:
    """A byte size on the command line ("16GiB", "0")."""
    try:
        return parse_size(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``irdma mount`` to the irdma command (an ``irdma.commands`` entry point)."""
    p = subparsers.add_parser(
        "mount", help="mount the cluster as a filesystem (FUSE)", description=DESCRIPTION
    )
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="an existing directory")
    p.add_argument(
        "--foreground", "-f", action="store_true", help="stay in the foreground until unmounted"
    )
    p.add_argument(
        "--allow-other",
        action="store_true",
        help="let other users access the mount (needs user_allow_other)",
    )
    p.add_argument(
        "--direct-io",
        action="store_true",
        help="bypass the page cache (faster large reads; no shared mmap)",
    )
    p.add_argument(
        "--shared-memory",
        type=size_argument,
        default=SHARED_SIZE,
        metavar="SIZE",
        help="address space for buffers the local daemons read directly (writes skip a "
        "copy; pages are used only as files are written); 0 turns it off "
        f"(default: {SHARED_SIZE >> 30}GiB)",
    )
    p.add_argument(
        "--session",
        choices=("own", "pyfuse3"),
        default="own",
        help="who speaks FUSE to the kernel: irdma's own session (the default; as root, "
        "open files' data is served by the kernel from memory with passthrough where the "
        "kernel offers it, Linux 6.9 and later; other users mount through fusermount3), "
        "or pyfuse3 (libfuse: for kernels older than Linux 5.17, which the own session "
        "cannot speak to; needs irdma[fuse])",
    )
    p.add_argument(
        "--no-passthrough",
        action="store_true",
        help="with --session own: serve file data through the session, as a mount by "
        "another user than root does, instead of asking the kernel for passthrough",
    )
    p.add_argument(
        "--backing-memory",
        type=size_argument,
        default=BACKING_MEMORY,
        metavar="SIZE",
        help="memory for readers' files no open holds, kept for the next open of the same "
        "version: the kernel's page cache or passthrough serves it from memory "
        f"(default: {BACKING_MEMORY >> 30}GiB; 0: every open reads the daemons again)",
    )
    p.add_argument(
        "--log",
        metavar="FILE",
        help="append the log to FILE (the previous one kept as FILE.1); default without "
        "--foreground: the journal under systemd, else "
        "$XDG_STATE_HOME/irdma/mount-PATH.log (root: /var/log/irdma/mount-PATH.log); "
        "with --foreground: stderr",
    )
    p.set_defaults(run=run)
