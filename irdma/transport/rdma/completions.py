"""Work completions of one completion queue, waited for under trio."""

from __future__ import annotations

import os
from typing import Any

import trio

from ..base import StreamBroken, StreamClosed
from ..verbs import WC_REMOTE_ACCESS_ERROR, WC_STATUS
from ..verbs_compat import comp_channel_fd

POLL_BATCH = 32
# Adaptive polling (where pyverbs does not expose the completion channel's
# fd): spin this long after the last completion, then sleep, doubling.
SPIN_SECONDS = 50e-6
SLEEP_MIN = 200e-6
SLEEP_MAX = 2e-3


class Completions:
    """Work completions of one completion queue, waited for under trio.

    Each signalled work request gets an event; a task drains the queue and
    sets them. Any failed completion fails them all: the queue pair is in the
    error state from then on.
    """

    def __init__(self, cq: Any, channel: Any, peer: str) -> None:
        self.cq = cq
        self.channel = channel
        self.fd = comp_channel_fd(channel)
        self.peer = peer
        self._waiters: dict[int, trio.Event] = {}
        self._next_id = 1
        self._posted = trio.Event()
        self.failure: Exception | None = None
        # Set when the queue is destroyed: nothing may poll it after that.
        self.closed = False

    def expect(self) -> tuple[int, trio.Event]:
        """A fresh work request id and the event set when it completes."""
        wr_id = self._next_id
        self._next_id += 1
        event = trio.Event()
        self._waiters[wr_id] = event
        self._posted.set()
        return wr_id, event

    def forget(self, wr_id: int) -> None:
        self._waiters.pop(wr_id, None)

    def fail(self, exc: Exception) -> None:
        if self.failure is None:
            self.failure = exc
        for event in self._waiters.values():
            event.set()
        self._waiters.clear()
        self._posted.set()

    def close(self) -> None:
        """The queue is being destroyed: fail every waiter, and never poll it again."""
        self.closed = True
        self.fail(StreamClosed(f"RDMA resources for {self.peer} closed"))
        if self.fd is not None:
            trio.lowlevel.notify_closing(self.fd)

    def _drain(self) -> int:
        if self.closed:
            raise StreamClosed(f"RDMA resources for {self.peer} closed")
        n, wcs = self.cq.poll(POLL_BATCH)
        for wc in wcs:
            if wc.status != 0:
                status = int(wc.status)
                reason = WC_STATUS.get(status, f"status {status}")
                if status == WC_REMOTE_ACCESS_ERROR:
                    reason += " (the daemon refused the key or address)"
                raise StreamBroken(f"RDMA transfer with {self.peer} failed: {reason}")
            event = self._waiters.pop(int(wc.wr_id), None)
            if event is not None:
                event.set()
        return n

    async def run(self) -> None:
        try:
            if self.fd is not None:
                await self._run_channel(self.fd)
            else:
                await self._run_polling()
        except Exception as exc:
            self.fail(exc)
            raise

    async def _run_polling(self) -> None:
        """Poll while work is outstanding: spin briefly, then back off to short sleeps."""
        while True:
            if not self._waiters:
                self._posted = trio.Event()
                await self._posted.wait()
                continue
            if self._drain():
                await trio.lowlevel.checkpoint()
                continue
            idle_since = trio.current_time()
            delay = SLEEP_MIN
            while self._waiters and not self._drain():
                if trio.current_time() - idle_since < SPIN_SECONDS:
                    await trio.sleep(0)
                else:
                    await trio.sleep(delay)
                    delay = min(2 * delay, SLEEP_MAX)

    async def _run_channel(self, fd: int) -> None:
        """Sleep on the completion channel's fd (rdma-core >= 57); drain on every event."""
        os.set_blocking(fd, False)
        self.cq.req_notify()
        while True:
            self._drain()
            await trio.lowlevel.wait_readable(fd)
            try:
                self.channel.get_cq_event(self.cq)
            except Exception:  # EAGAIN: woken without an event
                continue
            self.cq.ack_events(1)
            # Re-arm before draining, so a completion arriving in between still wakes us.
            self.cq.req_notify()
