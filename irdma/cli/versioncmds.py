"""The model-version commands of ``irdma``: ``versions MODEL`` and ``get NAME@V``.

A model is the tensors under a prefix committed together as numbered
versions (``irdma.client.versions``). ``NAME@V`` names version V (a number,
or ``latest``) of the model NAME, or of the model above NAME when NAME is one
of its tensors (``policy/layer0.weight@3``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from typing import Any

import numpy as np

from ..client import AsyncClient, manifests
from ..client.manifests import manifests_dir
from ..errors import VersionNotFound
from . import tensorcmds, tensorfiles
from .tensorcmds import human
from .tensorfiles import FileProblem

_AT = re.compile(r"(?P<name>.+)@(?P<version>\d+|latest)\Z")


def versioned(name: str) -> tuple[str, int | None] | None:
    """(name, version: None for the latest) of ``NAME@V``; None for a plain name."""
    m = _AT.match(name)
    if m is None or "/" in m.group("version"):
        return None
    v = m.group("version")
    return m.group("name").rstrip("/"), None if v == "latest" else int(v)


async def find_model(client: AsyncClient, name: str) -> tuple[str, str | None]:
    """(model prefix, tensor within it or None) for ``name``: the longest prefix of
    ``name`` that has versions."""
    parts = name.split("/")
    for cut in range(len(parts), 0, -1):
        prefix = "/".join(parts[:cut])
        if await client.list(manifests_dir(prefix), limit=1):
            rest = "/".join(parts[cut:])
            return prefix, rest or None
    raise VersionNotFound(f"no model with versions at {name!r} or above it")


async def cmd_get(client: AsyncClient, args: argparse.Namespace) -> int:
    """``irdma get``: ``NAME@V`` here, any other NAME as ``tensorcmds.cmd_get``."""
    if versioned(args.name) is None:
        return await tensorcmds.cmd_get(client, args)
    return await cmd_get_version(client, args)


async def cmd_get_version(client: AsyncClient, args: argparse.Namespace) -> int:
    """``irdma get NAME@V``: a version's tensors (checked against their digests)."""
    found = versioned(args.name)
    assert found is not None
    name, version = found
    out = args.output
    if out is not None:
        kind = tensorfiles.kind_of(out, reading=False)
    prefix, tensor = await find_model(client, name)
    model = client.model(prefix)
    snap = await model.read(version, names=None if tensor is None else [tensor])
    label = f"{name.rsplit('/', 1)[-1]}@{snap.version}"
    if out is None:
        out = f"{label}.npy" if tensor is not None else f"{label}.npz"
        if os.path.lexists(out):
            raise FileProblem(f"{out} exists; to overwrite it, give it as -o {out}")
        kind = tensorfiles.kind_of(out, reading=False)
    if kind.holds_one:
        if len(snap.arrays) != 1:
            raise FileProblem(
                f"{args.name!r} is {len(snap.arrays)} tensors and a .npy holds one: use "
                f"-o {label}.npz, -o {label}.safetensors or -o DIR/"
            )
        tensorfiles.write_one(out, kind, next(iter(snap.arrays.values())))
    elif kind == tensorfiles.Kind.DIR:
        for key, arr in snap.arrays.items():
            path = tensorfiles.dir_entry(out, key)
            path.parent.mkdir(parents=True, exist_ok=True)
            tensorfiles.write_one(str(path), tensorfiles.Kind.NPY, arr)
    else:
        tensorfiles.write_many(out, kind, snap.arrays)
    if args.output is None:
        print(out)
    return 0


async def cmd_versions(client: AsyncClient, args: argparse.Namespace) -> int:
    """``irdma versions MODEL``: the committed versions kept, oldest first."""
    model = client.model(args.model)
    rows: list[dict[str, Any]] = []
    pins: dict[int, int] = {}
    for info in await client.list(manifests.pins_dir(model.prefix)):
        found = manifests.bookkeeping_of(info.name)
        if found is not None:
            pins[found[2]] = pins.get(found[2], 0) + 1
    for v in await model.versions():
        m = await model.manifest(v)
        nbytes = 0
        for e in m.tensors.values():
            n = 1
            for d in e.shape:
                n *= d
            nbytes += n * _itemsize(e.dtype)
        rows.append(
            {
                "version": v,
                "committed_at": m.committed_at,
                "tensors": len(m.tensors),
                "bytes": nbytes,
                "writers": m.parts,
                "pins": pins.get(v, 0),
                "extra": dict(m.extra),
            }
        )
    if not rows:
        raise VersionNotFound(f"model {model.prefix!r} has no committed version")
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'VERSION':>8}  {'COMMITTED':19}  {'TENSORS':>7}  {'SIZE':>10}  WRITERS  PINS")
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["committed_at"]))
        size = human(r["bytes"])
        print(
            f"{r['version']:>8}  {when:19}  {r['tensors']:>7}  {size:>10}  "
            f"{r['writers']:>7}  {r['pins']:>4}"
        )
    return 0


def _itemsize(dtype: str) -> int:
    return np.dtype(dtype).itemsize


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("model", metavar="MODEL", help="the model's prefix (policy, runs/7/policy)")
    s.add_argument("--json", action="store_true", help="one JSON list of the versions")
