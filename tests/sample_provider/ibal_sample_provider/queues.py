"""Completion queues and queue pairs: the state the verbs keep per queue.

A CQ is a bounded FIFO of work completions plus a one-shot notification arm.
A QP is its attributes (what ``query_qp`` reports), a send queue and a receive
queue.  Posting turns each work request into a *work queue element* (WQE): a
snapshot of what the adapter needs, as a C driver writes WQEs into the ring
the HCA reads.  The snapshot also means a consumer who reuses its ``SendWr``
objects after ``post_send`` returns cannot change a request already posted.

Nothing here calls the access layer; upcalls are made by the CA
(:mod:`ibal_sample_provider.ca`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from dataclasses import dataclass
from typing import Any

from ibal.types import (
    QpAttr,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    Wc,
    WcStatus,
    WrType,
)

from ibal_sample_provider.handles import Av, Pd, Resource


class Cq(Resource):
    """A completion queue of ``size`` entries."""

    def __init__(self, owner: object, size: int, context: Any) -> None:
        super().__init__(owner)
        self.size = size
        self.context = context
        self.entries: deque[Wc] = deque()
        self.users = 0  # QP queues that complete into this CQ
        self.overrun = False  # a completion was lost because the CQ was full
        self._armed = False
        self._solicited_only = False

    @property
    def full(self) -> bool:
        return len(self.entries) >= self.size

    def arm(self, solicited: bool) -> None:
        """Ask for one notification: at the next completion, or the next solicited one.

        Arming for "next" while armed for "solicited" widens the request; the
        other way round leaves it wide.
        """
        self._solicited_only = solicited and (self._solicited_only or not self._armed)
        self._armed = True

    def add(self, wc: Wc, solicited: bool) -> bool:
        """Queue ``wc``; ``True`` if that uses up the arm, i.e. the consumer must be told.

        A failed completion counts as solicited, as in the IBA.
        """
        self.entries.append(wc)
        fires = self._armed and (
            not self._solicited_only or solicited or wc.status is not WcStatus.SUCCESS
        )
        if fires:
            self._armed = False
        return fires

    def poll(self, max_entries: int) -> list[Wc]:
        count = min(max_entries, len(self.entries))
        return [self.entries.popleft() for _ in range(count)]


def _copy_sges(sg_list: Any) -> tuple[Sge, ...]:
    return tuple(Sge(s.addr, s.length, s.lkey) for s in sg_list)


@dataclass(frozen=True, slots=True)
class SendWqe:
    """A posted send work request, as the adapter will execute it."""

    wr_id: int
    opcode: WrType
    sg_list: tuple[Sge, ...]
    options: SendOpt
    imm: int
    remote_addr: int
    rkey: int
    av: Av | None  # UD only, like the two fields below
    remote_qp: int
    remote_qkey: int

    @classmethod
    def from_wr(cls, wr: SendWr, av: Av | None) -> SendWqe:
        return cls(
            wr_id=wr.wr_id,
            opcode=wr.opcode,
            sg_list=_copy_sges(wr.sg_list),
            options=wr.send_opt,
            imm=wr.imm,
            remote_addr=wr.remote_addr,
            rkey=wr.rkey,
            av=av,
            remote_qp=wr.ud.remote_qp if wr.ud else 0,
            remote_qkey=wr.ud.remote_qkey if wr.ud else 0,
        )


@dataclass(frozen=True, slots=True)
class RecvWqe:
    """A posted receive work request: where an incoming message may go."""

    wr_id: int
    sg_list: tuple[Sge, ...]

    @classmethod
    def from_wr(cls, wr: RecvWr) -> RecvWqe:
        return cls(wr.wr_id, _copy_sges(wr.sg_list))


# States in which a QP accepts incoming messages.
RECEIVING = frozenset({QpState.RTR, QpState.RTS, QpState.SQD, QpState.SQERR})


class Qp(Resource):
    """A queue pair: its attributes and its two work queues."""

    def __init__(
        self, owner: object, pd: Pd, attr: QpAttr, send_cq: Cq, recv_cq: Cq, context: Any
    ) -> None:
        super().__init__(owner)
        self.pd = pd
        self.attr = attr
        self.send_cq = send_cq
        self.recv_cq = recv_cq
        self.context = context
        self.sq: deque[SendWqe] = deque()
        self.rq: deque[RecvWqe] = deque()
        self.established = False  # QP_COMM raised (first packet received in RTR)

    @property
    def qp_num(self) -> int:
        return self.attr.qp_num

    @property
    def qp_type(self) -> QpType:
        return self.attr.qp_type

    @property
    def state(self) -> QpState:
        return self.attr.state

    @state.setter
    def state(self, state: QpState) -> None:
        self.attr = dataclasses.replace(self.attr, state=state)

    @property
    def receiving(self) -> bool:
        return self.state in RECEIVING

    def signaled(self, wqe: SendWqe) -> bool:
        """Whether a successful ``wqe`` produces a completion (failures always do)."""
        return self.attr.sq_signaled or bool(wqe.options & SendOpt.SIGNALED)
