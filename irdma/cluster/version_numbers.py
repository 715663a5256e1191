"""Model version numbers kept in etcd, for clusters whose membership lives there.

Under the cluster's prefix, each model (``irdma.client.versions``) has two keys:

- ``models/<model>/claimed``: the highest version number a writer claimed. A
  claim is a compare-and-swap on the key's revision, so etcd (linearizable,
  a majority of its members) decides it: two writers never get one number,
  even when a partition lets each reach a different copy of the manifest's
  name, which the daemons alone cannot tell apart.
- ``models/<model>/committed``: the highest version whose manifest was
  written, raised after each commit and never lowered. Readers take it as
  the floor of what the daemons must show: a latest version older than it
  (its manifest lost with the daemons that held it, or a cluster restarted
  without its snapshots) is an error, never a silent step back.

Values are 16 decimal digits, as the manifests' names are. The model's own
prefix is the middle of the key and the last part says which number it is,
so any model prefix (with its own ``/`` parts) maps to its two keys and back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .config import EtcdSettings
from .etcd import Compare, Etcd, EtcdError, KeyValue, Put

CLAIMED = "claimed"
COMMITTED = "committed"
# Digits of a version number, in etcd and in a manifest's name (irdma.manifests):
# fixed width, so byte order is number order.
DIGITS = 16
# Compare-and-swap attempts before a claim gives up (each loses only to
# another writer's claim, which took a number).
CAS_TRIES = 64


class NumbersError(EtcdError):
    """etcd holds something under a model's keys that is not a version number."""


@dataclass(frozen=True, slots=True)
class ModelNumbers:
    """What etcd says of one model (0: nothing yet)."""

    model: str
    claimed: int
    committed: int


def encode(version: int) -> bytes:
    return b"%0*d" % (DIGITS, version)


def decode(kv: KeyValue | None) -> int:
    if kv is None:
        return 0
    text = kv.value.decode(errors="replace")
    if len(text) != DIGITS or not text.isdigit():
        raise NumbersError(f"etcd key {kv.key!r} holds {text!r}, not a version number")
    return int(text)


class VersionNumbers:
    """The models' version numbers under ``prefix`` in ``etcd``."""

    def __init__(self, etcd: Etcd, prefix: str) -> None:
        self.etcd = etcd
        self.models_prefix = prefix.rstrip("/").encode() + b"/models/"

    @classmethod
    def of(cls, settings: EtcdSettings, timeout: float) -> VersionNumbers:
        """The numbers of the cluster a config's ``[etcd]`` names."""
        return cls(Etcd(settings.endpoints, timeout=timeout), settings.prefix)

    def key(self, model: str, which: str) -> bytes:
        return self.models_prefix + model.encode() + b"/" + which.encode()

    async def committed(self, model: str) -> int:
        """The newest version of ``model`` a commit recorded (0: none)."""
        return decode(await self.etcd.get(self.key(model, COMMITTED)))

    async def claim(self, model: str, above: int) -> int:
        """A number of ``model`` no other writer gets: above ``above`` (what the
        daemons show) and above every earlier claim."""
        return await self._raise(self.key(model, CLAIMED), lambda held: max(held, above) + 1)

    async def record_commit(self, model: str, version: int) -> None:
        """Raise ``model``'s committed number to ``version`` (never lowered)."""
        await self._raise(self.key(model, COMMITTED), lambda held: max(held, version))

    async def _raise(self, key: bytes, new_value: Callable[[int], int]) -> int:
        """Set ``key`` to ``new_value(held)`` by compare-and-swap on the revision it
        was read at; the value set (or kept, when it would not change)."""
        for _ in range(CAS_TRIES):
            kv = await self.etcd.get(key)
            held = decode(kv)
            value = new_value(held)
            if kv is not None and value == held:
                return held
            same = (
                Compare(key, "CREATE", "EQUAL", 0)
                if kv is None
                else Compare(key, "MOD", "EQUAL", kv.mod_revision)
            )
            ok, _ = await self.etcd.txn([same], [Put(key, encode(value))])
            if ok:
                return value
        raise EtcdError(f"etcd key {key!r} kept changing under {CAS_TRIES} compare-and-swaps")

    async def models(self) -> list[ModelNumbers]:
        """Every model etcd holds numbers of, by name."""
        kvs, _ = await self.etcd.get_prefix(self.models_prefix)
        found: dict[str, dict[str, int]] = {}
        for kv in kvs:
            model, _, which = kv.key[len(self.models_prefix) :].decode().rpartition("/")
            if which in (CLAIMED, COMMITTED):
                found.setdefault(model, {})[which] = decode(kv)
        return [
            ModelNumbers(m, n.get(CLAIMED, 0), n.get(COMMITTED, 0))
            for m, n in sorted(found.items())
        ]
