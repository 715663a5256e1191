"""Arrays in files, as ``irdma put`` reads them and ``irdma get`` writes them.

The type comes from the path first: ``-`` is stdin/stdout (one .npy), an
existing directory or a path ending in ``/`` holds one ``.npy`` per tensor,
otherwise the extension says (.npy, .npz, .safetensors). Errors name the file,
what is wrong with it and what would work, in one line.
"""

from __future__ import annotations

import enum
import io
import os
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np
from numpy.lib import format as npformat

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
SUPPORTED = (
    ".npy (one tensor), .npz, .safetensors, a directory (DIR/, one .npy per tensor) "
    "or - (stdin/stdout, one .npy)"
)


class Kind(enum.Enum):
    NPY = ".npy"
    NPZ = ".npz"
    SAFETENSORS = ".safetensors"
    DIR = "directory"
    STD = "-"

    @property
    def holds_one(self) -> bool:
        """Whether the file holds exactly one tensor (no names inside)."""
        return self in (Kind.NPY, Kind.STD)


class FileProblem(ValueError):
    """A file that cannot be read as arrays, or a path of a type irdma cannot write."""


def kind_of(path: str, *, reading: bool) -> Kind:
    """What ``path`` is, from its form and extension; FileProblem naming the supported types."""
    if path == "-":
        return Kind.STD
    if path.endswith(os.sep) or os.path.isdir(path):
        return Kind.DIR
    suffix = Path(path).suffix.lower()
    for kind in (Kind.NPY, Kind.NPZ, Kind.SAFETENSORS):
        if suffix == kind.value:
            return kind
    what = f"'{suffix}' files" if suffix else "files without an extension"
    verb = "read" if reading else "write"
    raise FileProblem(f"{path}: irdma cannot {verb} {what}; use {SUPPORTED}")


# -- reading -------------------------------------------------------------------


def read_arrays(path: str) -> dict[str, np.ndarray]:
    """The arrays in ``path``, by name ('' for a file that holds one)."""
    kind = kind_of(path, reading=True)
    if kind == Kind.STD:
        return {"": _read_npy(io.BytesIO(sys.stdin.buffer.read()), "stdin")}
    if kind == Kind.DIR:
        return dict(_read_dir(Path(path)))
    if kind == Kind.NPY:
        with open(path, "rb") as f:
            return {"": _read_npy(f, path)}
    if kind == Kind.NPZ:
        return _read_npz(path)
    return _read_safetensors(path)


def _read_npy(f: BinaryIO, where: str) -> np.ndarray:
    head = f.read(len(NPY_MAGIC))
    if head != NPY_MAGIC:
        raise FileProblem(
            f"{where}: not a .npy file (it starts with {head[:16]!r}, not the .npy magic "
            f"{NPY_MAGIC!r}); write one with numpy.save"
        )
    f.seek(0)
    try:
        return np.load(f, allow_pickle=False)
    except ValueError as exc:
        raise FileProblem(_npy_problem(where, exc)) from None


def _npy_problem(where: str, exc: ValueError) -> str:
    # numpy says how to load pickles unsafely; what the user needs to know is
    # that irdma stores numbers only.
    if "pickle" in str(exc):
        return (
            f"{where}: holds Python objects (a pickled, object-dtype array), not numbers; "
            "irdma stores numeric arrays only"
        )
    return f"{where}: not a valid .npy file: {exc}"


def _read_npz(path: str) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        head = f.read(len(ZIP_MAGIC))
    if head != ZIP_MAGIC:
        raise FileProblem(
            f"{path}: not a .npz file (it starts with {head!r}, not a zip archive's "
            f"{ZIP_MAGIC!r}); write one with numpy.savez"
        )
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {}
            for name in z.files:
                try:
                    out[name] = z[name]
                except ValueError as exc:
                    raise FileProblem(_npy_problem(f"{path}: array {name!r}", exc)) from None
            return out
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise FileProblem(f"{path}: not a valid .npz file: {exc}") from None


def _read_safetensors(path: str) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    if not os.path.exists(path):  # the library's own message does not name the file
        raise FileNotFoundError(2, "No such file or directory", path)
    try:
        return dict(load_file(path))
    except (SafetensorError, ValueError, TypeError) as exc:
        raise FileProblem(f"{path}: not a valid .safetensors file: {exc}") from None


def _read_dir(root: Path) -> Iterator[tuple[str, np.ndarray]]:
    """Every .npy under ``root``, named by its path below it without the suffix."""
    files = sorted(p for p in root.rglob("*.npy") if p.is_file())
    if not files:
        raise FileProblem(f"{root}: no .npy files in this directory")
    for p in files:
        with open(p, "rb") as f:
            yield p.relative_to(root).with_suffix("").as_posix(), _read_npy(f, str(p))


# -- writing -------------------------------------------------------------------


class _Stream:
    """A writable that numpy does not take for a file: for a real file numpy
    writes with ndarray.tofile, which needs a seekable one and fails on a pipe."""

    def __init__(self, out: BinaryIO) -> None:
        self.write = out.write


def write_one(path: str, kind: Kind, array: np.ndarray) -> None:
    """Write one array as a .npy file, or to stdout for ``-``."""
    if kind == Kind.STD:
        out = sys.stdout.buffer
        if out.isatty():
            raise FileProblem(
                "refusing to write a binary .npy to a terminal; redirect it "
                "(irdma get NAME -o - > FILE.npy)"
            )
        npformat.write_array(_Stream(out), np.ascontiguousarray(array), allow_pickle=False)
        out.flush()
        return
    np.save(path, array, allow_pickle=False)


def write_many(path: str, kind: Kind, arrays: dict[str, np.ndarray]) -> None:
    """Write named arrays to a .npz or .safetensors file."""
    if kind == Kind.NPZ:
        _write_npz(path, arrays)
    elif kind == Kind.SAFETENSORS:
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, path)
    else:
        raise AssertionError(kind)


def _write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    """The file np.savez writes (one uncompressed .npy member per array), at
    ``path`` as given. np.savez takes the names as keyword arguments, so a
    tensor named ``file`` or ``allow_pickle`` would be taken for its own
    argument (the second one silently left out), and it appends ".npz" to a
    path that ends in ".NPZ"."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, array in arrays.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                npformat.write_array(f, np.asanyarray(array), allow_pickle=False)


def dir_entry(root: str, name: str) -> Path:
    """Where a directory target keeps tensor ``name`` (a path below ``root``)."""
    path = Path(root, *name.split("/"))
    return path.with_name(path.name + ".npy")
