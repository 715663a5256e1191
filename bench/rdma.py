#!/usr/bin/env python3
"""irdma's rdma transport against perftest on the same RDMA device, in one run.

Runs where there is an RDMA device: inside the soft-RoCE guest through
``bench/rdma_vm.sh`` on these machines (their kernels have no RDMA). In one
boot it measures, alternating rounds so drift hits all alike:

- ``ib_read_bw`` and ``ib_write_bw`` (perftest, RC, one QP) on the device;
- irdma read and write of one tensor (default 64 MiB) over rdma, and over
  irdma's own TCP transport, from one daemon on the device's address;
- the daemon's CPU time per GB pulled (utime + stime from /proc), rdma
  against tcp: a one-sided pull is RDMA READs only, the daemon does nothing;
- the same over rdma with ``IRDMA_ONE_SIDED=0`` ("via daemon": it answers
  where the bytes are, the client READs them), and a 4 KiB read's median
  time both ways.

Prints the figures and the ratios irdma / perftest and rdma / tcp.

    python3 bench/rdma.py [--size 64MiB] [--rounds 3] [--ip 198.18.0.1] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from irdma import Client
from irdma.cli.local import psd_command, write_config
from irdma.cluster import parse_size
from irdma.transport.verbs import MTU_BYTES, find_gid

PERFTEST_MSG = 4 << 20


def perftest(tool: str, device: str, gid_index: int, size: int, mtu: int) -> float:
    """One perftest run of ``size`` bytes in 4 MiB messages; MB/s (10**6) as it reports."""
    iters = max(5, size // PERFTEST_MSG)
    args = [tool, "-d", device, "-x", str(gid_index), "-s", str(PERFTEST_MSG), "-n", str(iters)]
    args += ["-m", str(mtu), "-F"]
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(1.0)
        client = subprocess.run(
            [*args, "127.0.0.1"], capture_output=True, text=True, timeout=300, check=False
        )
        server.wait(timeout=60)
    finally:
        server.kill()
    # The result line: bytes, iterations, BW peak, BW average, MsgRate.
    for line in client.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0] == str(PERFTEST_MSG) and re.fullmatch(r"\d+", fields[1]):
            return float(fields[3])
    raise RuntimeError(f"{tool} printed no result:\n{client.stdout}\n{client.stderr}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_listening(config: Path, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    """Until the daemon accepts connections (slow to start under emulation)."""
    from irdma.cluster import load_config

    node = load_config(config).nodes[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("psd exited before it served")
        try:
            socket.create_connection((node.address.host, node.address.port), 1.0).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"psd did not listen within {timeout:g} s")


def small_read_us(client: Client, name: str, reads: int = 200) -> float:
    """Median time of one 4 KiB read (a tensor of one shard), in microseconds."""
    out = np.empty(4096, np.uint8)
    times = []
    for _ in range(reads):
        t = time.perf_counter()
        client.read(name, out)
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def irdma_round(client: Client, name: str, data: np.ndarray, pid: int) -> dict[str, float]:
    out = np.empty_like(data)
    t = time.perf_counter()
    client.write(name, data, replace=True)
    write = time.perf_counter() - t
    cpu = cpu_seconds(pid)
    t = time.perf_counter()
    client.read(name, out)
    read = time.perf_counter() - t
    cpu = cpu_seconds(pid) - cpu
    # What the daemon spends with no request at all over as long (its timers,
    # other clients' keepalives): in the guest's emulated CPU it is not nothing.
    idle = cpu_seconds(pid)
    time.sleep(read)
    idle = cpu_seconds(pid) - idle
    if not np.array_equal(out, data):
        raise RuntimeError("irdma read back other bytes than it wrote")
    mb = data.nbytes / 1e6
    return {
        "read": mb / read,
        "write": mb / write,
        "cpu_per_gb": cpu / (data.nbytes / 1e9),
        "cpu_per_gb beyond idle": max(0.0, cpu - idle) / (data.nbytes / 1e9),
        "4KiB read us": small_read_us(client, "small"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="64MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ip", default="198.18.0.1", help="the RDMA device's IPv4 address")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    size = parse_size(args.size)
    gid = find_gid(args.ip)
    from pyverbs.device import Context

    with Context(name=gid.device) as ctx:
        mtu = MTU_BYTES[int(ctx.query_port(gid.port).active_mtu)]
    print(f"device {gid.device} port {gid.port} GID[{gid.index}] {gid.gid} MTU {mtu}", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(
            Path(tmp), 1, arena_size=4 * size, shard_size=4 << 20, host=args.ip, scheme="rdma"
        )
        log = open(Path(tmp) / "n1.log", "wb")  # noqa: SIM115 (closed below)
        daemon = subprocess.Popen(psd_command(config, "n1"), stdout=log, stderr=log)
        try:
            wait_listening(config, daemon)
            data = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8)
            rows: dict[str, list[float]] = {}
            os.environ["IRDMA_ONE_SIDED"] = "0"  # read by the client it makes
            asking = Client(config, transport="rdma")
            del os.environ["IRDMA_ONE_SIDED"]
            with (
                Client(config, transport="rdma") as rdma,
                asking,
                Client(config, transport="tcp") as tcp,
            ):
                rdma.write("small", data[:4096])
                for c in (rdma, asking, tcp):  # connect and warm up
                    irdma_round(c, "warm", data[: 8 << 20], daemon.pid)
                for r in range(args.rounds):
                    rows.setdefault("ib_read_bw", []).append(
                        perftest("ib_read_bw", gid.device, gid.index, size, mtu)
                    )
                    rows.setdefault("ib_write_bw", []).append(
                        perftest("ib_write_bw", gid.device, gid.index, size, mtu)
                    )
                    for label, c in (("rdma", rdma), ("rdma via daemon", asking), ("tcp", tcp)):
                        got = irdma_round(c, "bench", data, daemon.pid)
                        for k, v in got.items():
                            rows.setdefault(f"irdma {label} {k}", []).append(v)
                    print(
                        f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in rows.items())
                    )
                for c in (rdma, asking):
                    via = {conn.transport for conn in c.async_client.session.conns.values()}
                    if via != {"rdma"}:
                        raise RuntimeError(f"the rdma client used {via}")
                one_sided = sum(
                    k.bulk.direct_reads for k in rdma.async_client.session.conns.values()
                )
                asked = sum(k.bulk.direct_reads for k in asking.async_client.session.conns.values())
                if not one_sided or asked:
                    raise RuntimeError(f"one-sided reads: {one_sided} and {asked} (off)")
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
            log.close()
    med = {k: statistics.median(v) for k, v in rows.items()}
    ratios = {
        "rdma read / ib_read_bw": med["irdma rdma read"] / med["ib_read_bw"],
        "rdma read via daemon / ib_read_bw": med["irdma rdma via daemon read"] / med["ib_read_bw"],
        "4 KiB read time, one-sided / via daemon": med["irdma rdma 4KiB read us"]
        / med["irdma rdma via daemon 4KiB read us"],
        "rdma write / ib_write_bw": med["irdma rdma write"] / med["ib_write_bw"],
        "rdma read / tcp read": med["irdma rdma read"] / med["irdma tcp read"],
        "rdma write / tcp write": med["irdma rdma write"] / med["irdma tcp write"],
        "daemon CPU per GB pulled, rdma / tcp": med["irdma rdma cpu_per_gb"]
        / max(med["irdma tcp cpu_per_gb"], 1e-9),
        "the same beyond the idle daemon's CPU": med["irdma rdma cpu_per_gb beyond idle"]
        / max(med["irdma tcp cpu_per_gb beyond idle"], 1e-9),
    }
    print(f"\nmedians over {args.rounds} rounds, {size >> 20} MiB, MB/s (10**6 bytes):")
    for k, v in med.items():
        unit = "CPU s/GB" if "cpu" in k else "us" if k.endswith(" us") else "MB/s"
        print(f"  {k:28s} {v:9.3f} {unit}")
    print("ratios (target: irdma rdma >= 0.90 of perftest):")
    for k, v in ratios.items():
        print(f"  {k:38s} {v:6.2f}")
    if args.json:
        args.json.write_text(json.dumps({"medians": med, "ratios": ratios, "rounds": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
