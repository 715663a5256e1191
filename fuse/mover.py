"""Moving tensor bytes in a thread of their own, beside the FUSE loop.

After answering the kernel, the mount's largest cost is copying bytes out
of and into the daemons' memory (a streamed read, a background push). In the
FUSE loop's thread the two take turns; a Mover runs its own trio loop and
client in one thread for the mount's life, so those copies run on another
core while the loop answers the kernel (numpy's copies release the GIL).
Jobs go to the Mover's loop and their completion comes back through the two
loops' tokens; the caller awaits a job like any request.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

import trio

from irdma import AsyncClient, ClientClosed, ClusterConfig, SharedRegion


@dataclass(eq=False)
class _Job:
    method: str  # an AsyncClient method: read_range or write_bytes
    args: tuple
    done: trio.Event  # of the caller's loop
    error: Exception | None = None
    result: Any = None


@dataclass(eq=False)
class Mover:
    """A client in a thread of its own; ``run`` it in a nursery with ``nursery.start``."""

    config: ClusterConfig
    timeout: float | None = None
    shared: SharedRegion | None = None  # the mount's buffers: pushed from without a copy
    _main: trio.lowlevel.TrioToken | None = None
    _token: trio.lowlevel.TrioToken | None = None
    _send: trio.MemorySendChannel | None = None
    _stop: trio.CancelScope = field(default_factory=trio.CancelScope)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Start the thread; report started once it takes jobs; stop it when cancelled."""
        self._main = trio.lowlevel.current_trio_token()
        started = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                # Abandoned when cancelled: the thread is told to stop below, and
                # finishes its own loop (closing its connections) by itself.
                nursery.start_soon(self._in_thread, started)
                await started.wait()
                task_status.started()
                await trio.sleep_forever()
        finally:
            if self._token is not None:
                self._token.run_sync_soon(self._stop.cancel)

    async def _in_thread(self, started: trio.Event) -> None:
        await trio.to_thread.run_sync(trio.run, self._loop, started, abandon_on_cancel=True)

    async def _loop(self, started: trio.Event) -> None:
        assert self._main is not None
        send, jobs = trio.open_memory_channel[_Job](math.inf)
        with self._stop:
            async with AsyncClient(
                self.config, timeout=self.timeout, shared_memory=self.shared
            ) as client:
                self._send = send
                self._token = trio.lowlevel.current_trio_token()
                self._main.run_sync_soon(started.set)
                async with trio.open_nursery() as nursery:
                    async for job in jobs:
                        nursery.start_soon(self._do, client, job)

    async def _do(self, client: AsyncClient, job: _Job) -> None:
        assert self._main is not None
        try:
            job.result = await getattr(client, job.method)(*job.args)
        except Exception as exc:  # the caller raises it
            job.error = exc
        except BaseException:
            # Stopped (the mount is ending) before the job was done: the caller
            # must not take it as done (a push then goes whole by the caller).
            job.error = ClientClosed("the mount's mover stopped before the job was done")
            raise
        finally:
            with contextlib.suppress(trio.RunFinishedError):  # the mount is ending
                self._main.run_sync_soon(job.done.set)

    async def call(self, method: str, *args: Any) -> Any:
        """Run ``AsyncClient.<method>(*args)`` in the Mover's thread; raise what it raised.

        Buffers passed in must stay untouched until it returns (a cancelled
        caller leaves the job running: it keeps its buffers alive itself).
        """
        assert self._token is not None and self._send is not None
        job = _Job(method, args, trio.Event())
        self._token.run_sync_soon(self._send.send_nowait, job)
        await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result

    async def read_range(self, name: str, offset: int, out: Any, at: int = 0) -> int:
        return await self.call("read_range", name, offset, out, at)

    async def write_bytes(self, name: str, offset: int, data: Any) -> None:
        await self.call("write_bytes", name, offset, data)
