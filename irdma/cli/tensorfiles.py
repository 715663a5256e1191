"""Arrays in files, as ``irdma put`` reads them and ``irdma get`` writes them.

The type comes from the path first: ``-`` is stdin/stdout (one .npy), an
existing directory or a path ending in ``/`` holds one ``.npy`` per tensor,
otherwise the extension says (.npy, .npz, .safetensors). Errors name the file,
what is wrong with it and what would work, in one line.

Every format carries every dtype irdma stores, bfloat16 and float8 included
(ml_dtypes, ``irdma.dtypes``), and the exact shape, 0-d included. numpy's own
.npy writer cannot name bfloat16 or float8 (``npy_descr``), so .npy and .npz
are written here, header by header; safetensors' numpy loader knows neither,
so a .safetensors file is checked by the safetensors library and its tensors
are then mapped from the file as the header places them.
"""

from __future__ import annotations

import enum
import io
import json
import mmap
import os
import struct
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from ..dtypes import BFLOAT16, FLOAT8_E4M3FN, FLOAT8_E5M2, npy_header
from ..protocol import dtype_code

NPY_MAGIC = b"\x93NUMPY"
ZIP_MAGIC = b"PK\x03\x04"
# An archive of no files (numpy.savez with no arrays) is only its end record.
EMPTY_ZIP_MAGIC = b"PK\x05\x06"
SUPPORTED = (
    ".npy (one tensor), .npz, .safetensors, a directory (DIR/, one .npy per tensor) "
    "or - (stdin/stdout, one .npy)"
)


# safetensors' dtype names and the numpy dtypes irdma stores them as (its
# header is little-endian throughout). It has no complex128.
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype("bool"),
    "U8": np.dtype("<u1"),
    "I8": np.dtype("<i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F16": np.dtype("<f2"),
    "BF16": BFLOAT16,
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "F8_E4M3": FLOAT8_E4M3FN,
    "F8_E5M2": FLOAT8_E5M2,
    "C64": np.dtype("<c8"),
}


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
    """The arrays in ``path``, by name ('' for a file that holds one), each of a
    dtype irdma stores (FileProblem naming the file, the array and the dtype)."""
    arrays = _read_any(path)
    for name, arr in arrays.items():
        _check_storable(f"{path} ({name})" if name else path, arr.dtype)
    return arrays


def _check_storable(where: str, dtype: np.dtype) -> None:
    try:
        dtype_code(dtype)
    except ValueError as exc:
        hint = ""
        if dtype.kind == "V" and dtype.fields is None:
            # What numpy.save makes of a bfloat16 (|V2) or float8 (|V1) array.
            hint = (
                f" (untyped {dtype.itemsize}-byte values: numpy.save writes bfloat16 and "
                "float8 arrays so, without their type; write a .safetensors file, or a .npy "
                "whose descr names the dtype, as irdma get does)"
            )
        raise FileProblem(f"{where}: {exc}{hint}") from None


def _read_any(path: str) -> dict[str, np.ndarray]:
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
    if "'<f1'" in str(exc):
        return (
            f"{where}: not a valid .npy file: {exc} (numpy.save writes a float8_e5m2 array "
            "so, without its type; write a .safetensors file, or a .npy whose descr names "
            "the dtype, as irdma get does)"
        )
    return f"{where}: not a valid .npy file: {exc}"


