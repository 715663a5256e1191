#!/usr/bin/env python3
"""The mount against the client and against pyfuse3's own ceiling: one run, one cluster.

Starts ``irdma local`` (3 daemons), ``irdma mount`` four times (pyfuse3's
default page-cache mode and ``--direct-io``: ``--session pyfuse3``; the own
session, the default, and the same with ``--no-passthrough``, what a mount
by another user than root gets) and
``fuse_ceiling.py`` twice (a trivial pyfuse3 file served from memory,
page-cache and direct-I/O opens: what any pyfuse3 filesystem can reach
here), then measures in interleaved rounds, on
the same 256 MiB:

- the client's read and write (the reference);
- sequential reads: ``dd bs=4M`` of a changed file (cold) and ``np.load``;
- sequential writes: ``dd bs=4M``, ``np.save``, ``fio --rw=write --bs=1M``
  (a new file; ``--end_fsync=1`` so the push is counted), and ``dd`` of a
  raw file (not ``.npy``: the own session writes those through passthrough);
- a re-read of an unchanged file (the page cache), and a second one,
  against a memory copy and against ``dd`` of the same file from tmpfs (the
  kernel's page-cache read itself); then ``np.load(mmap_mode="r")`` and a
  pass over every byte, against the same on the tmpfs file.

The client's read is timed twice: into an array it already has (the
reference for ``dd``) and into a new one, as ``np.load`` returns.

Prints medians in GB/s, each as a ratio to the client and to the ceiling in
the mode the kernel used for it (the default mount serves reads and
read-write opens through the page cache, write-only opens with direct I/O),
and the request sizes the kernel negotiated (largest read and write request
the ceiling saw, fs.fuse.max_pages_limit, read-ahead). Run as root (FUSE),
on a quiet machine: the figures are only as steady as the machine.

The first ``--warmup`` rounds (1) are run and not counted, for every target
alike: in them the daemons' arenas, the page cache and the buffers touch
fresh memory, which costs more than a copy on these machines.

    python bench/fuse.py [--size 256MiB] [--rounds 3] [--warmup 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import trio

from irdma import AsyncClient
from irdma.cluster import parse_size

sys.path.insert(0, str(Path(__file__).resolve().parent))
from link import start_local

PYFUSE3 = ("--session", "pyfuse3")  # "mount" and "mount--direct-io": pyfuse3's two modes


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def atomic_save(target: Path, arr: np.ndarray) -> None:
    """What atomic savers do: write a temporary, rename it over the target while it
    is still open, close."""
    tmp = target.with_name(f".tmp-{target.name}")
    with open(tmp, "wb") as f:
        np.save(f, arr)
        f.flush()
        os.replace(tmp, target)


def run_timed(argv: list[str], timeout: float = 300) -> float:
    """Seconds a command takes, from start to exit (what it prints is dropped).

    Not ``subprocess.run(..., timeout=)``: its wait polls with sleeps of up
    to 50 ms, which rounded every time up to 36, 64, 114, 164 ms... (a
    65 ms dd was timed 114 ms). The process's pidfd is readable the moment
    it exits.
    """
    t = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    pidfd = os.pidfd_open(proc.pid)
    try:
        exited, _, _ = select.select([pidfd], [], [], timeout)
        elapsed = time.perf_counter() - t
    finally:
        os.close(pidfd)
    if not exited:
        proc.kill()
    if proc.wait() != 0:
        raise subprocess.CalledProcessError(proc.returncode, argv)
    return elapsed


def dd(src: Path, dst: Path) -> float:
    return run_timed(["dd", f"if={src}", f"of={dst}", "bs=4M", "status=none"])


def fio_write(path: Path, size: int) -> float:
    """Seconds fio takes to write ``path`` sequentially in 1 MiB requests, fsync included."""
    out = subprocess.run(
        [
            "fio",
            "--name=seqwrite",
            f"--filename={path}",
            "--rw=write",
            "--bs=1M",
            f"--size={size}",
            "--ioengine=psync",
            "--end_fsync=1",
            "--output-format=json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]
    return size / job["write"]["bw_bytes"]


@dataclass
class Target:
    """A mounted filesystem under test and where its files go."""

    name: str
    root: Path
    proc: subprocess.Popen
    files: Callable[[str], Path]  # a file name -> its path on this filesystem
    ceiling: bool = False


def start_mount(command: list[str], where: Path, what: str) -> subprocess.Popen:
    """Run a FUSE server and wait (30 s at most) until ``where`` is mounted."""
    where.mkdir()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + 30
    while not where.is_mount():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"{what} did not come up")
        time.sleep(0.05)
    return proc


def irdma_mount(config: Path, where: Path, name: str, *extra: str) -> Target:
    command = [sys.executable, "-m", "irdma", "--config", str(config), "mount", str(where)]
    proc = start_mount([*command, "--foreground", *extra], where, "irdma mount")
    (where / "bench").mkdir(exist_ok=True)
    return Target(name, where, proc, lambda file: where / "bench" / file)


def mapped_pass(path: Path) -> float:
    """Seconds to map an .npy file (``np.load(mmap_mode="r")``) and read every byte once."""
    t = time.perf_counter()
    arr = np.load(path, mmap_mode="r")
    arr.view(np.uint8).sum(dtype=np.uint64) if arr.size else None
    elapsed = time.perf_counter() - t
    del arr
    return elapsed


def ceiling_mount(where: Path, capacity: int, *extra: str) -> Target:
    script = Path(__file__).with_name("fuse_ceiling.py")
    command = [sys.executable, str(script), str(where), "--capacity", str(capacity), *extra]
    proc = start_mount(command, where, "the pyfuse3 ceiling mount")
    # It serves one file, whatever the name asked for.
    return Target(f"ceiling{''.join(extra)}", where, proc, lambda _: where / "data.npy", True)


def stop(target: Target) -> dict:
    """Unmount; the ceiling's report of the requests it saw (or {})."""
    target.proc.send_signal(signal.SIGTERM)
    out, _ = target.proc.communicate(timeout=60)
    lines = [line for line in (out or "").splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def measure(args: argparse.Namespace) -> dict:
    size = parse_size(args.size)
    tmp = Path(tempfile.mkdtemp(prefix="irdma-fusebench-"))
    shm = Path(tempfile.mkdtemp(prefix="irdma-fusebench-", dir="/dev/shm"))
    # Room on each daemon for its third of the 6 files of this size a round may
    # hold at once (the client's, f, g, fio, moved, r), and a replace.
    arena = f"{3 * size // (1 << 20) + 64}MiB"
    local, config = start_local(tmp, 3, arena)
    targets: list[Target] = []
    res: dict[str, list[float]] = {}
    seen: dict[str, dict] = {}

    counted = False  # the warm-up rounds are run, not counted

    def note(key: str, seconds: float) -> None:
        if counted:
            res.setdefault(key, []).append(seconds)

    try:
        targets = [
            irdma_mount(config, tmp / "mnt", "mount", *PYFUSE3),
            irdma_mount(config, tmp / "mnt-dio", "mount--direct-io", *PYFUSE3, "--direct-io"),
            irdma_mount(config, tmp / "mnt-own", "own", "--session", "own"),
            # What a mount by another user than root gets: no passthrough.
            irdma_mount(
                config,
                tmp / "mnt-own-np",
                "own--no-passthrough",
                "--session",
                "own",
                "--no-passthrough",
            ),
            ceiling_mount(tmp / "ceil", size + (1 << 20)),
            ceiling_mount(tmp / "ceil-dio", size + (1 << 20), "--direct-io"),
        ]
        rng = np.random.default_rng(0)
        arrays = [rng.random(size // 4, dtype=np.float32) for _ in range(2)]
        out = np.empty_like(arrays[0])
        local_npy = shm / "x.npy"
        np.save(local_npy, arrays[1])

        async def client_round() -> tuple[float, float]:
            async with AsyncClient(config, timeout=60) as c:
                await c.write("bench/c", arrays[0])
                t = time.perf_counter()
                await c.write("bench/c", arrays[1])
                w = time.perf_counter() - t
                t = time.perf_counter()
                await c.read("bench/c", out=out)
                rd = time.perf_counter() - t
                # What np.load does: a new array (its memory is fresh).
                t = time.perf_counter()
                await c.read("bench/c")
                return w, rd, time.perf_counter() - t

        for r in range(args.warmup + args.rounds):
            counted = r >= args.warmup
            w, rd, rd_new = trio.run(client_round)
            note("client write", w)
            note("client read", rd)
            note("client read new", rd_new)
            a, b = arrays[r % 2], arrays[(r + 1) % 2]
            for t in targets:
                f, g, fio = t.files("f.npy"), t.files("g.npy"), t.files("fio.bin")
                note(f"{t.name} np.save", timed(lambda a=a, f=f: np.save(f, a)))
                note(f"{t.name} np.load", timed(lambda f=f: np.load(f)))
                note(f"{t.name} dd write", dd(local_npy, g))
                np.save(g, b)  # a new version: the read below is cold
                note(f"{t.name} dd read", dd(g, Path("/dev/null")))
                if not t.ceiling:  # the ceiling keeps no page cache across opens
                    note(f"{t.name} re-read", dd(g, Path("/dev/null")))
                    # The first re-read after the file was read in is slower
                    # than the ones after it (the kernel's own cost: no request
                    # reaches the mount in either); both are shown.
                    note(f"{t.name} re-read again", dd(g, Path("/dev/null")))
                    if t.name != "mount--direct-io":  # pyfuse3: no shared map (ENODEV)
                        note(f"{t.name} mapped pass", mapped_pass(g))
                    # A raw file (a checkpoint's .pt, say): the own session's
                    # writers of those write through passthrough.
                    raw = t.files("r.bin")
                    note(f"{t.name} dd write raw", dd(local_npy, raw))
                    raw.unlink()
                    fio.unlink(missing_ok=True)  # fio writes a new file
                    # A stored file renamed (mv), and an atomic save over it (write
                    # a temporary, rename it over the target while open).
                    moved = t.files("moved.npy")
                    note(f"{t.name} mv", timed(lambda f=f, m=moved: os.rename(f, m)))
                    note(f"{t.name} atomic save", timed(lambda m=moved, b=b: atomic_save(m, b)))
                    moved.unlink()
                note(f"{t.name} fio write", fio_write(fio, size))
            dst = np.zeros_like(a)
            note("memory copy", timed(lambda a=a, dst=dst: np.copyto(dst, a)))
            # What fresh memory costs this machine now (a copy into a new array):
            # the own session's backing files are fresh memory at every load. In a
            # VM whose balloon reports free pages to the host, memory freed a while
            # ago costs a host fault per page again.
            note("fresh memory copy", timed(lambda a=a: np.array(a, copy=True)))
            # The kernel's own page-cache read of a file in memory: what a
            # re-read can reach at best (read() copies page by page).
            note("tmpfs read", dd(local_npy, Path("/dev/null")))
            # np.load of the same file from tmpfs: its new array is fresh memory too,
            # which on this VM can cost more than the read itself.
            note("tmpfs np.load", timed(lambda: np.load(local_npy)))
            note("tmpfs mapped pass", mapped_pass(local_npy))
    finally:
        for t in targets:
            seen[t.name] = stop(t)
        local.send_signal(signal.SIGTERM)
        local.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(shm, ignore_errors=True)
    gbps = {k: size / statistics.median(v) / 1e9 for k, v in res.items()}
    return {"size_bytes": size, "rounds": args.rounds, "GBps": gbps, "requests": seen}


# How the kernel serves each operation on the default mount, so it is compared
# with the ceiling in the same mode: write-only opens (dd of=, np.save) use
# direct I/O there; reads and read-write opens (fio) the page cache.
DIRECT_ON_DEFAULT_MOUNT = {"np.save", "dd write"}
OPERATIONS = ("np.save", "dd write", "fio write", "np.load", "dd read")


def ceiling_for(mount: str, op: str) -> str:
    if mount == "mount--direct-io" or op in DIRECT_ON_DEFAULT_MOUNT:
        return "ceiling--direct-io"
    return "ceiling"


# pyfuse3's two modes; the own session, and as another user's mount gets it
MOUNTS = ("mount", "mount--direct-io", "own", "own--no-passthrough")


def ratios(gbps: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for mount in MOUNTS:
        for op in OPERATIONS:
            ref = "client read" if op in ("np.load", "dd read") else "client write"
            out[f"{mount} {op} / {ref}"] = gbps[f"{mount} {op}"] / gbps[ref]
            if not mount.startswith("own"):  # pyfuse3's ceiling says nothing of the own
                ceiling = ceiling_for(mount, op)
                out[f"{mount} {op} / {ceiling} {op}"] = (
                    gbps[f"{mount} {op}"] / gbps[f"{ceiling} {op}"]
                )
        out[f"{mount} dd write raw / client write"] = (
            gbps[f"{mount} dd write raw"] / gbps["client write"]
        )
        # np.load returns a new array: the client's read into a new one does the same
        # (from memory the client's pool reuses); np.load from tmpfs takes fresh memory.
        out[f"{mount} np.load / client read new"] = (
            gbps[f"{mount} np.load"] / gbps["client read new"]
        )
        out[f"{mount} np.load / tmpfs np.load"] = gbps[f"{mount} np.load"] / gbps["tmpfs np.load"]
    for ceiling in ("ceiling", "ceiling--direct-io"):
        for op in OPERATIONS:
            ref = "client read" if op in ("np.load", "dd read") else "client write"
            out[f"{ceiling} {op} / {ref}"] = gbps[f"{ceiling} {op}"] / gbps[ref]
    for mount in MOUNTS:
        # A rename that copies costs about a save; one on the daemons, a round trip.
        out[f"{mount} mv / {mount} np.save"] = gbps[f"{mount} mv"] / gbps[f"{mount} np.save"]
        out[f"{mount} atomic save / {mount} np.save"] = (
            gbps[f"{mount} atomic save"] / gbps[f"{mount} np.save"]
        )
        for reread in ("re-read", "re-read again"):
            out[f"{mount} {reread} / memory copy"] = gbps[f"{mount} {reread}"] / gbps["memory copy"]
            out[f"{mount} {reread} / tmpfs read"] = gbps[f"{mount} {reread}"] / gbps["tmpfs read"]
        if f"{mount} mapped pass" in gbps:
            out[f"{mount} mapped pass / tmpfs mapped pass"] = (
                gbps[f"{mount} mapped pass"] / gbps["tmpfs mapped pass"]
            )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="256MiB")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="rounds run first and not counted (fresh memory is touched in them)",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = measure(args)
    result["ratios"] = ratios(result["GBps"])
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    size = result["size_bytes"]
    print(
        f"irdma mount vs client and pyfuse3 ceiling, {size / (1 << 20):.0f} MiB, 3 daemons, "
        f"median of {args.rounds} rounds after {args.warmup} not counted (GB/s = 1e9 B/s)"
    )
    for name, seen in result["requests"].items():
        if seen:
            print(
                f"  {name}: largest read request {seen['max_read']} B, write "
                f"{seen['max_write']} B; read-ahead {seen['read_ahead_kb']} KiB; "
                f"fs.fuse.max_pages_limit {seen['max_pages_limit']}"
            )
    for k, v in sorted(result["GBps"].items()):
        print(f"  {k:<32} {v:6.2f} GB/s")
    for k, v in result["ratios"].items():
        print(f"  {k:<58} {v:5.2f}")
    print(
        "targets (own session): first reads >= 0.5 of the client's read; re-read and "
        "mapped pass >= 0.9 of tmpfs's; writes (push at close included) >= 0.5 of the "
        "client's write"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
