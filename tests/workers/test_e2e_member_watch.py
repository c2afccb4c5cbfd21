"""The stand-in's watches, which the end-to-end tests (and the workers' own
watches) rely on to see every change on a member.

An event pushed while a watch's wait for the next batch timed out was left
pending behind an empty batch, after which the stream sent a bookmark at the
store's newest revision; a client that resumed from that bookmark (every
``timeoutSeconds``) never saw the event. Found by tests/workers/test_e2e_fleet.py:
a deleted job (and a pod) the member watch kept seeing.
"""

from __future__ import annotations

import asyncio

from sim.kubesim.store import ADDED, Event, Watcher


def test_an_event_pushed_while_the_wait_times_out_is_in_the_batch() -> None:
    async def scenario() -> tuple[list[Event], list[Event]]:
        watcher = Watcher(lambda event: True)
        event = Event(ADDED, 7, {"metadata": {"name": "x"}}, None, ("", "x"))
        # Runs at the first yield inside next_batch: as the timeout is handled.
        asyncio.get_running_loop().call_soon(watcher.push, event)
        batch = await watcher.next_batch(0)
        return batch, list(watcher.pending)

    batch, left = asyncio.run(scenario())
    assert [e.rv for e in batch] == [7] and left == []
