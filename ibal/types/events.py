"""Asynchronous events: codes, which object each concerns, the provider and consumer records."""

from __future__ import annotations

import enum
from typing import Any

from ibal.records import record


class AsyncEvent(enum.IntEnum):
    """`ib_async_event_t` (upstream, from 1); unknown provider codes map to UNKNOWN."""

    SQ_ERROR = 1
    SQ_DRAINED = 2
    RQ_ERROR = 3
    CQ_ERROR = 4
    QP_FATAL = 5
    QP_COMM = 6
    QP_APM = 7
    LOCAL_FATAL = 8
    PKEY_TRAP = 9
    QKEY_TRAP = 10
    MKEY_TRAP = 11
    PORT_TRAP = 12
    SYSIMG_GUID_TRAP = 13
    BUF_OVERRUN = 14
    LINK_INTEGRITY = 15
    FLOW_CTRL_ERROR = 16
    BKEY_TRAP = 17
    QP_APM_ERROR = 18
    WQ_REQ_ERROR = 19
    WQ_ACCESS_ERROR = 20
    PORT_ACTIVE = 21
    PORT_DOWN = 22
    CLIENT_REREGISTER = 23
    SRQ_LIMIT_REACHED = 24
    SRQ_CATAS_ERROR = 25
    SRQ_QP_LAST_WQE_REACHED = 26
    LID_CHANGE = 27
    PKEY_CHANGE = 28
    SM_CHANGE = 29
    GID_CHANGE = 30
    CQ_OVERFLOW = 31
    UNKNOWN = 32

    @classmethod
    def _missing_(cls, value: object) -> AsyncEvent:
        return cls.UNKNOWN

    @property
    def source(self) -> EventSource:
        """Which kind of object the event concerns (decides whose callback gets it)."""
        return _EVENT_SOURCE.get(self, EventSource.CA)


class EventSource(enum.Enum):
    CA = "ca"
    QP = "qp"
    CQ = "cq"
    SRQ = "srq"


_EVENT_SOURCE = {
    **{
        e: EventSource.QP
        for e in (
            AsyncEvent.SQ_ERROR,
            AsyncEvent.SQ_DRAINED,
            AsyncEvent.RQ_ERROR,
            AsyncEvent.QP_FATAL,
            AsyncEvent.QP_COMM,
            AsyncEvent.QP_APM,
            AsyncEvent.QP_APM_ERROR,
            AsyncEvent.WQ_REQ_ERROR,
            AsyncEvent.WQ_ACCESS_ERROR,
            AsyncEvent.SRQ_QP_LAST_WQE_REACHED,
        )
    },
    AsyncEvent.CQ_ERROR: EventSource.CQ,
    AsyncEvent.CQ_OVERFLOW: EventSource.CQ,
    AsyncEvent.SRQ_LIMIT_REACHED: EventSource.SRQ,
    AsyncEvent.SRQ_CATAS_ERROR: EventSource.SRQ,
}


@record(frozen=True)
class EventRecord:
    """`ib_event_rec_t`: what a provider reports through the async-event upcall.

    ``context`` is the context given at creation of the object concerned
    (``qp_context``, ``cq_context``, ``srq_context``) or the ``ca_context``.
    """

    code: AsyncEvent
    context: Any
    vendor_specific: int = 0
    port_num: int = 0


@record(frozen=True)
class AsyncEventRec:
    """`ib_async_event_rec_t`: what the AL hands consumers' event callbacks."""

    code: AsyncEvent
    context: Any
    handle: Any
    vendor_specific: int = 0
    port_num: int = 0
