"""What a path in the mount means: the namespace, with no I/O.

    <dir>/<tensor>.npy                 a typed tensor as a .npy file (header, then data)
    <dir>/<file>                       any other name: a raw byte tensor (a checkpoint, a JSON file)
    <dir>/.shards/<tensor>/<N>         shard N of <dir>/<tensor> as raw bytes
    <dir>/.accumulate/<tensor>.npy     write a .npy here to add it into <dir>/<tensor>
    <dir>/.worker/<R>/<T>/<tensor>.npy training worker R at step T: reading it pulls
                                       the tensor for step T (waiting as the tensor's
                                       training mode says), writing it pushes R's
                                       gradient for step T
    <dir>/                             a directory: a name prefix (mkdir leaves a marker tensor)
    <model>/@<V>/<tensor>.npy          tensor <tensor> of committed version V of the model
                                       under <model> (``irdma.client.versions``): read-only

``.shards``, ``.accumulate`` and ``.worker`` are not listed by readdir (so
``cp -r`` and ``rsync`` do not copy data twice) but can be opened by path.
A model's own bookkeeping (``@versions``, ``@pins``, ``@parts``) and versions
not committed (being written, or left by a writer that died) are neither
listed nor found; nothing under a model's ``@`` directories can be changed
through the mount (EROFS): a version is immutable once committed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# mkdir stores this zero-size tensor so an empty directory exists for every
# mount (one definition with the command line, which hides it from listings).
from irdma import DIR_MARKER, MAX_NAME_BYTES, manifests

# The longest name of one entry (statfs's namemax; ENAMETOOLONG beyond), in bytes.
NAME_MAX = 255
# The longest path from the mount's root: a tensor name's limit, less room for a
# directory's marker under it (so a directory that can be named can be made).
PATH_MAX = MAX_NAME_BYTES - len("/" + DIR_MARKER)
NPY = ".npy"
SHARDS = ".shards"
ACCUMULATE = ".accumulate"
WORKER = ".worker"
RESERVED = frozenset({SHARDS, ACCUMULATE, WORKER, DIR_MARKER})
# A model's bookkeeping directories: never listed or changed through the mount.
MODEL_INTERNAL = frozenset({manifests.VERSIONS_DIR, manifests.PINS_DIR, manifests.PARTS_DIR})
# Tensors created through the mount from a file without .npy carry this option.
RAW_OPTION = "raw"


class Kind(enum.Enum):
    ROOT = "root"
    DIR = "dir"  # a prefix: tensors or a marker under it
    TENSOR = "tensor"  # <dir>/<name>.npy (typed) or <dir>/<name> (raw)
    SHARDS_DIR = "shards_dir"  # <dir>/.shards
    SHARD_TENSOR_DIR = "shard_tensor_dir"  # <dir>/.shards/<tensor>
    SHARD = "shard"  # <dir>/.shards/<tensor>/<N>
    ACCUMULATE_DIR = "accumulate_dir"  # <dir>/.accumulate
    ACCUMULATE = "accumulate"  # <dir>/.accumulate/<tensor>.npy
    WORKER_DIR = "worker_dir"  # <dir>/.worker, <dir>/.worker/<R>, <dir>/.worker/<R>/<T>
    STEP = "step"  # <dir>/.worker/<R>/<T>/<tensor>.npy


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed mount path: what it is and the tensor name (or prefix) behind it.

    For TENSOR, ``name`` is the tensor and ``typed`` tells .npy from raw bytes
    (a raw file's tensor name keeps its extension). For SHARD, ``index`` is
    the shard. For DIR and the special directories, ``name`` is the prefix of
    the directory's own tensors ('' at the root).
    """

    kind: Kind
    name: str = ""
    typed: bool = False
    index: int = -1
    worker: int = -1  # STEP: the training worker's rank
    step: int = 0  # STEP: its training step

    @property
    def is_dir(self) -> bool:
        return self.kind not in (Kind.TENSOR, Kind.SHARD, Kind.ACCUMULATE, Kind.STEP)


def join(prefix: str, part: str) -> str:
    return f"{prefix}/{part}" if prefix else part


def parent(path: str) -> str:
    """The directory ``path`` is in ('' for the root's entries)."""
    return path.rpartition("/")[0]


