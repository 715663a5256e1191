"""The tensor commands of ``irdma``: put, get, cp, ls, stat, rm.

Each takes an open AsyncClient and the parsed arguments and returns the exit
status. Errors are raised as irdma errors or FileProblem with messages in the
command line's own terms (the flag to use, the file and the tensor); the
error boundary (``irdma.cli.boundary``) prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .. import names as namesmod
from ..client import AsyncClient, TensorInfo, as_stored_array
from ..errors import DtypeMismatch, IrdmaError, ShapeMismatch, TensorNotFound
from ..names import base_name, is_internal, is_pattern, literal_prefix, matches, relative
from ..protocol import validate_name
from ..training.modes import describe_options
from . import tensorfiles
from .tensorfiles import FileProblem, Kind

PROGRESS_MIN_BYTES = 4 << 20


def progress_bar(total: int, desc: str) -> tuple[Callable[[int], None] | None, Callable[[], None]]:
    """A tqdm byte counter for transfers over a few MB (shown only on a terminal)."""
    if total < PROGRESS_MIN_BYTES:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        leave=False,
        disable=None,
    )

    def advance(n: int) -> None:
        bar.update(n)  # its bool (whether it redrew) is of no use to a Progress

    return advance, bar.close


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def layout(dtype: object, shape: Sequence[int]) -> str:
    return f"{dtype} {list(shape)}"


async def write_checked(
    client: AsyncClient,
    name: str,
    array: np.ndarray,
    *,
    source: str,
    replace: bool,
    options: dict | None = None,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Store ``array`` as ``name``; a layout clash names both layouts and ``--replace``."""
    try:
        await client.write(name, array, replace=replace, options=options, progress=progress)
    except (DtypeMismatch, ShapeMismatch):
        info = await client.stat(name)
        raise IrdmaError(
            f"{name} is {layout(info.dtype, info.shape)} in the cluster and {source} is "
            f"{layout(array.dtype, array.shape)}; add --replace to redefine it"
        ) from None


# -- selections ----------------------------------------------------------------


class Selection:
    """Tensors a NAME argument stands for, and the root their relative names start after."""

    def __init__(self, infos: list[TensorInfo], root: str, single: bool) -> None:
        self.infos = infos
        self.root = root
        self.single = single  # NAME is one tensor (not a group or a pattern)

    def key(self, info: TensorInfo) -> str:
        """The tensor's name inside a file or directory holding the selection."""
        return base_name(info.name) if self.single else relative(info.name, self.root)

    @property
    def nbytes(self) -> int:
        return sum(i.nbytes for i in self.infos)


async def under(client: AsyncClient, prefix: str, *, internal: bool = False) -> list[TensorInfo]:
    """Tensors whose names start with ``prefix``; directory markers only if ``internal``."""
    return [i for i in await client.list(prefix) if internal or not is_internal(i.name)]


async def matching(
    client: AsyncClient, pattern: str, *, internal: bool = False
) -> list[TensorInfo]:
    infos = await under(client, literal_prefix(pattern), internal=internal)
    return [i for i in infos if matches(pattern, i.name)]


async def stat_or_none(client: AsyncClient, name: str) -> TensorInfo | None:
    if not name or name.endswith("/"):
        return None  # a group's name, never a tensor's
    try:
        return await client.stat(name)
    except TensorNotFound:
        return None


async def select(client: AsyncClient, name: str, *, internal: bool = False) -> Selection:
    """One tensor, every tensor under ``name/``, or every match of a pattern."""
    if is_pattern(name):
        infos = await matching(client, name, internal=internal)
        if not infos:
            raise TensorNotFound(f"no tensor matches {name!r}")
        return Selection(infos, namesmod.group_root(name), single=False)
    info = await stat_or_none(client, name)
    if info is not None:
        return Selection([info], "", single=True)
    prefix = name.rstrip("/") + "/"
    infos = await under(client, prefix, internal=internal)
    if not infos:
        raise TensorNotFound(f"no tensor named {name.rstrip('/')!r}, and none under {prefix!r}")
    return Selection(infos, prefix, single=False)


# -- put -----------------------------------------------------------------------


def put_pairs(items: Sequence[str]) -> list[tuple[str, str]]:
    return [(items[i], items[i + 1]) for i in range(0, len(items) - 1, 2)]


