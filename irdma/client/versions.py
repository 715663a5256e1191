"""Model versions: the tensors under a prefix committed together as numbered versions.

``ModelVersions(client, "policy")`` is a model. A writer commits a state dict
as the next version (``commit``), or several writers each write their part of
one (``draft`` / ``join``, ``Draft.finish``, ``Draft.commit(parts=n)``); a
reader reads the latest version, a given one, or the newest at least v, whole
or in its own slices of each tensor, and checks every whole tensor against
the digest the commit recorded.

What makes a version all or nothing, with numbers that only go up, is the
layout in ``irdma.client.manifests``: a version's tensors are immutable and
live under their own names, and it exists for readers only once its
manifest holds the list of them. The number is claimed first by an
exclusive create, which the daemons holding the manifest's name decide, so
two writers never commit the same number; manifests are tensors like any
other, so they are replicated, survive a primary's failover, and are in the
daemons' snapshots across a restart of the whole cluster. With ``[etcd]`` the
numbers are also claimed and recorded there (``irdma.cluster.version_numbers``):
etcd decides a claim when a partition splits the writers, and its record of
the newest commit outlives the daemons' memory.

The last ``keep`` versions are kept (the newest committer prunes older
ones); an older one stays while a reader holds a pin on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import numpy as np

from ..cluster import ClusterConfig
from ..cluster.etcd import Etcd, EtcdError
from ..cluster.version_numbers import VersionNumbers
from ..devices import Transfers
from ..errors import (
    DaemonError,
    DaemonUnavailable,
    DigestMismatch,
    TensorExists,
    TensorNotFound,
    VersionGone,
    VersionNotFound,
    VersionsWentBack,
)
from ..protocol import TensorMeta, deltas
from ..protocol.messages import Diff
from ..transport.base import Buffer
from .arrays import as_stored_array, byte_view
from .lookup import TensorInfo
from .manifests import (
    DEFAULT_KEEP,
    Manifest,
    ManifestError,
    Part,
    TensorEntry,
    byte_runs,
    check_prefix,
    check_tensor_name,
    check_version,
    digest,
    manifest_name,
    manifests_dir,
    part_name,
    parts_dir,
    pin_name,
    pins_dir,
    slice_shape,
    stored_name,
    version_dir,
    version_of_manifest,
)
from .session import Session


class Tensors(Protocol):
    """What a model needs of a client: ``AsyncClient`` (this module does not import
    it: the client offers models, ``AsyncClient.model``)."""

    session: Session
    transfers: Transfers

    @property
    def config(self) -> ClusterConfig: ...

    async def create(
        self, name: str, shape: Sequence[int] | int, dtype: Any = ..., *, exist_ok: bool = ...
    ) -> TensorInfo: ...

    async def stat(self, name: str) -> TensorInfo: ...

    async def meta(self, name: str) -> TensorMeta: ...

    async def list(self, prefix: str = "") -> list[TensorInfo]: ...

    async def delete(self, name: str) -> None: ...

    async def read(self, name: str, out: np.ndarray | None = None) -> np.ndarray: ...

    async def read_bytes(
        self, name: str, offset: int, size: int, out: Buffer | None = None
    ) -> memoryview: ...

    async def write(self, name: str, array: Any, *, replace: bool = False) -> None: ...

    async def write_bytes(self, name: str, offset: int, data: Buffer) -> None: ...


# How long a pin keeps a version from being pruned unless renewed.
PIN_SECONDS = 600.0
# Claims of a number tried before giving up (each lost one means another
# writer took that number meanwhile).
CLAIM_TRIES = 64
# How long a committer waits for the other writers' parts of its version.
PARTS_PATIENCE = 120.0
# A claimed version not committed after this long is taken for abandoned (its
# writer died) and pruned once a newer version is committed.
ABANDONED_SECONDS = 600.0
# How long reads leave etcd alone after it did not answer them.
ETCD_QUIET_SECONDS = 10.0
# Pause between looks for what another process has not done yet.
POLL_SECONDS = 0.02
# A draft's record of a tensor its writers write in blocks: its digest is taken
# from the whole tensor at the commit.
SLICED = ""
# Byte runs of a sliced read or write in flight at once.
RUNS_IN_FLIGHT = 64


log = logging.getLogger("irdma.client")


def _unique_id() -> str:
    """An id for a pin or a part: host, process and 64 bits from the OS (never the
    process-wide ``random``, which users seed alike in every rank)."""
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(8).hex()}"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One version as read: its number, the arrays, and what was checked."""

    version: int
    arrays: dict[str, np.ndarray]
    manifest: Manifest
    # Bytes of tensor data read from the daemons (a slice reads only its own).
    bytes_read: int
    # Tensors read whole and checked against their digest (slices are not).
    checked: frozenset[str] = field(default_factory=frozenset)


