"""``vc-controller-manager``'s queue controller, as far as a Queue's life goes:
its state, and the webhook that guards its deletion.

Volcano keeps a Queue's ``status.state`` itself (``Open``, ``Closing``,
``Closed``); a user (``vcctl queue operate --action close``) or a program asks
for a change with a ``bus.volcano.sh/v1alpha1`` Command whose ``target`` is
the Queue and whose ``action`` is ``CloseQueue`` or ``OpenQueue``. The
controller takes the Command (and deletes it), then: closing a Queue that
still holds PodGroups makes it ``Closing`` (no new group enters: the
scheduler's enqueue takes only ``Open`` queues), and it becomes ``Closed``
once its last group is gone; opening makes it ``Open``. Volcano's queue
webhook (``validateQueueDeleting``) refuses to delete the ``default`` Queue
and any Queue that is not ``Closed``, answered as kube-apiserver answers a
denying webhook (400, ``admission webhook "validatequeue.volcano.sh" denied
the request: …``). Sources: Volcano's ``pkg/controllers/queue`` (state
machine, command handling), ``pkg/webhooks/admission/queues/validate``,
``pkg/cli/util`` (``CreateQueueCommand``: the Command's shape), and its
design ``docs/design/queue/queue-state-management.md``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from sim.kubesim.api import Context, Resource
from sim.kubesim.controllers.base import Reconciler
from sim.kubesim.controllers.volcano.podgroup import PODGROUPS, QUEUES
from sim.kubesim.errors import ApiError
from sim.kubesim.store import DELETED, Event

__all__ = ["COMMANDS", "VolcanoQueueController"]

Obj = dict[str, Any]
COMMANDS = "commands.bus.volcano.sh"
CLOSE, OPEN = "CloseQueue", "OpenQueue"
_WEBHOOK = "validatequeue.volcano.sh"


def _denied(message: str) -> ApiError:
    return ApiError(
        400, "BadRequest", f'admission webhook "{_WEBHOOK}" denied the request: {message}'
    )


def _state(queue: Obj) -> str:
    return str((queue.get("status") or {}).get("state") or "Open")


def _queue_of(group: Obj) -> str:
    return str((group.get("spec") or {}).get("queue") or "default")


class VolcanoQueueController(Reconciler):
    """Queue state from Commands and from the groups a closing Queue still holds."""

    name = "vc-controller-manager-queue"
    manager = "vc-controller-manager"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.serve_webhook(self.admit)
        for command in self.items(COMMANDS):
            self.enqueue(("command", command["metadata"]["namespace"], command["metadata"]["name"]))
        for queue in self.items(QUEUES):
            self.enqueue(("queue", queue["metadata"]["name"]))

    def admit(
        self, operation: str, resource: Resource, obj: Obj, old: Obj | None, ctx: Context
    ) -> None:
        """Volcano's queue webhook on delete: only a Closed Queue goes, never ``default``."""
        if resource.rtype.key != QUEUES or operation != "DELETE":
            return
        name = obj["metadata"]["name"]
        if name == "default":
            raise _denied("`default` queue can not be deleted")
        if _state(obj) != "Closed":
            raise _denied(
                f"only queue with state `Closed` can be deleted, "
                f"queue `{name}` state is `{_state(obj)}`"
            )

    def keys_for(self, resource_key: str, event: Event) -> Iterable[Hashable]:
        metadata = event.obj["metadata"]
        if resource_key == COMMANDS and event.type != DELETED:
            yield ("command", metadata.get("namespace", ""), metadata["name"])
        elif resource_key == QUEUES and event.type != DELETED:
            yield ("queue", metadata["name"])
        elif resource_key == PODGROUPS and event.type == DELETED:
            yield ("queue", _queue_of(event.obj))

    def reconcile(self, key: Hashable) -> None:
        assert isinstance(key, tuple)
        if key[0] == "command":
            self._command(str(key[1]), str(key[2]))
        else:
            self._settle(str(key[1]))

    def _command(self, namespace: str, name: str) -> None:
        command = self.get(COMMANDS, namespace, name)
        if command is None:
            return
        target = command.get("target") or {}
        action = command.get("action")
        self.delete(COMMANDS, command)  # taken: Volcano deletes a Command it has read
        if target.get("kind") != "Queue" or action not in (CLOSE, OPEN):
            return
        queue = self.get(QUEUES, "", str(target.get("name")))
        if queue is None or (target.get("uid") and queue["metadata"]["uid"] != target["uid"]):
            return
        wanted = "Open" if action == OPEN else self._closed_or_closing(queue)
        self._write_state(queue, wanted)

    def _settle(self, name: str) -> None:
        """A Closing Queue whose last group has gone is Closed."""
        queue = self.get(QUEUES, "", name)
        if queue is not None and _state(queue) == "Closing":
            self._write_state(queue, self._closed_or_closing(queue))

    def _closed_or_closing(self, queue: Obj) -> str:
        name = queue["metadata"]["name"]
        holds = any(_queue_of(g) == name for g in self.items(PODGROUPS))
        return "Closing" if holds else "Closed"

    def _write_state(self, queue: Obj, state: str) -> None:
        if _state(queue) == state:
            return

        def change(q: Obj) -> None:
            q.setdefault("status", {})["state"] = state

        self.mutate(QUEUES, queue, change, status=True)
