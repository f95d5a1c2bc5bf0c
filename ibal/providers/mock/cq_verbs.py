"""Completion queues: create, resize, destroy, poll, peek and arm.

Called by the access layer on any thread under the fabric lock; never blocks;
raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ibal.ci.interface import (
    CqCreated,
    Handle,
)
from ibal.providers.mock.objects import (
    MockCq,
)
from ibal.status import (
    InvalidCqHandle,
    InvalidParameter,
)
from ibal.types import (
    Wc,
)

if TYPE_CHECKING:
    pass

from ibal.providers.mock.ca_state import (
    CaState,
    verb,
)


class CqVerbs(CaState):
    """Completion queues: create, resize, destroy, poll, peek and arm."""

    @verb
    def create_cq(self, h_ca: Handle, size: int, cq_context: Any) -> CqCreated:
        self._take_cq(h_ca, size)
        cq = MockCq(self, size, cq_context)
        return CqCreated(cq, size)

    def destroy_cq(self, h_cq: Handle) -> None:
        fab = self._engine
        self._no_callback("destroy_cq")
        with fab.lock:
            if fab.verb_faults_armed:
                fab.faults.check_verb("destroy_cq", self)
            cq = self._h_cq(h_cq)
            self._release_cq(cq)
            cq.notify = cq.notify_n = 0
        fab.callback_barrier()

    def poll_cq(self, h_cq: Handle, max_entries: int) -> list[Wc]:
        fab = self._engine
        cq = h_cq
        if type(cq) is not MockCq or cq.ca is not self or not cq.alive:
            raise InvalidCqHandle(f"not a CQ of {self.name}: {cq!r}")
        with fab.lock:
            if fab.verb_faults_armed:
                fab.faults.check_verb("poll_cq", self)
            ents = cq.entries
            if not ents:
                if not fab.timer_heap or fab.manual:
                    if max_entries < 0:
                        raise InvalidParameter("max_entries < 0")
                    return []
                fab.drive()  # let due timers (RNR waits, retries) run while polling
            if max_entries >= len(ents):
                out = list(ents)
                ents.clear()
            elif max_entries > 0:
                out = [ents.popleft() for _ in range(max_entries)]
            elif max_entries == 0:
                out = []
            else:
                raise InvalidParameter("max_entries < 0")
        if fab.upcalls:
            fab.flush_upcalls()
        return out

    def peek_cq(self, h_cq: Handle) -> int:
        cq = h_cq
        if type(cq) is not MockCq or cq.ca is not self or not cq.alive:
            raise InvalidCqHandle(f"not a CQ of {self.name}: {cq!r}")
        fab = self._engine
        with fab.lock:
            if fab.verb_faults_armed:
                fab.faults.check_verb("peek_cq", self)
            return len(cq.entries)

    @verb
    def enable_cq_notify(self, h_cq: Handle, solicited: bool) -> None:
        cq = self._h_cq(h_cq)
        if solicited:
            if cq.notify != MockCq.NOTIFY_NEXT:
                cq.notify = MockCq.NOTIFY_SOLICITED
        else:
            cq.notify = MockCq.NOTIFY_NEXT

    @verb
    def enable_ncomp_cq_notify(self, h_cq: Handle, n_cqes: int) -> None:
        cq = self._h_cq(h_cq)
        if not isinstance(n_cqes, int) or not 1 <= n_cqes <= cq.size:
            raise InvalidParameter(f"n_cqes must be 1..{cq.size}")
        cq.notify_n = n_cqes