class Pin:
    """Keeps one version from being pruned until released or run out."""

    def __init__(self, model: ModelVersions, version: int, name: str, expires: float) -> None:
        self.model = model
        self.version = version
        self.name = name
        self.expires = expires

    async def renew(self, seconds: float = PIN_SECONDS) -> None:
        self.expires = time.time() + seconds
        await self.model.client.write(self.name, np.array([self.expires], dtype=np.float64))

    async def release(self) -> None:
        with contextlib.suppress(TensorNotFound):
            await self.model.client.delete(self.name)


class Draft:
    """A version being written: claimed (its number is taken), not yet visible.

    Every writer of the version writes its tensors through its own draft; one
    of them commits, once the others have finished (``finish``)."""

    def __init__(self, model: ModelVersions, version: int) -> None:
        self.model = model
        self.version = version
        self.tensors: dict[str, TensorEntry] = {}
        self._part = _unique_id()

    async def write(self, name: str, array: Any) -> TensorEntry:
        """Store ``array`` as tensor ``name`` of this version."""
        check_tensor_name(name)
        client = self.model.client
        arr = as_stored_array(client.transfers.source(array))
        entry = TensorEntry.of(name, arr)
        await client.write(stored_name(self.model.prefix, self.version, name), arr)
        self.tensors[name] = entry
        return entry

    async def write_slice(
        self, name: str, index: Sequence[slice], array: Any, *, shape: Sequence[int]
    ) -> None:
        """Store ``array`` as block ``index`` of tensor ``name`` of this version, whose
        whole shape is ``shape`` (a tensor-parallel rank's part: one step-1 slice
        per leading dimension). Every writer of the tensor gives the same shape and
        dtype (DtypeMismatch, ShapeMismatch otherwise); the blocks should not
        overlap, and bytes no block covers are zeros. The commit reads the whole
        tensor once to record its digest."""
        check_tensor_name(name)
        client = self.model.client
        arr = as_stored_array(client.transfers.source(array))
        shape = tuple(shape)
        want = slice_shape(shape, index)
        if arr.shape != want:
            raise ValueError(f"block {index} of a {shape} tensor is {want}, the array {arr.shape}")
        stored = stored_name(self.model.prefix, self.version, name)
        await client.create(stored, shape, arr.dtype, exist_ok=True)
        data = byte_view(arr)
        calls = []
        at = 0
        for offset, size in byte_runs(shape, arr.itemsize, index):
            calls.append(partial(client.write_bytes, stored, offset, data[at : at + size]))
            at += size
        for i in range(0, len(calls), RUNS_IN_FLIGHT):
            await client.session.gather(calls[i : i + RUNS_IN_FLIGHT])
        self.tensors[name] = TensorEntry(name, arr.dtype.name, shape, SLICED)

    async def write_many(self, arrays: Mapping[str, Any]) -> None:
        """Store every array of ``arrays`` (a state dict), the writes in flight together."""
        calls = [partial(self.write, n, a) for n, a in arrays.items()]
        await self.model.client.session.gather(calls)

    async def finish(self) -> None:
        """Record what this writer wrote, for the one who commits (a writer that
        does not commit calls this once its writes are done)."""
        raw = np.frombuffer(Part(self.tensors).encode(), dtype=np.uint8)
        await self.model.client.write(part_name(self.model.prefix, self.version, self._part), raw)

    async def commit(
        self,
        *,
        parts: int = 1,
        extra: Mapping[str, Any] | None = None,
        patience: float = PARTS_PATIENCE,
    ) -> int:
        """Make the version visible to readers, all at once; return its number.

        ``parts``: how many writers write this version, this one included; the
        commit waits up to ``patience`` seconds for the others to ``finish``.
        Raises VersionGone if the version was pruned meanwhile (a writer slower
        than ``keep`` newer commits), ValueError if two writers wrote the same
        tensor, TimeoutError if the other parts did not come.
        """
        model = self.model
        tensors = dict(self.tensors)
        if parts > 1:
            tensors = await self._gather_parts(parts, tensors, patience)
        sliced = [n for n, e in tensors.items() if e.digest == SLICED]
        found = await model.client.session.gather(partial(self._whole_digest, n) for n in sliced)
        for name, dig in zip(sliced, found, strict=True):
            tensors[name] = dataclasses.replace(tensors[name], digest=dig)
        manifest = Manifest(
            model.prefix,
            self.version,
            tensors,
            committed_at=time.time(),
            parts=parts,
            keep=model.keep,
            extra=dict(extra or {}),
        )
        raw = np.frombuffer(manifest.encode(), dtype=np.uint8)
        name = manifest_name(model.prefix, self.version)
        gone = VersionGone(
            f"version {self.version} of {model.prefix!r} was pruned before it was "
            f"committed (its writer took over {ABANDONED_SECONDS:g} s, and newer "
            "versions were committed meanwhile)"
        )
        try:
            await model.client.stat(name)
        except TensorNotFound:
            raise gone from None
        # The claim is an empty tensor: redefined to the manifest's size, then
        # written whole (a reader meanwhile finds zeros: not committed).
        await model.client.write(name, raw, replace=True)
        # A prune may have taken the claim and its tensors between the look and
        # the write: then the manifest names tensors that are gone; take it back.
        held = {
            i.name for i in await model.client.list(version_dir(model.prefix, self.version) + "/")
        }
        if any(stored_name(model.prefix, self.version, n) not in held for n in tensors):
            with contextlib.suppress(TensorNotFound):
                await model.client.delete(name)
            raise gone
        model.saw(self.version)
        await model.record_commit(self.version)
        if parts > 1:
            await model.delete_prefix(parts_dir(model.prefix, self.version))
        await model.prune()
        return self.version

    async def _whole_digest(self, name: str) -> str:
        """The digest of a tensor its writers wrote in blocks, read back whole."""
        stored = stored_name(self.model.prefix, self.version, name)
        return digest(await self.model.client.read(stored))

    async def _gather_parts(
        self, parts: int, own: dict[str, TensorEntry], patience: float
    ) -> dict[str, TensorEntry]:
        model = self.model
        session = model.client.session
        deadline = session.now() + patience
        folder = parts_dir(model.prefix, self.version)
        while True:
            infos = await model.client.list(folder)
            others = [i for i in infos if not i.name.endswith("/" + self._part)]
            found = await session.gather(partial(self._part_of, i.name) for i in others)
            done = [p for p in found if p is not None]
            if len(done) + 1 >= parts:
                break
            if session.now() > deadline:
                raise TimeoutError(
                    f"version {self.version} of {model.prefix!r}: {len(done) + 1} of "
                    f"{parts} writers finished within {patience:g} s"
                )
            await session.sleep(POLL_SECONDS)
        merged = dict(own)
        for part in done:
            for name, entry in part.tensors.items():
                held = merged.get(name)
                if held is not None and held.digest == entry.digest == SLICED:
                    if (held.dtype, held.shape) != (entry.dtype, entry.shape):
                        raise ValueError(
                            f"version {self.version} of {model.prefix!r}: blocks of tensor "
                            f"{name!r} written as {held.dtype} {held.shape} and "
                            f"{entry.dtype} {entry.shape}"
                        )
                    continue  # blocks of one tensor by several writers
                if held is not None:
                    raise ValueError(
                        f"version {self.version} of {model.prefix!r}: tensor {name!r} "
                        "written by two writers"
                    )
                merged[name] = entry
        return merged

    async def _part_of(self, name: str) -> Part | None:
        """Another writer's part, None while it is still being written (created,
        not yet filled) or gone."""
        try:
            raw = await self.model.client.read(name)
        except TensorNotFound:
            return None
        try:
            return Part.decode(raw.tobytes())
        except ManifestError:
            return None


