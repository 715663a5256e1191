"""Model versions as stored: the names they live under and the manifest that commits one.

No I/O here (``irdma.client.versions`` does it). A model is the tensors under
a prefix (``policy``); version ``v`` of it is made of immutable tensors named
``policy/@v/<tensor>`` and is committed, all at once, when its manifest
``policy/@versions/<v>`` holds a valid document listing them (name, dtype,
shape, digest). A manifest's tensor exists from the moment a writer claims
``v`` (an exclusive create, so two writers never take the same number) and
holds zeros until the commit writes it whole: a reader that finds zeros
finds a version still being written, or one whose writer died, and never
reads it.

Pins (``policy/@pins/<v>/<id>``: one float64, the time it runs out) keep a
version from being pruned while someone reads it; parts
(``policy/@parts/<v>/<id>``) are what each of several writers wrote, until
one of them commits.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster.version_numbers import DIGITS
from ..protocol import validate_name

# The document a manifest holds says what it is, so zeros, or bytes of
# something else, are never taken for a commit.
MANIFEST_FORMAT = "irdma-model-version/1"
VERSIONS_DIR = "@versions"
PINS_DIR = "@pins"
PARTS_DIR = "@parts"
# How many committed versions a model keeps unless its writer says otherwise.
DEFAULT_KEEP = 4
# Digits of a manifest's name: names sort as numbers do (LIST answers sorted). The
# same width as etcd's record of the numbers (``irdma.cluster.version_numbers``).
VERSION_DIGITS = DIGITS

_VERSION_DIR = re.compile(r"@(\d+)\Z")


class ManifestError(ValueError):
    """A manifest's bytes are not a committed version (zeros, or not this format)."""


def check_prefix(prefix: str) -> str:
    """A model's prefix (``policy`` or ``runs/7/policy``): a tensor name whose parts
    do not start with ``@`` (those are the versions' own). Returned without a
    trailing ``/``."""
    prefix = prefix.rstrip("/")
    validate_name(prefix)
    if any(part.startswith("@") for part in prefix.split("/")):
        raise ValueError(f"model prefix {prefix!r} has a part starting with '@' (versions' own)")
    return prefix


def check_tensor_name(name: str) -> str:
    """A tensor's name within a model (``layers.0.weight``, ``encoder/proj``)."""
    validate_name(name)
    if any(part.startswith("@") for part in name.split("/")):
        raise ValueError(f"tensor name {name!r} has a part starting with '@' (versions' own)")
    return name


def check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"a model version is a positive integer, not {version!r}")
    if version >= 10**VERSION_DIGITS:
        raise ValueError(f"version {version} has more than {VERSION_DIGITS} digits")
    return version


def version_dir(prefix: str, version: int) -> str:
    """Where version ``version``'s tensors live: ``policy/@7``."""
    return f"{prefix}/@{version}"


def stored_name(prefix: str, version: int, name: str) -> str:
    """The immutable tensor holding ``name`` at ``version``."""
    return f"{version_dir(prefix, version)}/{name}"


def manifests_dir(prefix: str) -> str:
    return f"{prefix}/{VERSIONS_DIR}/"


def manifest_name(prefix: str, version: int) -> str:
    return f"{prefix}/{VERSIONS_DIR}/{version:0{VERSION_DIGITS}d}"


def version_of_manifest(prefix: str, name: str) -> int | None:
    """The version a manifest's tensor name is for, or None if it is not one."""
    head = manifests_dir(prefix)
    if not name.startswith(head):
        return None
    digits = name[len(head) :]
    if len(digits) != VERSION_DIGITS or not digits.isdigit():
        return None
    return int(digits) or None


def bookkeeping_of(name: str) -> tuple[str, str, int] | None:
    """(model prefix, ``VERSIONS_DIR`` or ``PINS_DIR``, version) of a manifest's or a
    pin's tensor name; None for any other name (what a daemon counts for metrics)."""
    for kind in (VERSIONS_DIR, PINS_DIR):
        head, sep, rest = name.partition(f"/{kind}/")
        if not sep or not head:
            continue
        digits = rest.split("/", 1)[0]
        if digits.isdigit() and int(digits) > 0:
            return head, kind, int(digits)
    return None


def version_of_dir(part: str) -> int | None:
    """The version a ``@7`` path part names, or None."""
    m = _VERSION_DIR.match(part)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def pins_dir(prefix: str, version: int | None = None) -> str:
    if version is None:
        return f"{prefix}/{PINS_DIR}/"
    return f"{prefix}/{PINS_DIR}/{version}/"


def pin_name(prefix: str, version: int, pin_id: str) -> str:
    return f"{pins_dir(prefix, version)}{pin_id}"


def parts_dir(prefix: str, version: int) -> str:
    return f"{prefix}/{PARTS_DIR}/{version}/"


def part_name(prefix: str, version: int, part_id: str) -> str:
    return f"{parts_dir(prefix, version)}{part_id}"


def digest(data: Any) -> str:
    """The digest a manifest keeps of a tensor's bytes (SHA-256, hex): what
    ``hashlib.sha256(array.tobytes()).hexdigest()`` gives for a C-ordered,
    little-endian array, so a user can check it without irdma."""
    if isinstance(data, np.ndarray):  # bfloat16 and float8 export no buffer: their bytes do
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()


@dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor of a version: what a reader needs to read and check it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    digest: str

    def to_dict(self) -> dict[str, Any]:
        return {"dtype": self.dtype, "shape": list(self.shape), "digest": self.digest}

    @classmethod
    def from_dict(cls, name: str, d: Any) -> TensorEntry:
        if not isinstance(d, dict):
            raise ManifestError(f"entry for {name!r} is not an object")
        try:
            shape = tuple(int(x) for x in d["shape"])
            dtype = str(d["dtype"])
            dig = str(d["digest"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"entry for {name!r} is malformed: {exc}") from None
        return cls(name, dtype, shape, dig)

    @classmethod
    def of(cls, name: str, array: np.ndarray) -> TensorEntry:
        return cls(name, array.dtype.name, tuple(array.shape), digest(array))


@dataclass(frozen=True, slots=True)
class Manifest:
    """A committed version: its number and every tensor in it."""

    prefix: str
    version: int
    tensors: Mapping[str, TensorEntry]
    committed_at: float = 0.0
    parts: int = 1
    keep: int = DEFAULT_KEEP
    extra: Mapping[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        doc = {
            "format": MANIFEST_FORMAT,
            "prefix": self.prefix,
            "version": self.version,
            "committed_at": self.committed_at,
            "parts": self.parts,
            "keep": self.keep,
            "tensors": {n: e.to_dict() for n, e in sorted(self.tensors.items())},
            "extra": dict(self.extra),
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes | bytearray | memoryview, prefix: str, version: int) -> Manifest:
        """The manifest in ``raw``; ManifestError if it is not one (zeros: not yet
        committed), or is one for another model or version."""
        data = bytes(raw)
        if not data.strip(b"\0"):
            raise ManifestError(f"version {version} of {prefix!r} is not committed")
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"manifest of {prefix!r} version {version}: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT:
            raise ManifestError(
                f"manifest of {prefix!r} version {version} is not {MANIFEST_FORMAT}"
            )
        if doc.get("prefix") != prefix or doc.get("version") != version:
            raise ManifestError(
                f"manifest stored as {prefix!r} version {version} says "
                f"{doc.get('prefix')!r} version {doc.get('version')}"
            )
        tensors = doc.get("tensors")
        if not isinstance(tensors, dict):
            raise ManifestError(f"manifest of {prefix!r} version {version} lists no tensors")
        entries = {n: TensorEntry.from_dict(n, d) for n, d in tensors.items()}
        extra = doc.get("extra") or {}
        return cls(
            prefix,
            version,
            entries,
            float(doc.get("committed_at", 0.0)),
            int(doc.get("parts", 1)),
            int(doc.get("keep", DEFAULT_KEEP)),
            extra if isinstance(extra, dict) else {},
        )


@dataclass(frozen=True, slots=True)
class Part:
    """What one of several writers of a version wrote (its tensors), until a commit."""

    tensors: Mapping[str, TensorEntry]

    def encode(self) -> bytes:
        doc = {n: e.to_dict() for n, e in sorted(self.tensors.items())}
        return json.dumps({"format": MANIFEST_FORMAT, "part": doc}).encode()

    @classmethod
    def decode(cls, raw: bytes | bytearray | memoryview) -> Part:
        data = bytes(raw)
        try:
            doc = json.loads(data)
            if doc.get("format") != MANIFEST_FORMAT or not isinstance(doc.get("part"), dict):
                raise ValueError("not a part")
        except (ValueError, UnicodeDecodeError, AttributeError) as exc:
            raise ManifestError(f"a version's part is malformed: {exc}") from None
        return cls({n: TensorEntry.from_dict(n, d) for n, d in doc["part"].items()})


def byte_runs(
    shape: Sequence[int], itemsize: int, index: Sequence[slice]
) -> Iterator[tuple[int, int]]:
    """The (byte offset, byte length) runs of a C-ordered tensor that the basic
    slice ``index`` (one ``slice`` of step 1 per leading dimension; the rest
    whole) selects, in order, adjacent runs merged."""
    shape = tuple(shape)
    if len(index) > len(shape):
        raise ValueError(f"{len(index)} slices for a tensor of {len(shape)} dimensions")
    bounds = []
    for dim, s in zip(shape, index, strict=False):
        if not isinstance(s, slice):
            raise TypeError(f"a reader's layout is slices, not {s!r}")
        start, stop, step = s.indices(dim)
        if step != 1:
            raise ValueError(f"slice {s} has a step; a layout's slices are contiguous")
        bounds.append((start, max(start, stop)))
    bounds += [(0, d) for d in shape[len(bounds) :]]
    # Strides in bytes of a C-ordered tensor.
    strides = [itemsize] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    if not shape:
        yield 0, itemsize
        return
    if any(b == a for a, b in bounds):
        return
    # The innermost dimensions taken whole make one run with the last cut one.
    inner = len(shape) - 1
    while inner > 0 and bounds[inner] == (0, shape[inner]):
        inner -= 1
    run = (bounds[inner][1] - bounds[inner][0]) * strides[inner]
    outer = [range(a, b) for a, b in bounds[:inner]]
    pending: tuple[int, int] | None = None
    for idx in np.ndindex(*(len(r) for r in outer)) if outer else [()]:
        off = bounds[inner][0] * strides[inner]
        for k, i in enumerate(idx):
            off += outer[k][i] * strides[k]
        if pending is not None and pending[0] + pending[1] == off:
            pending = (pending[0], pending[1] + run)
            continue
        if pending is not None:
            yield pending
        pending = (off, run)
    if pending is not None:
        yield pending


def slice_shape(shape: Sequence[int], index: Sequence[slice]) -> tuple[int, ...]:
    """The shape of ``tensor[index]`` for a layout's slices."""
    out = []
    for k, dim in enumerate(shape):
        if k < len(index):
            start, stop, _ = index[k].indices(dim)
            out.append(max(0, stop - start))
        else:
            out.append(dim)
    return tuple(out)
