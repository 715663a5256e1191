"""The long fuzzing campaign against psd's frame parser and request handlers.

    nice -n 19 python bench/fuzz.py --runs 1000000            # atheris if installed
    nice -n 19 python bench/fuzz.py --engine random --runs 1000000

Every input is served in-process by the real ``Server`` on a socketpair
(``tests/helpers/fuzz_harness.py``); bit 4 of an input's first byte picks the
cluster: one copy per shard, or two (where n1 also takes forwarded updates
and shard copies from a peer). The harness checks after each input: no hang, no
exception escaping a handler, well-formed replies, no tensor changed without
an accepted update, no block left pinned or leaked, and (every
``--probe-every`` inputs) that a fresh connection still gets HELLO and a
byte-exact read. Two engines:

- ``atheris`` (``pip install atheris``): coverage-guided (libFuzzer) over
  the instrumented ``irdma`` and ``irdma_psd`` code, started from the
  harness's seeds and a dictionary of wire and JSON tokens. libFuzzer's own
  mutations are byte-level; a third of the time a JSON-aware one rewrites a
  value inside a frame's JSON body instead (and fixes the frame's length),
  so metadata and replication bodies are explored as structures. A fault
  in native code (numpy, the arena's mapping) would kill the process with a
  signal, which libFuzzer reports as a crash with its input.
- ``random``: the same mutations of the seeds (bytes, header fields,
  splicing, dictionary tokens, JSON values) without coverage; inputs that
  draw a reply signature not seen before join the corpus. For machines
  without atheris.

It prints a progress line every ``--report`` inputs and a summary at the
end (inputs, time, crashes, hangs, tensor-check failures), writes the
summary as JSON (``--summary``), and saves each failing input with its
problems under ``--findings``. Exit status 0 means no problem was found.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import json
import logging
import os
import random
import struct
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio

# irdma itself is imported only inside the engines: atheris instruments the
# modules imported under instrument_imports(), not ones already loaded.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Tokens for libFuzzer's dictionary and the random engine's insertions.
TOKENS = [
    b"IRDM",
    *(
        json.dumps(t).encode()
        for t in (
            "name",
            "dtype",
            "shape",
            "shard_size",
            "options",
            "mode",
            "workers",
            "slack",
            "groups",
            "worker_timeout",
            "on_timeout",
            "apply",
            "async",
            "sync",
            "ssp",
            "hybrid",
            "evict",
            "error",
            "set",
            "add",
            "node",
            "ready",
            "handoff",
            "boot",
            "seq",
            "shards",
            "meta",
            "txns",
            "version",
            "staging",
            "n1",
            "n2",
            "fz/new",
            "float32",
            "float64",
            "int8",
            "uint64",
            "bool",
            "complex128",
            "..",
        )
    ),
    b"true",
    b"false",
    b"null",
    b"NaN",
    b"Infinity",
    b"-1",
    b"1e308",
    b"1e400",
    b"18446744073709551616",
    b"[[",
    b"]]",
    b"{}",
    b"[]",
    b'":',
    b"\\ud800",
    b"\xff\xff\xff\xff\xff\xff\xff\xff",
    b"\x00\x00\x00\x00\x00\x00\xf0\x7f",  # inf as a little-endian double
    b"\x00\x00\x00\x00\x00\x00\xf8\x7f",  # NaN
]

# Header fields the random engine sets to interesting values: (offset, size).
FIELDS = [(5, 1), (6, 2), (10, 2), (12, 4), (16, 8), (24, 8), (32, 8), (40, 8), (48, 8)]
FIELDS += [(56, 8), (64, 8), (72, 8), (80, 4), (88, 8), (96, 8), (104, 8)]
INTERESTING = [0, 1, 2, 3, 7, 8, 16, 47, 48, 64, 111, 112, 255, 256, 4095, 4096, 4097]
INTERESTING += [1 << 16, (1 << 18) - 1, 1 << 18, 1 << 20, 1 << 26, (1 << 31) - 1]
INTERESTING += [1 << 31, (1 << 32) - 1, 1 << 32, (1 << 63) - 1, 1 << 63, (1 << 64) - 1]


# -- JSON-aware mutation -------------------------------------------------------------

HEADER_SIZE = 112
JSON_OPS = {2, 13, 15, 16}  # CREATE, PING, CATCHUP, SYNC_REQUEST
SYNC = 14  # its payload starts with ``offset`` bytes of JSON
KEYS = ["name", "dtype", "shape", "shard_size", "options", "mode", "workers", "slack"]
KEYS += ["groups", "worker_timeout", "on_timeout", "apply", "node", "ready", "handoff"]
KEYS += ["boot", "seq", "shards", "meta", "txns", "version", "stamp", "x"]
STRINGS = ["", "fz/new", "fz/new/deeper", "a/../b", "n1", "n2", "n3", "float32", "int8"]
STRINGS += ["bool", "complex128", "object", "sync", "ssp", "hybrid", "async", "evict", "set"]
STRINGS += ["\ud800", "x" * 1100, "a\0b"]


def random_json(rng: random.Random, depth: int = 0) -> Any:
    what = rng.randrange(12 if depth < 4 else 9)
    if what == 0:
        return None
    if what == 1:
        return rng.random() < 0.5
    if what == 2:
        return rng.choice([0, 1, 2, -1, 7, 4096, 2**31, 2**32, 2**63, 2**64, 2**64 + 1])
    if what == 3:
        return rng.choice([-1, 1]) * 10 ** rng.randint(18, 400)  # past u64, past a double
    if what == 4:
        return rng.choice([0.5, -0.0, 1e308, float("nan"), float("inf"), -float("inf")])
    if what in (5, 6):
        return rng.choice(STRINGS)
    if what == 7:
        nested: Any = []
        for _ in range(rng.choice([2, 31, 32, 33, 100, 600])):
            nested = [nested]
        return nested
    if what == 8:
        return rng.getrandbits(64)
    if what in (9, 10):
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(KEYS): random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def mutate_value(rng: random.Random, value: Any) -> Any:
    """``value`` with one place inside it changed (replaced, added to, or dropped)."""
    if isinstance(value, dict) and value and rng.random() < 0.7:
        key = rng.choice(list(value))
        choice = rng.randrange(4)
        if choice == 0:
            del value[key]
        elif choice == 1:
            value[rng.choice(KEYS)] = random_json(rng)
        else:
            value[key] = mutate_value(rng, value[key])
        return value
    if isinstance(value, list) and value and rng.random() < 0.7:
        i = rng.randrange(len(value))
        choice = rng.randrange(3)
        if choice == 0:
            del value[i]
        elif choice == 1:
            value.insert(i, random_json(rng))
        else:
            value[i] = mutate_value(rng, value[i])
        return value
    return random_json(rng)


def mutate_json(rng: random.Random, data: bytes) -> bytes | None:
    """Rewrite one value in the JSON body of one frame of ``data``; None if none has one."""
    if not data:
        return None
    body = data[1:]
    frames: list[list[bytearray]] = []
    p = 0
    while p + HEADER_SIZE <= len(body):
        head = bytearray(body[p : p + HEADER_SIZE])
        (length,) = struct.unpack_from("<Q", head, 48)
        if length > len(body) - p - HEADER_SIZE:
            break
        frames.append([head, bytearray(body[p + HEADER_SIZE : p + HEADER_SIZE + length])])
        p += HEADER_SIZE + length
    tail = body[p:]
    candidates = [f for f in frames if f[0][5] in JSON_OPS or f[0][5] == SYNC]
    if not candidates:
        return None
    head, payload = rng.choice(candidates)
    split = len(payload)
    if head[5] == SYNC:
        split = min(struct.unpack_from("<Q", head, 32)[0], len(payload))
    try:
        value = json.loads(bytes(payload[:split]))
    except (ValueError, RecursionError):
        value = random_json(rng)
    try:
        text = json.dumps(mutate_value(rng, value), separators=(",", ":")).encode()
    except (ValueError, RecursionError):
        return None
    payload[:split] = text
    struct.pack_into("<Q", head, 48, len(payload))
    if head[5] == SYNC:
        struct.pack_into("<Q", head, 32, len(text))
    return data[:1] + b"".join(h + pl for h, pl in frames) + tail


class Harnesses:
    """Both clusters' harnesses; an input's control byte picks one."""

    def __init__(self, harness_class: Any, args: argparse.Namespace) -> None:
        self.all = [
            harness_class(
                replicated=replicated,
                hang_timeout=args.hang_timeout,
                probe_every=args.probe_every,
            )
            for replicated in (False, True)
        ]

    def seeds(self) -> list[bytes]:
        return [seed for h in self.all for seed in h.seed_inputs()]

    async def run(self, data: bytes) -> Any:
        return await self.all[(data[0] >> 4) & 1 if data else 0].run(data)

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        async with self.all[0].serving(), self.all[1].serving():
            yield


class Campaign:
    """Counts, findings and the summary, shared by both engines."""

    def __init__(self, args: argparse.Namespace, engine: str) -> None:
        self.args = args
        self.engine = engine
        self.start = time.monotonic()
        self.inputs = 0
        self.crashes = 0
        self.hangs = 0
        self.failures = 0  # inputs with any problem
        self.tensor_violations = 0
        self.changed = 0
        self.closed = 0  # inputs the daemon answered by closing the connection
        self.statuses: collections.Counter[str] = collections.Counter()
        self.kinds: collections.Counter[str] = collections.Counter()
        self.findings = Path(args.findings)

    def record(self, data: bytes, outcome: Any) -> None:
        self.inputs += 1
        self.crashes += outcome.crash
        self.hangs += outcome.hang
        self.changed += outcome.changed
        for h in outcome.replies:
            self.statuses[str(h.status)] += 1
        if outcome.problems:
            self.failures += 1
            self.tensor_violations += any("changed with no accepted" in p for p in outcome.problems)
            for p in outcome.problems:
                self.kinds[p.split(":")[0][:60]] += 1
            self.findings.mkdir(parents=True, exist_ok=True)
            name = hashlib.sha1(data).hexdigest()[:16]
            (self.findings / f"{name}.bin").write_bytes(data)
            (self.findings / f"{name}.txt").write_text("\n".join(outcome.problems) + "\n")
            if self.failures <= 20:
                print(f"FINDING {name}: {'; '.join(outcome.problems)[:300]}", flush=True)
        if self.inputs % self.args.report == 0:
            self.progress()

    def progress(self) -> None:
        dt = time.monotonic() - self.start
        print(
            f"[{dt:8.1f} s] inputs {self.inputs}  ({self.inputs / dt:.0f}/s)  crashes "
            f"{self.crashes}  hangs {self.hangs}  tensor violations "
            f"{self.tensor_violations}  inputs with problems {self.failures}",
            flush=True,
        )
        self.write_summary()

    def done(self) -> bool:
        return self.inputs >= self.args.runs or (
            self.args.max_time and time.monotonic() - self.start >= self.args.max_time
        )

    def summary(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "inputs": self.inputs,
            "seconds": round(time.monotonic() - self.start, 1),
            "crashes": self.crashes,
            "hangs": self.hangs,
            "tensor_violations": self.tensor_violations,
            "inputs_with_problems": self.failures,
            "problem_kinds": dict(self.kinds),
            "inputs_that_changed_a_tensor": self.changed,
            "reply_statuses": dict(self.statuses),
            "protected_tensors": "intact"
            if self.tensor_violations == 0
            else f"{self.tensor_violations} violation(s)",
            "command": " ".join(sys.argv),
        }

    def write_summary(self) -> None:
        Path(self.args.summary).write_text(json.dumps(self.summary(), indent=2) + "\n")

    def finish(self) -> int:
        self.write_summary()
        s = self.summary()
        print(
            f"\nfuzz campaign ({s['engine']}): {s['inputs']} inputs in {s['seconds']} s; "
            f"crashes {s['crashes']}, hangs {s['hangs']}, tensor-check violations "
            f"{s['tensor_violations']}, inputs with any problem {s['inputs_with_problems']}; "
            f"protected tensors {s['protected_tensors']}; summary in {self.args.summary}",
            flush=True,
        )
        return 0 if self.failures == 0 else 1


# -- the atheris engine ----------------------------------------------------------


def run_atheris(args: argparse.Namespace) -> int:
    import atheris

    with atheris.instrument_imports(include=["irdma", "irdma_psd"]):
        from tests.helpers.fuzz_harness import Harness

    harness = Harnesses(Harness, args)
    campaign = Campaign(args, "atheris (libFuzzer, coverage-guided)")
    corpus = Path(args.corpus)
    corpus.mkdir(parents=True, exist_ok=True)
    for seed in harness.seeds():
        (corpus / f"seed-{hashlib.sha1(seed).hexdigest()[:12]}").write_bytes(seed)
    dictionary = Path(args.summary).with_suffix(".dict")
    dictionary.write_text("".join(f'"{_dict_escape(t)}"\n' for t in TOKENS))

    # Trio runs in its own thread; libFuzzer calls TestOneInput on the main one.
    ready = threading.Event()
    token: list[trio.lowlevel.TrioToken] = []

    async def loop() -> None:
        async with harness.serving():
            token.append(trio.lowlevel.current_trio_token())
            ready.set()
            await trio.sleep_forever()

    threading.Thread(target=trio.run, args=(loop,), daemon=True).start()
    ready.wait()

    def mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if rng.random() < 0.3:
            out = mutate_json(rng, data)
            if out is not None and len(out) <= max_size:
                return out
        return atheris.Mutate(data, max_size)

    def test_one_input(data: bytes) -> None:
        outcome = trio.from_thread.run(harness.run, data, trio_token=token[0])
        campaign.record(data, outcome)
        if outcome.problems and args.stop_on_finding:
            raise RuntimeError("; ".join(outcome.problems))
        if campaign.done():
            status = campaign.finish()
            sys.stdout.flush()
            os._exit(status)  # libFuzzer would exit without running Python's cleanup anyway

    argv = [
        sys.argv[0],
        f"-max_len={args.max_len}",
        f"-dict={dictionary}",
        "-timeout=60",
        f"-seed={args.seed}",
        "-print_final_stats=1",
        str(corpus),
    ]
    atheris.Setup(argv, test_one_input, custom_mutator=mutator)
    atheris.Fuzz()
    return campaign.finish()


def _dict_escape(token: bytes) -> str:
    return "".join(chr(b) if 32 <= b < 127 and b not in (34, 92) else f"\\x{b:02x}" for b in token)


# -- the random engine -------------------------------------------------------------


def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    b = bytearray(data or b"\x0e")
    for _ in range(rng.randint(1, 4)):
        what = rng.randrange(11)
        if what == 0 and len(b) > 1:  # flip a bit
            i = rng.randrange(1, len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif what == 1:  # set a header field of some frame
            frame = rng.randrange(max(1, (len(b) - 1) // 112 + 1))
            off, size = rng.choice(FIELDS)
            at = 1 + frame * 112 + off
            if at + size <= len(b):
                value = rng.choice(INTERESTING) if rng.random() < 0.7 else rng.getrandbits(64)
                if off == 64 and rng.random() < 0.5:
                    packed = struct.pack("<d", rng.choice([0.0, -1.0, 0.5, 1e308, float("nan")]))
                else:
                    packed = (value % (1 << (8 * size))).to_bytes(size, "little")
                b[at : at + size] = packed
        elif what == 2 and len(b) > 2:  # erase a run
            i = rng.randrange(1, len(b))
            del b[i : i + rng.randint(1, 16)]
        elif what == 3:  # insert random bytes
            i = rng.randrange(1, len(b) + 1)
            b[i:i] = rng.randbytes(rng.randint(1, 16))
        elif what == 4:  # insert a token
            i = rng.randrange(1, len(b) + 1)
            b[i:i] = rng.choice(TOKENS)
        elif what == 5:  # splice another input's frames on
            other = rng.choice(corpus)
            b += other[1 : 1 + rng.randint(0, len(other))]
        elif what == 6:  # the control byte
            b[0] = rng.randrange(256) if rng.random() < 0.2 else (b[0] ^ 1 << rng.randrange(5))
        elif what == 7 and len(b) > 1:  # overwrite with an interesting byte
            b[rng.randrange(1, len(b))] = rng.choice([0, 1, 0x7F, 0x80, 0xFF, 0x5B, 0x7B, 0x22])
        elif what == 8 and len(b) > 1:  # truncate
            del b[rng.randrange(1, len(b)) :]
        elif what >= 9:  # a JSON body's value
            out = mutate_json(rng, bytes(b))
            if out is not None:
                b = bytearray(out)
    return bytes(b[: 1 + 4096])


def run_random(args: argparse.Namespace) -> int:
    from tests.helpers.fuzz_harness import Harness

    harness = Harnesses(Harness, args)
    campaign = Campaign(args, "random mutation of seeds (no coverage feedback)")
    rng = random.Random(args.seed)
    corpus = harness.seeds()
    corpus_dir = Path(args.corpus)
    if corpus_dir.is_dir():
        corpus += [p.read_bytes() for p in sorted(corpus_dir.iterdir()) if p.is_file()]
    seen: set[tuple] = set()

    async def main() -> None:
        async with harness.serving():
            await fuzz()

    async def fuzz() -> None:
        for seed in list(corpus):
            campaign.record(seed, await harness.run(seed))
        while not campaign.done():
            data = mutate(rng, rng.choice(corpus), corpus)
            outcome = await harness.run(data)
            campaign.record(data, outcome)
            sig = tuple((h.op, h.status) for h in outcome.replies[:4])
            if sig not in seen and len(corpus) < 20_000:
                seen.add(sig)
                corpus.append(data)
            if outcome.problems and args.stop_on_finding:
                return

    trio.run(main)
    return campaign.finish()


def run_replay(args: argparse.Namespace) -> int:
    """Serve saved inputs (a finding, say) once each; print the problems and tracebacks."""
    from irdma.protocol import Status
    from tests.helpers.fuzz_harness import Harness

    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.ERROR)  # an escaped exception, with its traceback
    logging.getLogger("psd").addHandler(handler)
    harness = Harnesses(Harness, args)
    failed = 0

    async def main() -> None:
        nonlocal failed
        async with harness.serving():
            for path in args.replay:
                outcome = await harness.run(Path(path).read_bytes())
                replies = ", ".join(f"op {h.op}: {Status(h.status).name}" for h in outcome.replies)
                print(f"{path}: replies [{replies}]")
                for problem in outcome.problems:
                    print(f"  PROBLEM {problem}")
                failed += bool(outcome.problems)

    trio.run(main)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    parser.add_argument("--runs", type=int, default=1_000_000, help="inputs to run")
    parser.add_argument("--max-time", type=float, default=0, help="stop after this many seconds")
    parser.add_argument("--max-len", type=int, default=4096, help="longest input (atheris)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--hang-timeout", type=float, default=10.0)
    parser.add_argument("--probe-every", type=int, default=50)
    parser.add_argument("--report", type=int, default=10_000, help="progress line every N")
    parser.add_argument("--corpus", default=str(ROOT / "bench" / "results" / "fuzz-corpus"))
    parser.add_argument("--findings", default=str(ROOT / "bench" / "results" / "fuzz-findings"))
    parser.add_argument("--summary", default=str(ROOT / "bench" / "results" / "fuzz.json"))
    parser.add_argument("--stop-on-finding", action="store_true")
    parser.add_argument("--replay", nargs="+", metavar="FILE", help="serve these inputs once")
    args = parser.parse_args(argv)
    if args.replay:
        return run_replay(args)
    engine = args.engine
    if engine == "auto":
        try:
            import atheris  # noqa: F401
        except ImportError:
            engine = "random"
        else:
            engine = "atheris"
    Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
    return run_atheris(args) if engine == "atheris" else run_random(args)


if __name__ == "__main__":
    sys.exit(main())