class ModelVersions:
    """The committed versions of the model under ``prefix`` (``irdma.client.manifests``
    for how they are stored); ``keep``: how many the writers keep."""

    def __init__(self, client: Tensors, prefix: str, *, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"a model keeps at least one version, not {keep}")
        self.client = client
        self.prefix = check_prefix(prefix)
        self.keep = keep
        # The newest version this object has seen committed: what the daemons
        # show may never go below it.
        self.floor = 0
        self._numbers: VersionNumbers | None = None
        # Until when reads do not ask etcd, which did not answer (session clock).
        self._etcd_quiet_until = float("-inf")

    @property
    def numbers(self) -> VersionNumbers | None:
        """The model's numbers in etcd (None: the cluster keeps no membership there),
        reached as the client's shell reaches daemons (trio, or plain sockets)."""
        settings = self.client.config.etcd
        if self._numbers is None and settings is not None:
            shell = self.client.session.shell
            post = shell.http_post if shell is not None else None
            etcd = Etcd(settings.endpoints, self.client.config.timeout, post=post)
            self._numbers = VersionNumbers(etcd, settings.prefix)
        return self._numbers

    @numbers.setter
    def numbers(self, numbers: VersionNumbers) -> None:
        self._numbers = numbers

    def saw(self, version: int) -> None:
        self.floor = max(self.floor, version)

    # -- what is committed --------------------------------------------------

    async def _claims(self) -> list[tuple[int, TensorInfo]]:
        """(version, its manifest's tensor) of every claimed version, ascending; one of
        0 bytes is claimed, not committed."""
        infos = await self.client.list(manifests_dir(self.prefix))
        found = ((version_of_manifest(self.prefix, i.name), i) for i in infos)
        return sorted(((v, i) for v, i in found if v), key=lambda p: p[0])

    async def _manifest(self, version: int) -> Manifest | None:
        """Version ``version``'s manifest, or None if it is not committed."""
        try:
            raw = await self.client.read(manifest_name(self.prefix, version))
        except TensorNotFound:
            return None
        try:
            return Manifest.decode(raw.tobytes(), self.prefix, version)
        except ManifestError:
            return None

    async def versions(self) -> list[int]:
        """The committed versions kept, ascending."""
        sized = [v for v, i in await self._claims() if i.nbytes]
        manifests = await self.client.session.gather(partial(self._manifest, v) for v in sized)
        found = [m.version for m in manifests if m is not None]
        if found:
            self.saw(found[-1])
        return found

    async def latest_manifest(self) -> Manifest:
        """The newest committed version's manifest; VersionNotFound if there is none,
        VersionsWentBack if it is older than one this object saw or etcd recorded."""
        # etcd first: what it records was on the daemons before, so a commit
        # between the two looks cannot make the daemons seem behind it.
        recorded = await self._recorded()
        floor = max(self.floor, recorded)
        for v, info in reversed(await self._claims()):
            if not info.nbytes:
                continue
            m = await self._manifest(v)
            if m is not None:
                if v < floor:
                    break
                self.saw(v)
                return m
        if floor:
            where = "etcd recorded" if recorded >= self.floor else "seen"
            raise VersionsWentBack(
                f"the newest version of {self.prefix!r} the daemons show is below "
                f"version {floor}, {where} committed: its manifest is unreachable (its "
                "daemons down, or the cluster restarted without it)"
            )
        raise VersionNotFound(f"model {self.prefix!r} has no committed version")

    async def _recorded(self) -> int:
        """The newest commit etcd recorded (0 without etcd, or when it does not
        answer: reads then go on with the daemons' view, as without etcd, and do
        not ask etcd again for ``ETCD_QUIET_SECONDS``, so an etcd that is down
        costs one timeout, not one per read)."""
        session = self.client.session
        if self.numbers is None or session.now() < self._etcd_quiet_until:
            return 0
        try:
            return await self.numbers.committed(self.prefix)
        except EtcdError as exc:
            self._etcd_quiet_until = session.now() + ETCD_QUIET_SECONDS
            log.warning(
                "model %r: etcd's record of versions not read (not asked again for %g s): %s",
                self.prefix,
                ETCD_QUIET_SECONDS,
                exc,
            )
            return 0

    async def latest(self) -> int:
        """The newest committed version's number (see ``latest_manifest``)."""
        return (await self.latest_manifest()).version

    async def manifest(self, version: int) -> Manifest:
        """Version ``version``'s manifest: VersionGone if it was pruned,
        VersionNotFound if it is not committed (yet)."""
        check_version(version)
        m = await self._manifest(version)
        if m is not None:
            return m
        claims = await self._claims()
        if claims and version < claims[0][0]:
            raise VersionGone(
                f"version {version} of {self.prefix!r} was pruned; the oldest kept is "
                f"{claims[0][0]} (a model keeps its last {self.keep}, and those pinned)"
            )
        raise VersionNotFound(f"version {version} of {self.prefix!r} is not committed")

    # -- writing --------------------------------------------------------------

    async def draft(self) -> Draft:
        """Claim the next version number for writing (other writers ``join`` it)."""
        for _ in range(CLAIM_TRIES):
            claims = await self._claims()
            shown = max([v for v, _ in claims] + [self.floor])
            # With etcd, etcd decides the number (a writer that reaches other copies
            # of the manifest's name than another's still gets another number).
            version = (
                shown + 1 if self.numbers is None else await self.numbers.claim(self.prefix, shown)
            )
            try:
                await self.client.create(manifest_name(self.prefix, version), (0,), np.uint8)
            except TensorExists:
                continue  # another writer claimed it first
            return Draft(self, version)
        raise TensorExists(
            f"could not claim a version of {self.prefix!r} in {CLAIM_TRIES} tries "
            "(other writers kept taking the next number)"
        )

    async def record_commit(self, version: int) -> None:
        """Raise etcd's record of the newest commit to ``version``. The version is
        committed already (readers see it); if etcd does not answer, the next
        commit's record covers it, and until then only the daemons keep it."""
        if self.numbers is None:
            return
        try:
            await self.numbers.record_commit(self.prefix, version)
        except EtcdError as exc:
            log.warning(
                "model %r: version %d committed, not recorded in etcd: %s",
                self.prefix,
                version,
                exc,
            )

    def join(self, version: int) -> Draft:
        """Another writer's draft of ``version`` (claimed by ``draft``): this process
        writes its part there, then calls ``finish``."""
        return Draft(self, check_version(version))

    async def commit(
        self, arrays: Mapping[str, Any], *, extra: Mapping[str, Any] | None = None
    ) -> int:
        """Store ``arrays`` (a state dict) as the next version, visible all at once;
        return its number."""
        draft = await self.draft()
        await draft.write_many(arrays)
        return await draft.commit(extra=extra)

    # -- reading ----------------------------------------------------------------

    async def pick(self, version: int | None = None, at_least: int | None = None) -> Manifest:
        """The manifest a read takes: ``version``'s, else the latest (VersionNotFound
        if it is below ``at_least``)."""
        if version is not None:
            if at_least is not None:
                raise ValueError("give a version or at_least, not both")
            return await self.manifest(version)
        m = await self.latest_manifest()
        if at_least is not None and m.version < at_least:
            raise VersionNotFound(
                f"the newest version of {self.prefix!r} is {m.version}, below {at_least}"
            )
        return m

    async def read(
        self,
        version: int | None = None,
        *,
        at_least: int | None = None,
        names: Sequence[str] | None = None,
        out: Mapping[str, np.ndarray] | None = None,
        slices: Mapping[str, Sequence[slice]] | None = None,
        check: bool = True,
    ) -> Snapshot:
        """Read one version: ``version``, or the latest (at least ``at_least``).

        ``names``: only these tensors (all by default). ``out``: arrays to read
        into (the tensor's shape, or its slice's). ``slices``: the reader's
        part of a tensor (one slice per leading dimension, step 1); only its
        bytes move. ``check``: compare each tensor read whole with the digest
        of the commit (DigestMismatch). A version pruned while it is read
        raises VersionGone when asked for by number, and is read again at the
        newest version otherwise.
        """
        while True:
            manifest = await self.pick(version, at_least)
            try:
                return await self._read(manifest, names, out or {}, slices or {}, check)
            except TensorNotFound:
                if await self._manifest(manifest.version) is not None:
                    raise  # not pruned: a tensor of a committed version went missing
                if version is not None:
                    raise VersionGone(
                        f"version {version} of {self.prefix!r} was pruned while it was read"
                    ) from None

    async def _read(
        self,
        manifest: Manifest,
        names: Sequence[str] | None,
        out: Mapping[str, np.ndarray],
        slices: Mapping[str, Sequence[slice]],
        check: bool,
    ) -> Snapshot:
        wanted = list(manifest.tensors) if names is None else list(names)
        for name in [*wanted, *out, *slices]:
            if name not in manifest.tensors:
                raise VersionNotFound(
                    f"tensor {name!r} is not in version {manifest.version} of {self.prefix!r}"
                )
        arrays: dict[str, np.ndarray] = {}
        counted = [0]
        checked: set[str] = set()

        async def read_one(name: str) -> None:
            entry = manifest.tensors[name]
            stored = stored_name(self.prefix, manifest.version, name)
            dt = np.dtype(entry.dtype).newbyteorder("<")
            index = slices.get(name)
            if index is None:
                arr = await self.client.read(stored, out.get(name))
                counted[0] += arr.nbytes
                if check:
                    if digest(arr) != entry.digest:
                        raise DigestMismatch(
                            f"tensor {name!r} of version {manifest.version} of "
                            f"{self.prefix!r} does not match its digest"
                        )
                    checked.add(name)
            else:
                shape = slice_shape(entry.shape, index)
                given = out.get(name)
                if given is None:
                    arr = np.empty(shape, dtype=dt)
                elif given.shape != shape or given.dtype != dt or not given.flags.c_contiguous:
                    raise ValueError(
                        f"out for {name!r} must be C-contiguous {dt} of shape {shape}, "
                        f"not {given.dtype} {given.shape}"
                    )
                else:
                    arr = given
                counted[0] += await self._read_runs(stored, entry, index, byte_view(arr))
            arrays[name] = arr

        await self.client.session.gather(partial(read_one, n) for n in wanted)
        return Snapshot(manifest.version, arrays, manifest, counted[0], frozenset(checked))

    async def _read_runs(
        self, stored: str, entry: TensorEntry, index: Sequence[slice], into: memoryview
    ) -> int:
        """Read the runs of bytes ``index`` selects into ``into``, in order."""
        itemsize = np.dtype(entry.dtype).itemsize
        runs = list(byte_runs(entry.shape, itemsize, index))
        at = 0
        calls = []
        for offset, size in runs:
            calls.append(
                partial(self.client.read_bytes, stored, offset, size, into[at : at + size])
            )
            at += size
        for i in range(0, len(calls), RUNS_IN_FLIGHT):
            await self.client.session.gather(calls[i : i + RUNS_IN_FLIGHT])
        return at

    async def pull(
        self,
        have: Snapshot,
        version: int | None = None,
        *,
        at_least: int | None = None,
        slices: Mapping[str, Sequence[slice]] | None = None,
        check: bool = True,
    ) -> Snapshot:
        """Bring ``have`` (a snapshot this reader holds, its arrays as read) to
        ``version``, or the latest (at least ``at_least``), in place: only the
        elements that changed move (DIFF, ``irdma.protocol.deltas``), and a
        tensor whose digest did not change moves nothing. ``slices`` must be
        those ``have`` was read with. Where the daemons no longer hold
        ``have``'s version (pruned), the tensor is read whole. ``check``
        compares each whole tensor with its digest afterwards (an array the
        caller changed since it was read is caught there).
        """
        slices = slices or {}
        target = await self.pick(version, at_least)
        base = have.manifest
        moved = [0]
        checked: set[str] = set()
        calls = []
        for name in have.arrays:
            entry = target.tensors.get(name)
            if entry is None:
                raise VersionNotFound(
                    f"tensor {name!r} is not in version {target.version} of {self.prefix!r}"
                )
            old = base.tensors.get(name)
            arr = have.arrays[name]
            if old is None or (old.dtype, old.shape) != (entry.dtype, entry.shape):
                calls.append(partial(self._read_into, target, name, arr, slices.get(name), moved))
            elif old.digest != entry.digest:
                calls.append(
                    partial(self._diff_into, base, target, name, arr, slices.get(name), moved)
                )
        await self.client.session.gather(calls)
        if check:
            for name, arr in have.arrays.items():
                if name in slices:
                    continue
                if digest(arr) != target.tensors[name].digest:
                    raise DigestMismatch(
                        f"tensor {name!r} pulled to version {target.version} of "
                        f"{self.prefix!r} does not match its digest (was the array "
                        "changed since it was read?)"
                    )
                checked.add(name)
        return Snapshot(target.version, have.arrays, target, moved[0], frozenset(checked))

    async def _read_into(
        self,
        target: Manifest,
        name: str,
        arr: np.ndarray,
        index: Sequence[slice] | None,
        moved: list[int],
    ) -> None:
        """A tensor read whole (or its slice) into the reader's array (its layout
        changed between the versions)."""
        snap = await self._read(
            target, [name], {}, {name: index} if index is not None else {}, False
        )
        got = snap.arrays[name]
        if got.shape != arr.shape or got.dtype != arr.dtype:
            raise ValueError(
                f"tensor {name!r} is {got.dtype} {got.shape} at version {target.version}, "
                f"the reader's array {arr.dtype} {arr.shape}: read it afresh"
            )
        arr[...] = got
        moved[0] += snap.bytes_read

    async def _diff_into(
        self,
        base: Manifest,
        target: Manifest,
        name: str,
        arr: np.ndarray,
        index: Sequence[slice] | None,
        moved: list[int],
    ) -> None:
        """The changes of one tensor from ``base`` to ``target``, applied to ``arr``."""
        entry = target.tensors[name]
        new = await self.client.meta(stored_name(self.prefix, target.version, name))
        try:
            old = await self.client.meta(stored_name(self.prefix, base.version, name))
        except TensorNotFound:
            old = None  # pruned: read whole
        itemsize = new.np_dtype.itemsize
        into = byte_view(arr)
        runs = [(0, new.nbytes)] if index is None else list(byte_runs(entry.shape, itemsize, index))
        pieces = []
        at = 0
        for offset, size in runs:
            # Cut at shard boundaries: a DIFF compares within one shard.
            while size:
                shard, inside = divmod(offset, new.shard_size)
                n = min(size, new.shard_size - inside)
                pieces.append((shard, inside, n, into[at : at + n]))
                offset, size, at = offset + n, size - n, at + n
        calls = [partial(self._diff_piece, new, old, *piece, moved) for piece in pieces]
        for i in range(0, len(calls), RUNS_IN_FLIGHT):
            await self.client.session.gather(calls[i : i + RUNS_IN_FLIGHT])

    async def _diff_piece(
        self,
        new: TensorMeta,
        old: TensorMeta | None,
        shard: int,
        offset: int,
        size: int,
        into: memoryview,
        moved: list[int],
    ) -> None:
        """One range of one shard: its changes from a DIFF, or its bytes whole where
        the older version is not on the daemons any more."""
        if old is not None:
            msg = Diff(new.key, shard, offset, size, old.key, new.layout)
            for node in self.client.config.replicas_for(new.key, shard):
                try:
                    reply = await self.client.session.request(node, msg.frame(), [])
                except DaemonUnavailable:
                    continue  # another replica compares as well
                except DaemonError:
                    # The older version pruned, a daemon catching up or of another
                    # epoch, one from before DIFF: the range is read whole instead
                    # (with the read path's own failover and rerouting).
                    break
                deltas.apply(reply.data, into, new.np_dtype.itemsize)
                moved[0] += len(reply.data)
                return
        start = shard * new.shard_size + offset
        await self.client.read_bytes(new.name, start, size, into)
        moved[0] += size

    # -- keeping ----------------------------------------------------------------

    async def pin(self, version: int, seconds: float = PIN_SECONDS) -> Pin:
        """Keep ``version`` from being pruned for ``seconds`` (``Pin.renew``,
        ``Pin.release``); VersionGone / VersionNotFound if it is not there."""
        check_version(version)
        expires = time.time() + seconds
        name = pin_name(self.prefix, version, _unique_id())
        await self.client.write(name, np.array([expires], dtype=np.float64))
        pin = Pin(self, version, name, expires)
        # The pin exists before the manifest is looked at: a pruner that deletes
        # the manifest after this look lists pins after it, and finds this one.
        try:
            await self.manifest(version)
        except BaseException:
            with self.client.session.shielded():
                await pin.release()
            raise
        return pin

    @contextlib.asynccontextmanager
    async def pinned(self, version: int, seconds: float = PIN_SECONDS) -> AsyncIterator[Pin]:
        """``pin`` for the duration of a ``with`` block."""
        pin = await self.pin(version, seconds)
        try:
            yield pin
        finally:
            with self.client.session.shielded():
                await pin.release()

    async def _pinned_versions(self) -> set[int]:
        """Versions with a pin not run out; pins run out are deleted on the way."""
        now = time.time()
        held: set[int] = set()
        head = pins_dir(self.prefix)
        for info in await self.client.list(head):
            try:
                version = int(info.name[len(head) :].split("/", 1)[0])
                expires = float((await self.client.read(info.name))[0])
            except (ValueError, IndexError, TensorNotFound):
                continue
            if expires > now:
                held.add(version)
            else:
                with contextlib.suppress(TensorNotFound):
                    await self.client.delete(info.name)
        return held

    async def delete_prefix(self, folder: str) -> None:
        """Delete every tensor under ``folder`` (gone already is fine)."""

        async def drop(name: str) -> None:
            with contextlib.suppress(TensorNotFound):
                await self.client.delete(name)

        infos = await self.client.list(folder)
        await self.client.session.gather(partial(drop, i.name) for i in infos)

    async def prune(self) -> list[int]:
        """Delete versions older than the last ``keep`` committed, unless pinned, and
        claims older than those whose writer has not committed for
        ``ABANDONED_SECONDS``; return the versions
        deleted. The manifest goes first (the version is then gone for readers),
        its tensors after, unless a pin appeared meanwhile."""
        claims = await self._claims()
        committed = [v for v, i in claims if i.nbytes]
        if len(committed) <= self.keep:
            return []
        oldest_kept = committed[-self.keep]
        pinned = await self._pinned_versions()
        abandoned = time.time() - ABANDONED_SECONDS
        doomed = [
            v
            for v, info in claims
            if v < oldest_kept and v not in pinned and (info.nbytes or info.ctime < abandoned)
        ]
        for version in doomed:
            with contextlib.suppress(TensorNotFound):
                await self.client.delete(manifest_name(self.prefix, version))
        if doomed:
            pinned = await self._pinned_versions()
        for version in doomed:
            if version not in pinned:
                await self.delete_prefix(version_dir(self.prefix, version) + "/")
                await self.delete_prefix(parts_dir(self.prefix, version))
        return doomed