def put_argument_problem(items: Sequence[str]) -> str | None:
    """What is wrong with ``put``'s NAME FILE list before anything is read, if anything."""
    if len(items) % 2:
        return f"expected NAME FILE pairs, got {len(items)} arguments (the last one has no pair)"
    for name, source in put_pairs(items):
        if source != "-" and not os.path.exists(source) and os.path.exists(name):
            return (
                f"{name!r} is a file and {source!r} is not: put takes the tensor name first, "
                f"then the file (irdma put {source} {name})"
            )
    return None


def tensor_name(name: str, one: bool) -> str:
    """The name to store under: no trailing '/', and for one array no '.npy'
    (the mount shows a tensor ``m/w`` as ``m/w.npy``; ``m/w.npy`` would be ``w.npy.npy``)."""
    name = name.rstrip("/")
    if one and name.endswith(".npy") and len(base_name(name)) > len(".npy"):
        name = name[: -len(".npy")]
    return name


@dataclass(frozen=True)
class Upload:
    """One tensor ``put`` stores: its name, the array and where the array came from."""

    name: str
    array: np.ndarray
    source: str  # the file, and the array's name inside it: m.npz (fc.weight)
    group: str = ""  # for an array of a file of several: the prefix they are put under


def planned_uploads(items: Sequence[str]) -> list[Upload]:
    """Every tensor of every NAME FILE pair, read and named; FileProblem or IrdmaError
    for a bad file, a bad name, an unstorable dtype or a name given twice."""
    uploads: list[Upload] = []
    for name, source in put_pairs(items):
        arrays = tensorfiles.read_arrays(source)
        if not arrays:
            # An empty .npz, .safetensors or directory: say so rather than put nothing quietly.
            raise IrdmaError(f"{source} holds no tensors; nothing was put")
        one = list(arrays) == [""]
        target = tensor_name(name, one)
        for key, arr in arrays.items():
            where = f"{source} ({key})" if key else source
            full = f"{target}/{key}" if key else target
            try:
                validate_name(full)
                arr = as_stored_array(arr)
            except ValueError as exc:
                raise IrdmaError(f"{where}: {exc}; nothing was put") from None
            uploads.append(Upload(full, arr, where, f"{target}/" if key else ""))
    seen: dict[str, str] = {}
    for u in uploads:
        if u.name in seen:
            raise IrdmaError(
                f"{u.name} would come from both {seen[u.name]} and {u.source}; nothing was put"
            )
        seen[u.name] = u.source
    return uploads


async def layout_clashes(client: AsyncClient, uploads: Sequence[Upload]) -> list[str]:
    """One line per upload whose tensor exists with another dtype or shape."""
    # A file of many arrays is checked with one listing of its group, not a stat each.
    listed: dict[str, TensorInfo] = {}
    for group in dict.fromkeys(u.group for u in uploads if u.group):
        listed.update((i.name, i) for i in await client.list(group))
    clashes = []
    for u in uploads:
        info = listed.get(u.name) if u.group else await stat_or_none(client, u.name)
        if info is not None and (
            info.meta.np_dtype != u.array.dtype or info.shape != u.array.shape
        ):
            clashes.append(
                f"{u.name} is {layout(info.dtype, info.shape)} in the cluster and {u.source} "
                f"is {layout(u.array.dtype, u.array.shape)}"
            )
    return clashes


class PartialPut(IrdmaError):
    """A put that failed after writing some of its tensors: says which were and were not."""

    def __init__(self, at: str, cause: Exception, written: list[str], left: list[str]) -> None:
        done = ", ".join(written) if written else "none"
        # The one it failed at may hold part of the new bytes: it is not written.
        rest = ", ".join([f"{at} (failed)", *left[1:]])
        super().__init__(
            f"put failed at {at}: {cause}; written: {done}; not written: {rest} "
            f"({len(written)} of {len(written) + len(left)} put)"
        )