def parse(path: str) -> Target | None:
    """The target of a mount-relative path ('' is the root); None if it cannot exist."""
    parts = [p for p in path.split("/") if p]
    if not parts:
        return Target(Kind.ROOT)
    for i, part in enumerate(parts):
        if part == SHARDS:
            return _parse_shards(parts[:i], parts[i + 1 :])
        if part == ACCUMULATE:
            return _parse_accumulate(parts[:i], parts[i + 1 :])
        if part == WORKER:
            return _parse_worker(parts[:i], parts[i + 1 :])
        if part in (DIR_MARKER, ".", ".."):
            return None
    # The last part is a file or a directory; the caller tells which by asking
    # the daemons. Here: a name ending in .npy is a typed tensor candidate.
    return Target(Kind.DIR, "/".join(parts))


def _parse_shards(dirparts: list[str], rest: list[str]) -> Target | None:
    prefix = "/".join(dirparts)
    if not rest:
        return Target(Kind.SHARDS_DIR, prefix)
    tensor = join(prefix, rest[0])
    if len(rest) == 1:
        return Target(Kind.SHARD_TENSOR_DIR, tensor)
    index = _number(rest[1]) if len(rest) == 2 else None
    if index is not None:
        return Target(Kind.SHARD, tensor, index=index)
    return None


def _number(text: str) -> int | None:
    # ASCII digits only (str.isdigit accepts '²' and other scripts' digits), no leading zeros.
    if text.isascii() and text.isdigit() and (text == "0" or not text.startswith("0")):
        return int(text)
    return None


def _parse_worker(dirparts: list[str], rest: list[str]) -> Target | None:
    prefix = "/".join(dirparts)
    numbers = [_number(p) for p in rest[:2]]
    if None in numbers or any(p in RESERVED or p in (".", "..") for p in rest[2:]):
        return None
    if len(rest) <= 2:
        return Target(Kind.WORKER_DIR, prefix)
    worker, step = numbers
    assert worker is not None and step is not None
    last = rest[-1]
    if last.endswith(NPY) and len(last) > len(NPY):
        name = join(prefix, "/".join([*rest[2:-1], last[: -len(NPY)]]))
        return Target(Kind.STEP, name, typed=True, worker=worker, step=step)
    return Target(Kind.WORKER_DIR, join(prefix, "/".join(rest[2:])))


def _parse_accumulate(dirparts: list[str], rest: list[str]) -> Target | None:
    prefix = "/".join(dirparts)
    if not rest:
        return Target(Kind.ACCUMULATE_DIR, prefix)
    if len(rest) == 1 and rest[0].endswith(NPY) and len(rest[0]) > len(NPY):
        return Target(Kind.ACCUMULATE, join(prefix, rest[0][: -len(NPY)]), typed=True)
    return None


def file_candidates(path: str) -> list[Target]:
    """The tensors a plain path could be, most specific first.

    ``m/w.npy`` is the typed tensor ``m/w`` or a raw file ``m/w.npy``;
    ``m/ckpt.pt`` can only be the raw file ``m/ckpt.pt``.
    """
    parts = [p for p in path.split("/") if p]
    if not parts:
        return []
    last = parts[-1]
    prefix = "/".join(parts[:-1])
    out = []
    if last.endswith(NPY) and len(last) > len(NPY):
        out.append(Target(Kind.TENSOR, join(prefix, last[: -len(NPY)]), typed=True))
    out.append(Target(Kind.TENSOR, join(prefix, last), typed=False))
    return out


def entry_name(tensor_name: str, raw: bool, prefix: str) -> str | None:
    """The directory entry a tensor shows as inside directory ``prefix``.

    Returns the file name for a tensor directly in the directory, the first
    path component for a tensor deeper down (a subdirectory), or None.
    """
    head = f"{prefix}/" if prefix else ""
    if not tensor_name.startswith(head):
        return None
    rest = tensor_name[len(head) :]
    if "/" in rest:
        return rest.split("/", 1)[0] + "/"
    if rest == DIR_MARKER:
        return None
    return rest if raw else rest + NPY


def moved_target(target: Target, path: str) -> Target:
    """What ``target`` is once its file is at ``path`` (its directory was renamed)."""
    if target.kind == Kind.TENSOR:
        candidates = file_candidates(path)
        return candidates[0] if target.typed else candidates[-1]
    return parse(path) or target


def model_version(path: str) -> tuple[str, int] | None:
    """(model prefix, version) of a path in a model version's directory
    (``m/@3/w.npy``: ``("m", 3)``), None for any other path."""
    parts = [p for p in path.split("/") if p]
    for i, part in enumerate(parts):
        version = manifests.version_of_dir(part)
        if version is not None:
            return "/".join(parts[:i]), version
    return None


def read_only(path: str) -> bool:
    """Whether ``path`` is in a model version or a model's bookkeeping (EROFS)."""
    return any(
        manifests.version_of_dir(p) is not None or p in MODEL_INTERNAL for p in path.split("/") if p
    )