class BlockingModelVersions:
    """``ModelVersions`` for the blocking ``Client``: the same calls, each run to its end."""

    def __init__(self, model: ModelVersions, call: Any) -> None:
        self.model = model
        self._call = call

    @property
    def prefix(self) -> str:
        return self.model.prefix

    def versions(self) -> list[int]:
        return self._call(self.model.versions)

    def latest(self) -> int:
        return self._call(self.model.latest)

    def manifest(self, version: int) -> Manifest:
        return self._call(self.model.manifest, version)

    def commit(self, arrays: Mapping[str, Any], **kwargs: Any) -> int:
        return self._call(self.model.commit, arrays, **kwargs)

    def draft(self) -> BlockingDraft:
        return BlockingDraft(self._call(self.model.draft), self._call)

    def join(self, version: int) -> BlockingDraft:
        return BlockingDraft(self.model.join(version), self._call)

    def read(self, version: int | None = None, **kwargs: Any) -> Snapshot:
        return self._call(self.model.read, version, **kwargs)

    def pull(self, have: Snapshot, version: int | None = None, **kwargs: Any) -> Snapshot:
        return self._call(self.model.pull, have, version, **kwargs)

    def pin(self, version: int, seconds: float = PIN_SECONDS) -> BlockingPin:
        return BlockingPin(self._call(self.model.pin, version, seconds), self._call)

    def prune(self) -> list[int]:
        return self._call(self.model.prune)


