"""A client reading one tensor over and over in a thread, for tests where a writer
saves over it: each save is one value throughout, so a read mixing two shows."""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

from irdma import Client

MAX_READS = 10_000


class WholeReads:
    """Reads ``name`` until the ``with`` block ends: ``seen`` holds each read's
    first value, ``failures`` what went wrong (a read that raised, a mix)."""

    def __init__(self, config_path: Path, name: str) -> None:
        self.config_path = config_path
        self.name = name
        self.seen: list[float] = []
        self.failures: list[str] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._read_until_done)

    def _read_until_done(self) -> None:
        with Client(self.config_path) as reader:
            while not self._done.is_set() and len(self.seen) < MAX_READS:
                try:
                    got = reader.read(self.name)
                except Exception as exc:  # reported by the test, with the count
                    self.failures.append(f"read {len(self.seen)}: {type(exc).__name__}: {exc}")
                    return
                if not (got == got[0]).all():
                    self.failures.append(f"a mix of {sorted(set(got.tolist()))[:4]}")
                self.seen.append(float(got[0]))

    def __enter__(self) -> WholeReads:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._done.set()
        self._thread.join(60)