async def cmd_put(client: AsyncClient, args: argparse.Namespace) -> int:
    """Check every tensor first (files, names, dtypes, layouts), then write them all:
    a put refused for one tensor writes none."""
    uploads = planned_uploads(args.items)
    if not args.replace:
        clashes = await layout_clashes(client, uploads)
        if len(uploads) == 1 and clashes:
            raise IrdmaError(f"{clashes[0]}; add --replace to redefine it")
        for line in clashes:
            print(f"irdma: {line}", file=sys.stderr)
        if clashes:
            raise IrdmaError(
                f"nothing was put: {len(clashes)} of {len(uploads)} tensors exist with another "
                "dtype or shape; add --replace to redefine them"
            )
    total = sum(u.array.nbytes for u in uploads)
    update, close = progress_bar(total, "put")
    written: list[str] = []
    try:
        for u in uploads:
            try:
                await write_checked(
                    client, u.name, u.array, source=u.source, replace=args.replace, progress=update
                )
            except IrdmaError as exc:
                if len(uploads) == 1:
                    raise
                left = [v.name for v in uploads[len(written) :]]
                raise PartialPut(u.name, exc, written, left) from exc
            written.append(u.name)
            if not update:
                print(f"{u.name}\t{u.array.dtype}\t{list(u.array.shape)}")
    finally:
        close()
    if update:
        print(f"put {len(uploads)} tensor(s), {human(total)}")
    return 0


# -- get -----------------------------------------------------------------------


def stem(name: str) -> str:
    """The file name several tensors NAME stands for are saved under by default: its last
    part, or for a pattern its folder's (``resnet/``: resnet; ``resnet/*.w``: resnet)."""
    if is_pattern(name):
        name = namesmod.group_root(name)
    return base_name(name.rstrip("/")) or "tensors"


def default_output(name: str, sel: Selection) -> str:
    """Where ``get NAME`` without -o writes, as ``aws s3 cp`` and ``wget`` do: into the
    current directory, named after NAME: the tensor's last name part .npy for one
    tensor, NAME's .npz for several. An existing file is kept: -o names it to overwrite it."""
    one = len(sel.infos) == 1
    path = base_name(sel.infos[0].name) + ".npy" if one else stem(name) + ".npz"
    if os.path.lexists(path):
        raise FileProblem(f"{path} exists; to overwrite it, give it as -o {path}")
    return path


async def cmd_get(client: AsyncClient, args: argparse.Namespace) -> int:
    out = args.output
    if out is not None:
        kind = tensorfiles.kind_of(out, reading=False)  # before asking the daemons anything
    sel = await select(client, args.name)
    if out is None:
        out = default_output(args.name, sel)
        kind = tensorfiles.kind_of(out, reading=False)
    if kind.holds_one and len(sel.infos) != 1:
        stem = args.name.rstrip("/").replace("*", "").rsplit("/", 1)[-1] or "tensors"
        raise FileProblem(
            f"{args.name!r} is {len(sel.infos)} tensors and a .npy holds one: use "
            f"-o {stem}.npz, -o {stem}.safetensors or -o DIR/ (one .npy per tensor)"
        )
    update, close = progress_bar(sel.nbytes, f"get {args.name}")
    try:
        if kind.holds_one:
            tensorfiles.write_one(out, kind, await client.read(sel.infos[0].name, progress=update))
        elif kind == Kind.DIR:
            for info in sel.infos:
                path = tensorfiles.dir_entry(out, sel.key(info))
                path.parent.mkdir(parents=True, exist_ok=True)
                tensorfiles.write_one(
                    str(path), Kind.NPY, await client.read(info.name, progress=update)
                )
        else:
            arrays = {sel.key(i): await client.read(i.name, progress=update) for i in sel.infos}
            tensorfiles.write_many(out, kind, arrays)
    finally:
        close()
    if args.output is None:
        print(out)  # the name it chose, for scripts: f=$(irdma get w)
    return 0


# -- cp ------------------------------------------------------------------------


async def _to_new_names(
    client: AsyncClient, args: argparse.Namespace, verb: str
) -> list[tuple[TensorInfo, str]]:
    """What ``cp`` and ``mv`` take (SRC, a group with -r, or a pattern's matches) and
    the name each goes to under DEST."""
    source, dest = args.source, args.dest
    sel = await select(client, source, internal=True)
    if not sel.single and not args.recursive and not is_pattern(source):
        raise IrdmaError(
            f"{source!r} is a group of {len(sel.infos)} tensors; add -r to {verb} all of them"
        )
    if sel.single:
        targets = [dest + base_name(source) if dest.endswith("/") else dest]
    else:
        root = dest.rstrip("/") + "/"
        targets = [root + sel.key(i) for i in sel.infos]
    for info, target in zip(sel.infos, targets, strict=True):
        if target == info.name:
            raise IrdmaError(f"{info.name!r} and {target!r} are the same tensor")
    return list(zip(sel.infos, targets, strict=True))


