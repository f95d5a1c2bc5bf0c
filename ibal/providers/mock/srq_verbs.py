"""Shared receive queues.

Called by the access layer on any thread under the fabric lock; never blocks;
raises the :mod:`ibal.status` exceptions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ibal.ci.interface import (
    Handle,
)
from ibal.providers.mock.objects import (
    MockSrq,
)
from ibal.status import (
    Status,
    post_error,
)
from ibal.types import (
    RecvWr,
)

if TYPE_CHECKING:
    pass

from ibal.providers.mock.ca_state import (
    CaState,
)


class SrqVerbs(CaState):
    """Shared receive queues: the verbs beyond :class:`~ibal.providers.softca.SoftCa`'s."""

    def destroy_srq(self, h_srq: Handle) -> None:
        fab = self._engine
        self._no_callback("destroy_srq")
        with fab.lock:
            if fab.verb_faults_armed:
                fab.faults.check_verb("destroy_srq", self)
            self._release_srq(self._h_srq(h_srq))
        fab.callback_barrier()

    def post_srq_recv(self, h_srq: Handle, wrs: Sequence[RecvWr]) -> None:
        fab = self._engine
        with fab.lock:
            if fab.verb_faults_armed:
                fab.faults.check_verb("post_srq_recv", self)
            srq = h_srq
            if type(srq) is not MockSrq or srq.ca is not self or not srq.alive:
                raise post_error(Status.INVALID_SRQ_HANDLE, 0, f"not an SRQ of {self.name}")
            wqes = srq.wqes
            for i, wr in enumerate(wrs):
                sg = wr.sg_list
                if len(sg) > srq.max_sge:
                    raise post_error(Status.INVALID_MAX_SGE, i, f"{len(sg)} SGEs > {srq.max_sge}")
                if len(wqes) >= srq.max_wr:
                    raise post_error(Status.INSUFFICIENT_RESOURCES, i, "SRQ full")
                wqes.append((wr.wr_id, tuple((s.addr, s.length, s.lkey) for s in sg)))
