"""``CiCa``: one registered CA, opened once, shared by every AL instance (IBAL ``al_ci_ca.c``).

``ci.open_ca`` allows a single open instance, so the manager opens each CA
exactly once at ``register_ca`` and every AL's :class:`~ibal.al.ca.Ca` handle
is multiplexed over it.  The CI upcalls land here: completions carry the
``cq_context`` (the AL's own :class:`Cq`), async events an
:class:`~ibal.types.EventRecord` whose context is the AL object concerned
(``qp_context``/``cq_context``/``srq_context``) or this record (``ca_context``).
Both are only queued (completions on the manager's completion queue, events on
its misc queue): nothing runs on the provider's stack.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from ibal.al import cq as cq_mod
from ibal.al import qp as qp_mod
from ibal.al.cq import Cq
from ibal.al.dispatcher import call_user
from ibal.al.mad_port import SplQpTransport
from ibal.al.mad_sends import SendCqContext
from ibal.al.obj import AlObject
from ibal.al.qp import Qp
from ibal.al.srq import Srq
from ibal.ci.interface import Capabilities, ChannelInterface
from ibal.types import AsyncEvent, AsyncEventRec, CaAttr, EventRecord, EventSource, PortAttr

if TYPE_CHECKING:
    from ibal.al.ca import Ca
    from ibal.al.manager import AlManager

PORT_EVENTS = frozenset(
    {
        AsyncEvent.PORT_ACTIVE,
        AsyncEvent.PORT_DOWN,
        AsyncEvent.LID_CHANGE,
        AsyncEvent.PKEY_CHANGE,
        AsyncEvent.SM_CHANGE,
        AsyncEvent.GID_CHANGE,
        AsyncEvent.CLIENT_REREGISTER,
    }
)
"""CA events that say a port changed: they also feed PnP."""

_EVENT_TARGET: dict[EventSource, type[AlObject]] = {
    EventSource.QP: Qp,
    EventSource.CQ: Cq,
    EventSource.SRQ: Srq,
}


class CiCa:
    """A registered CA: the CI, its one open handle, cached attributes, the AL handles on it."""

    def __init__(self, mgr: AlManager, ci: ChannelInterface) -> None:
        self.mgr = mgr
        self.ci = ci
        self.guid: int = ci.guid
        self.name: str = getattr(ci, "name", "") or f"ca-{ci.guid:016x}"
        self.provider_name: str = getattr(ci, "provider_name", "") or ""
        self.capabilities: Capabilities = ci.capabilities
        self.h_ca: Any = None
        self.attr: CaAttr = CaAttr(ca_guid=ci.guid)
        self.cas: dict[Ca, None] = {}  # every AL's open handle on this CA
        self.removing = False  # deregistered: no new opens, teardown under way
        self.closing = False  # close_ca is being (or has been) called
        self.closed = threading.Event()
        self.post_completion = mgr.queues.completion.post
        """Queue ``fn(*args)`` on the completion queue (any thread; the hot path: bound once)."""

    def __repr__(self) -> str:
        return f"<CiCa {self.name} 0x{self.guid:016x}>"

    # ------------------------------------------------------------------ lookups
    def port(self, port_num: int) -> PortAttr | None:
        for p in self.attr.ports:
            if p.port_num == port_num:
                return p
        return None

    def port_by_guid(self, port_guid: int) -> PortAttr | None:
        for p in self.attr.ports:
            if p.port_guid == port_guid:
                return p
        return None

    def limit(self, name: str) -> int:
        """A CA limit from ``CaAttr``; 0 means the provider did not say (no check)."""
        value = getattr(self.attr, name, 0)
        return value if isinstance(value, int) else 0

    # ------------------------------------------------------------------ CI upcalls
    def completion_cb(self, cq_context: Any) -> None:
        """``ci_completion_cb_t``: queue the CQ's completion callback (provider's stack)."""
        if isinstance(cq_context, Cq):
            cq_mod.completion_upcall(cq_context, self)
        elif isinstance(cq_context, SplQpTransport) and cq_context.cica is self:
            self.post_completion(cq_context.on_completion)  # the AL's own QP0/QP1
        elif isinstance(cq_context, SendCqContext) and cq_context.transport.cica is self:
            self.post_completion(cq_context.transport.on_send_completion)

    def async_event_cb(self, record: EventRecord) -> None:
        """``ci_async_event_cb_t``: queue the event; it is routed on the misc queue."""
        ctx = record.context
        if isinstance(ctx, Qp):
            qp_mod.observe_event(ctx, self, AsyncEvent(record.code))
        self.mgr.queues.misc.post(self._route_event, record)

    def _route_event(self, record: EventRecord) -> None:
        """Misc-queue task: hand the event to the object it concerns."""
        if self.closed.is_set():
            return
        code = record.code if isinstance(record.code, AsyncEvent) else AsyncEvent(record.code)
        source = code.source
        target_cls = _EVENT_TARGET.get(source)
        if target_cls is not None:
            target = record.context
            if isinstance(target, target_cls) and getattr(target, "_cica", None) is self:
                if isinstance(target, Qp):
                    _notify_listeners(target, code, record)
                deliver_event(target, code, record)
            return
        for ca in list(self.cas):
            deliver_event(ca, code, record)
        if code in PORT_EVENTS:
            self.mgr.pnp_port_change(self, code, record.port_num)


def _notify_listeners(qp: Qp, code: AsyncEvent, record: EventRecord) -> None:
    """Run the QP's ``add_event_listener`` functions (misc queue), while it is alive."""
    listeners = qp_mod.event_listeners(qp)
    if not listeners or not qp._enter():
        return
    try:
        rec = AsyncEventRec(code=code, context=qp.context, handle=qp,
                            vendor_specific=record.vendor_specific, port_num=record.port_num)
        for fn in listeners:
            call_user(fn, rec)
    finally:
        qp._leave()


def deliver_event(obj: AlObject, code: AsyncEvent, record: EventRecord) -> None:
    """Run ``obj``'s event callback with an ``AsyncEventRec`` (on the misc queue)."""
    cb = getattr(obj, "_event_cb", None)
    if cb is None or not obj._enter():
        return
    try:
        call_user(
            cb,
            AsyncEventRec(
                code=code,
                context=obj.context,
                handle=obj,
                vendor_specific=record.vendor_specific,
                port_num=record.port_num,
            ),
        )
    finally:
        obj._leave()