def _read_npz(path: str) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        head = f.read(len(ZIP_MAGIC))
    if head not in (ZIP_MAGIC, EMPTY_ZIP_MAGIC):
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
    from safetensors import SafetensorError, safe_open

    if not os.path.exists(path):  # the library's own message does not name the file
        raise FileNotFoundError(2, "No such file or directory", path)
    try:
        # The library checks the file (header, offsets, sizes); its numpy
        # loader knows no bfloat16 or float8, so the tensors are mapped here.
        with safe_open(path, framework="np"):
            pass
    except (SafetensorError, ValueError, TypeError, OSError) as exc:
        raise FileProblem(f"{path}: not a valid .safetensors file: {exc}") from None
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        # Not empty: the library has read a header from it.
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    start = 8 + length
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(entry["dtype"])
        if dtype is None:
            raise FileProblem(
                f"{path}: tensor {name!r} is {entry['dtype']}, which irdma does not store; "
                f"it stores {', '.join(SAFETENSORS_DTYPES)} from .safetensors files"
            )
        lo, hi = entry["data_offsets"]
        shape = tuple(entry["shape"])
        if hi == lo:  # no data, perhaps at the very end of the file
            out[name] = np.zeros(shape, dtype)
        else:
            count = (hi - lo) // dtype.itemsize
            out[name] = np.frombuffer(data, dtype, count, start + lo).reshape(shape)
    return out


def _read_dir(root: Path) -> Iterator[tuple[str, np.ndarray]]:
    """Every .npy under ``root``, named by its path below it without the suffix."""
    files = sorted(p for p in root.rglob("*.npy") if p.is_file())
    if not files:
        raise FileProblem(f"{root}: no .npy files in this directory")
    for p in files:
        with open(p, "rb") as f:
            yield p.relative_to(root).with_suffix("").as_posix(), _read_npy(f, str(p))


# -- writing -------------------------------------------------------------------


def _npy_bytes(array: np.ndarray) -> Iterator[bytes | memoryview]:
    """A .npy file of ``array``, in pieces: its header, then its data (C order)."""
    yield npy_header(array.dtype, array.shape)
    if array.nbytes:
        # Not np.ascontiguousarray: it makes a 0-d array 1-d.
        c = array if array.flags.c_contiguous else array.copy(order="C")
        yield c.reshape(-1).view(np.uint8).data


def write_one(path: str, kind: Kind, array: np.ndarray) -> None:
    """Write one array as a .npy file, or to stdout for ``-``."""
    if kind == Kind.STD:
        out = sys.stdout.buffer
        if out.isatty():
            raise FileProblem(
                "refusing to write a binary .npy to a terminal; redirect it "
                "(irdma get NAME -o - > FILE.npy)"
            )
        for piece in _npy_bytes(array):
            out.write(piece)
        out.flush()
        return
    with open(path, "wb") as f:
        for piece in _npy_bytes(array):
            f.write(piece)


def write_many(path: str, kind: Kind, arrays: dict[str, np.ndarray]) -> None:
    """Write named arrays to a .npz or .safetensors file."""
    if kind == Kind.NPZ:
        # As numpy.savez lays it out (one NAME.npy member each, stored), with
        # headers that name bfloat16 and float8. Not np.savez itself: it takes the
        # names as keyword arguments (a tensor named ``file`` or ``allow_pickle``
        # would be taken for its own argument) and appends ".npz" to "X.NPZ".
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for name, array in arrays.items():
                with z.open(f"{name}.npy", "w", force_zip64=True) as member:
                    for piece in _npy_bytes(array):
                        member.write(piece)
    elif kind == Kind.SAFETENSORS:
        from safetensors.numpy import save_file

        names = {dt: st for st, dt in SAFETENSORS_DTYPES.items()}
        for name, array in arrays.items():
            if array.dtype.newbyteorder("<") not in names:
                raise FileProblem(
                    f"{path}: .safetensors has no {array.dtype} dtype (tensor {name!r}); "
                    "write a .npz, a .npy or a directory of .npy files"
                )
        # Not np.ascontiguousarray: it makes a 0-d array 1-d.
        save_file(
            {k: v if v.flags.c_contiguous else v.copy(order="C") for k, v in arrays.items()}, path
        )
    else:
        raise AssertionError(kind)


def dir_entry(root: str, name: str) -> Path:
    """Where a directory target keeps tensor ``name`` (a path below ``root``)."""
    path = Path(root, *name.split("/"))
    return path.with_name(path.name + ".npy")
