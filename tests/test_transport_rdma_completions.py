"""The completion-queue task of an RDMA link (irdma/transport/rdma/completions.py),
over a scripted queue: what it does with a failed completion and a destroyed queue.

The real queue runs in tests/rdma, in a soft-RoCE guest; there a failed completion
cannot be made on purpose without breaking the guest's path for later tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from irdma.transport.base import StreamBroken, StreamClosed
from irdma.transport.rdma.completions import Completions
from irdma.transport.verbs import WC_REMOTE_ACCESS_ERROR


@dataclass
class ScriptedQueue:
    """A completion queue that returns the given work completions, one poll each."""

    polls: list[list[SimpleNamespace]]
    polled: int = 0

    def poll(self, n: int) -> tuple[int, list[SimpleNamespace]]:
        self.polled += 1
        wcs = self.polls.pop(0) if self.polls else []
        return len(wcs), wcs


def completion(wr_id: int, status: int = 0) -> SimpleNamespace:
    return SimpleNamespace(wr_id=wr_id, status=status)


async def test_a_failed_completion_fails_every_waiter() -> None:
    """The queue pair is in the error state after one failed completion: every chain
    still waiting is woken with the failure, which names the daemon's refusal."""
    queue = ScriptedQueue([])
    completions = Completions(queue, SimpleNamespace(), "scripted")  # no fd: it polls
    done, done_event = completions.expect()
    failed, failed_event = completions.expect()
    _, waiting_event = completions.expect()  # never completes
    queue.polls = [[completion(done)], [completion(failed, WC_REMOTE_ACCESS_ERROR)]]
    with pytest.raises(StreamBroken, match="refused the key or address"):
        await completions.run()
    assert done_event.is_set() and failed_event.is_set() and waiting_event.is_set()
    assert isinstance(completions.failure, StreamBroken)


async def test_a_closed_queue_is_never_polled_again() -> None:
    """Polling a destroyed queue would touch freed memory: after close() its task
    raises instead, and whoever waited is woken with the reason."""
    queue = ScriptedQueue([[completion(1)]])
    completions = Completions(queue, SimpleNamespace(), "scripted")
    _, event = completions.expect()
    completions.close()
    assert event.is_set() and isinstance(completions.failure, StreamClosed)
    completions.expect()  # work still outstanding: the task would poll for it
    with pytest.raises(StreamClosed):
        await completions.run()
    assert queue.polled == 0