async def cmd_cp(client: AsyncClient, args: argparse.Namespace) -> int:
    for info, target in await _to_new_names(client, args, "copy"):
        data = await client.read(info.name)
        await write_checked(
            client, target, data, source=info.name, replace=args.replace, options=info.options
        )
    return 0


async def cmd_mv(client: AsyncClient, args: argparse.Namespace) -> int:
    for info, target in await _to_new_names(client, args, "move"):
        await client.rename(info.name, target, replace=args.replace)
    return 0


# -- ls, stat, rm --------------------------------------------------------------


def ls_row(i: TensorInfo, human_sizes: bool) -> str:
    shape = "x".join(map(str, i.shape)) or "scalar"
    size = human(i.nbytes) if human_sizes else str(i.nbytes)
    return f"{i.name}\t{i.dtype}\t{shape}\t{size}\tv{i.version}"


async def cmd_ls(client: AsyncClient, args: argparse.Namespace) -> int:
    found: dict[str, TensorInfo] = {}
    unmatched = []
    for arg in args.patterns or [""]:
        if is_pattern(arg):
            infos = await matching(client, arg, internal=args.all)
            if not infos:
                unmatched.append(arg)
        else:
            infos = await under(client, arg, internal=args.all)
            # No argument is the whole cluster, which may be empty; a directory the
            # mount made holds its marker, so an empty one is there.
            if not infos and arg and not await under(client, arg, internal=True):
                unmatched.append(arg)
        found.update((i.name, i) for i in infos)
    infos = [found[n] for n in sorted(found)]
    if args.json:
        print(json.dumps([i.to_dict() for i in infos], indent=2))
    else:
        for i in infos:
            print(ls_row(i, args.human) if args.long else i.name)
    for arg in unmatched:
        what = "matches" if is_pattern(arg) else "is named or starts with"
        print(f"irdma: no tensor {what} {arg!r}", file=sys.stderr)
    return 1 if unmatched else 0


def stat_record(info: TensorInfo) -> dict:
    d = info.to_dict()
    d["mode"] = describe_options(info.options)
    return d


async def cmd_stat(client: AsyncClient, args: argparse.Namespace) -> int:
    records = []
    missing = []
    for name in args.names:
        try:
            records.append(stat_record(await client.stat(name)))
        except TensorNotFound as exc:
            missing.append(str(exc))
    if args.json:
        if records:
            print(json.dumps(records[0] if len(args.names) == 1 else records, indent=2))
    else:
        for n, d in enumerate(records):
            if n:
                print()
            for t in ("mtime", "ctime"):
                d[t] = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(d[t]))
            width = max(map(len, d))
            for k, v in d.items():
                print(f"{k:<{width}}  {v}")
    for line in missing:
        print(f"irdma: {line}", file=sys.stderr)
    return 1 if missing else 0


async def to_remove(client: AsyncClient, name: str, recursive: bool) -> list[str]:
    """The tensors ``rm NAME`` deletes; raises TensorNotFound with the flag to use."""
    if is_pattern(name):
        return [i.name for i in (await select(client, name, internal=True)).infos]
    info = await stat_or_none(client, name)
    group = await under(client, name.rstrip("/") + "/", internal=True)
    if group and not recursive:
        if info is None:
            raise TensorNotFound(
                f"{name.rstrip('/')!r} is a group of {len(group)} tensors; "
                "add -r to delete all of them"
            )
        group = []  # the tensor itself only, as asked
    found = ([info.name] if info else []) + [i.name for i in group]
    if not found:
        raise TensorNotFound(f"no tensor named {name.rstrip('/')!r}")
    return found


async def cmd_rm(client: AsyncClient, args: argparse.Namespace) -> int:
    failed = 0
    for name in args.names:
        try:
            for tensor in await to_remove(client, name, args.recursive):
                await client.delete(tensor)
        except TensorNotFound as exc:
            print(f"irdma: {exc}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


COMMANDS = {
    "put": cmd_put,
    "get": cmd_get,
    "cp": cmd_cp,
    "mv": cmd_mv,
    "ls": cmd_ls,
    "stat": cmd_stat,
    "rm": cmd_rm,
}