class BlockingDraft:
    """``Draft`` for the blocking ``Client``."""

    def __init__(self, draft: Draft, call: Any) -> None:
        self.draft = draft
        self._call = call

    @property
    def version(self) -> int:
        return self.draft.version

    def write(self, name: str, array: Any) -> TensorEntry:
        return self._call(self.draft.write, name, array)

    def write_many(self, arrays: Mapping[str, Any]) -> None:
        self._call(self.draft.write_many, arrays)

    def write_slice(
        self, name: str, index: Sequence[slice], array: Any, *, shape: Sequence[int]
    ) -> None:
        self._call(self.draft.write_slice, name, index, array, shape=shape)

    def finish(self) -> None:
        self._call(self.draft.finish)

    def commit(self, **kwargs: Any) -> int:
        return self._call(self.draft.commit, **kwargs)


class BlockingPin:
    """``Pin`` for the blocking ``Client``."""

    def __init__(self, pin: Pin, call: Any) -> None:
        self.pin = pin
        self._call = call

    @property
    def version(self) -> int:
        return self.pin.version

    def renew(self, seconds: float = PIN_SECONDS) -> None:
        self._call(self.pin.renew, seconds)

    def release(self) -> None:
        self._call(self.pin.release)

    def __enter__(self) -> BlockingPin:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()
