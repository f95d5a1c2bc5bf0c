"""The sample's CA: the :class:`~ibal.ci.ChannelInterface` the access layer calls.

One ``SampleCa`` object is one CA, as one ``ci_interface_t`` table is in
``ib_ci.h``.  Every verb follows the same three steps:

1. check the handles (a foreign or destroyed one raises that type's
   ``Invalid*Handle``) and the arguments, before changing anything, so a verb
   that fails leaves nothing behind;
2. do the bookkeeping: the limits ``query_ca`` reports, and who uses whom, so
   that destroying something still in use raises ``ResourceBusy``;
3. ring the doorbell (:func:`ibal_sample_provider.loopback.run`) when work
   may proceed.

Threading: the access layer may call verbs from several threads at once, so one
lock per CA serialises them.  Upcalls (``completion_cb``, ``async_event_cb``)
are made with the lock held.  That is safe because the access layer only queues
them, and it makes "no upcall for an object once its destroy verb returned"
automatic.  A C driver would rather lock per queue and keep the same rule by
other means.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable, Sequence
from ipaddress import IPv6Address
from typing import Any, Concatenate, ParamSpec, TypeVar

from ibal import qp_fsm
from ibal.ci import (
    AsyncEventCallback,
    Capabilities,
    ChannelInterface,
    CompletionCallback,
    CqCreated,
    QpCreated,
)
from ibal.status import (
    InsufficientResources,
    InvalidAvHandle,
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidCqSize,
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidMrHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPermission,
    InvalidPkey,
    InvalidPort,
    InvalidQpHandle,
    InvalidServiceType,
    InvalidSetting,
    Overflow,
    PostError,
    ResourceBusy,
    Status,
    Unsupported,
    post_error,
)
from ibal.types import (
    AccessFlags,
    AsyncEvent,
    AtomicCap,
    AvAttr,
    CaAttr,
    EventRecord,
    LinkState,
    MrAttr,
    MrKeys,
    Mtu,
    PdType,
    PortAttr,
    QpAttr,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Wc,
    WrType,
)

from ibal_sample_provider import loopback
from ibal_sample_provider.handles import Av, CaHandle, Pd, check
from ibal_sample_provider.memory import KeyTable, Mr
from ibal_sample_provider.queues import Cq, Qp, RecvWqe, SendWqe

PORT = 1
"""The one port's number (ports count from 1)."""

# What the CA can do.  Every field is spelled out, defaults included, so the
# whole CA reads at a glance; each one left out (or, for qp_types and opcodes,
# cut down) has a reason, which the conformance suite prints when it skips.
CAPABILITIES = Capabilities(
    qp_types=frozenset({QpType.RC, QpType.UD}),
    opcodes={
        QpType.RC: frozenset({WrType.SEND, WrType.RDMA_WRITE, WrType.RDMA_READ}),
        QpType.UD: frozenset({WrType.SEND}),
    },
    special_qps=frozenset(),
    atomics=False,
    mw_types=frozenset(),
    srq=False,
    peek_cq=True,
    rearm_n_cq=False,
    resize_cq=True,
    multicast=False,
    phys_mr=False,
    shared_mr=False,
    modify_mr=False,
    local_mad=False,
    mad_agents=False,
    vendor_call=False,
    violation_counters=False,
    modify_ca=False,
    inline_data=False,
    immediate=True,
    solicited_events=True,
    sqd=False,
    apm=False,
    async_event_injection=False,
    reasons={
        "qp_types": "UC and RD are left out: RC and UD show both kinds of transport",
        "opcodes": "UD carries only SEND, as the IBA says, and atomics are left out",
        "special_qps": "a loopback port has no subnet manager, so no QP0/QP1 and no MADs",
        "atomics": "they need an atomic unit at the responder; the mock provider has one",
        "mw_types": "memory windows are left out: the sample keeps to memory regions",
        "srq": "every QP has its own receive queue",
        "rearm_n_cq": "rearm for the next or the next solicited completion instead",
        "multicast": "one loopback port has no fabric to replicate datagrams over",
        "phys_mr": "the sample reaches memory only through the buffers it is given",
        "shared_mr": "register the buffer again instead",
        "fmr": "the access layer's emulation over register/deregister serves instead",
        "modify_mr": "deregister and register again instead",
        "local_mad": "the loopback port has no subnet management agent",
        "port_counters": "the sample keeps no statistics",
        "mad_agents": "no MADs at all: neither special QPs nor a kernel MAD layer to register with",
        "vendor_call": "the sample has no private commands",
        "violation_counters": "the loopback port counts no P_Key or Q_Key violations",
        "modify_ca": "the loopback port's attributes are fixed",
        "inline_data": "the sample reads memory only through registered regions",
        "sqd": "work requests execute when posted, so there is nothing to drain",
        "apm": "a loopback port has no alternate path",
        "resize_qp": "queues keep the depths granted at creation",
        "async_event_injection": "events come only from real conditions (a refused RDMA, "
        "a CQ overrun)",
    },
)


def unsupported(name: str) -> Unsupported:
    """The exception for a capability left out, with the reason the CA gives."""
    return Unsupported(f"{name}: {CAPABILITIES.reason(name)}")


LIMITS = CaAttr(
    ca_guid=0,
    max_pds=64,
    max_qps=64,
    max_wrs=256,
    max_sges=4,
    max_cqs=64,
    max_cqes=4096,
    max_avs=256,
    max_mrs=256,
    max_mr_size=1 << 30,
    max_qp_init_depth=4,
    max_qp_resp_res=4,
    atomicity=AtomicCap.NONE,
)
"""What ``query_ca`` reports, less the identity and the port, filled in per CA."""

_QP_ATTR_FIELDS = frozenset(f.name for f in dataclasses.fields(QpAttr))

P = ParamSpec("P")
T = TypeVar("T")


def serialized(
    verb: Callable[Concatenate[SampleCa, P], T],
) -> Callable[Concatenate[SampleCa, P], T]:
    """Run ``verb`` under the CA's lock."""

    @functools.wraps(verb)
    def locked(self: SampleCa, /, *args: P.args, **kwargs: P.kwargs) -> T:
        with self._lock:
            return verb(self, *args, **kwargs)

    return locked


class SampleCa(ChannelInterface):
    """The loopback HCA: one port, whose QPs talk only to QPs on the same port."""

    name = "sample0"
    provider_name = "sample"

    def __init__(self, guid: int) -> None:
        self.guid = guid
        port_guid = guid + PORT  # the usual convention: node GUID + port number
        self.port = PortAttr(
            port_num=PORT,
            port_guid=port_guid,
            lid=1,
            link_state=LinkState.ACTIVE,
            active_mtu=Mtu.MTU_4096,
            max_mtu=Mtu.MTU_4096,
            gids=(IPv6Address((0xFE80 << 112) | port_guid),),  # link-local prefix + port GUID
        )
        self._attr = dataclasses.replace(
            LIMITS, ca_guid=guid, system_image_guid=guid, fw_version="sample 0.1",
            ports=(self.port,),
        )
        self._lock = threading.RLock()
        self._open: CaHandle | None = None
        self._completion_cb: CompletionCallback | None = None
        self._async_event_cb: AsyncEventCallback | None = None
        self._ca_context: Any = None  # for CA and port events; the sample raises none
        self._pds: set[Pd] = set()
        self._avs: set[Av] = set()
        self._cqs: set[Cq] = set()
        self.qps: dict[int, Qp] = {}  # by QP number: how a message finds its receiver
        self.keys = KeyTable()
        self._next_qp_num = 2  # 0 and 1 are the special QPs' numbers

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    @serialized
    def resource_counts(self) -> dict[str, int]:
        """Testing hook: the live objects of this CA by kind.

        Not a verb: the conformance suite reads it (``live_resources``) to check
        that a failed verb leaves nothing behind and that teardown frees
        everything.
        """
        return {
            "pd": len(self._pds),
            "av": len(self._avs),
            "cq": len(self._cqs),
            "qp": len(self.qps),
            "mr": len(self.keys),
        }

    # ------------------------------------------------------------------ upcalls
    def complete(self, cq: Cq, wc: Wc, solicited: bool = False) -> None:
        """Queue a completion; tell the access layer if the consumer armed the CQ."""
        if cq.full:
            # An overrun is a CQ error (IBA): the completion is lost.  Say so once.
            if not cq.overrun:
                cq.overrun = True
                self.async_event(AsyncEvent.CQ_ERROR, cq.context)
            return
        if cq.add(wc, solicited) and self._completion_cb is not None:
            self._completion_cb(cq.context)

    def async_event(self, code: AsyncEvent, context: Any, port_num: int = 0) -> None:
        """Report an event on an object, with the context its creator gave."""
        if self._async_event_cb is not None:
            self._async_event_cb(EventRecord(code, context, port_num=port_num))

    # ------------------------------------------------------------- handle checks
    def _ca(self, h_ca: Any) -> CaHandle:
        return check(h_ca, CaHandle, self, InvalidCaHandle)

    def _pd(self, h_pd: Any) -> Pd:
        return check(h_pd, Pd, self, InvalidPdHandle)

    def _av(self, h_av: Any) -> Av:
        return check(h_av, Av, self, InvalidAvHandle)

    def _cq(self, h_cq: Any) -> Cq:
        return check(h_cq, Cq, self, InvalidCqHandle)

    def _qp(self, h_qp: Any) -> Qp:
        return check(h_qp, Qp, self, InvalidQpHandle)

    def _mr(self, h_mr: Any) -> Mr:
        return check(h_mr, Mr, self, InvalidMrHandle)

    @staticmethod
    def _limit(count: int, limit: int, what: str) -> None:
        if count >= limit:
            raise InsufficientResources(f"no more {what}: the CA has {limit}")

    # ------------------------------------------------------------------ CA access
    @serialized
    def open_ca(
        self,
        completion_cb: CompletionCallback,
        async_event_cb: AsyncEventCallback,
        ca_context: Any,
    ) -> CaHandle:
        if not callable(completion_cb) or not callable(async_event_cb):
            raise InvalidParameter("open_ca needs both callbacks")
        if self._open is not None:
            raise ResourceBusy(f"{self.name} is already open")
        self._open = CaHandle(self)
        self._completion_cb = completion_cb
        self._async_event_cb = async_event_cb
        self._ca_context = ca_context
        return self._open

    @serialized
    def query_ca(self, h_ca: Any) -> CaAttr:
        self._ca(h_ca)
        return self._attr

    @serialized
    def close_ca(self, h_ca: Any) -> None:
        handle = self._ca(h_ca)
        if self._pds or self._cqs:
            raise ResourceBusy("PDs or CQs are still allocated")
        handle.alive = False
        self._open = None
        self._completion_cb = self._async_event_cb = None

    # -------------------------------------------------------------------- PD / AV
    @serialized
    def allocate_pd(self, h_ca: Any, pd_type: PdType) -> Pd:
        self._ca(h_ca)  # every PD type is the same to the sample: the type is a hint
        self._limit(len(self._pds), self._attr.max_pds, "PDs")
        pd = Pd(self)
        self._pds.add(pd)
        return pd

    @serialized
    def deallocate_pd(self, h_pd: Any) -> None:
        pd = self._pd(h_pd)
        if pd.users:
            raise ResourceBusy(f"the PD is used by {pd.users} AVs, QPs or MRs")
        pd.alive = False
        self._pds.remove(pd)

    def _check_av_attr(self, attr: AvAttr) -> None:
        if attr.port_num != PORT:
            raise InvalidPort(f"{self.name} has only port {PORT}")
        if attr.grh is not None and not 0 <= attr.grh.sgid_index < len(self.port.gids):
            raise InvalidParameter(f"sgid_index {attr.grh.sgid_index} is not in the GID table")

    @serialized
    def create_av(self, h_pd: Any, attr: AvAttr) -> Av:
        pd = self._pd(h_pd)
        self._check_av_attr(attr)
        self._limit(len(self._avs), self._attr.max_avs, "AVs")
        av = Av(self, pd, attr)
        self._avs.add(av)
        pd.users += 1
        return av

    @serialized
    def query_av(self, h_av: Any) -> AvAttr:
        return self._av(h_av).attr

    @serialized
    def modify_av(self, h_av: Any, attr: AvAttr) -> None:
        av = self._av(h_av)
        self._check_av_attr(attr)
        av.attr = attr

    @serialized
    def destroy_av(self, h_av: Any) -> None:
        av = self._av(h_av)
        av.alive = False
        self._avs.remove(av)
        av.pd.users -= 1

    # ------------------------------------------------------------------------ QP
    @serialized
    def create_qp(
        self,
        h_pd: Any,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: Any,
        recv_cq: Any,
        srq: Any,
        sq_signaled: bool,
        qp_context: Any,
    ) -> QpCreated:
        pd = self._pd(h_pd)
        scq, rcq = self._cq(send_cq), self._cq(recv_cq)
        if srq is not None:
            raise unsupported("srq")
        if qp_type.is_special:
            raise InvalidServiceType("special QPs come from create_spl_qp")
        if qp_type not in CAPABILITIES.qp_types:
            raise Unsupported(f"{qp_type.name} QPs: {CAPABILITIES.reason('qp_types')}")
        limits = self._attr
        if not (0 <= caps.sq_depth <= limits.max_wrs and 0 <= caps.rq_depth <= limits.max_wrs):
            raise InvalidMaxWrs(f"queue depths go up to {limits.max_wrs}")
        if not (0 <= caps.sq_sge <= limits.max_sges and 0 <= caps.rq_sge <= limits.max_sges):
            raise InvalidMaxSge(f"SGE counts go up to {limits.max_sges}")
        if caps.max_inline:
            raise unsupported("inline_data")
        self._limit(len(self.qps), self._attr.max_qps, "QPs")
        qp_num = self._next_qp_num  # never reused, so a stale number reaches nobody
        self._next_qp_num += 1
        attr = QpAttr(qp_type=qp_type, qp_num=qp_num, caps=caps, sq_signaled=sq_signaled)
        qp = Qp(self, pd, attr, scq, rcq, qp_context)
        self.qps[qp_num] = qp
        pd.users += 1
        scq.users += 1
        rcq.users += 1
        return QpCreated(qp, qp.attr)

    def _check_qp_mod(self, mod: QpMod) -> None:
        """What the state table cannot know: this CA's ports, P_Keys and limits."""
        if mod.state is QpState.SQD:
            raise unsupported("sqd")
        if mod.alternate_av is not None or mod.apm_state is not None:
            raise unsupported("apm")
        if mod.access is not None and mod.access & AccessFlags.ATOMIC:
            raise unsupported("atomics")
        if mod.port_num is not None and mod.port_num != PORT:
            raise InvalidPort(f"{self.name} has only port {PORT}")
        if mod.primary_av is not None:
            self._check_av_attr(mod.primary_av)
        if mod.pkey_index is not None and not 0 <= mod.pkey_index < len(self.port.pkeys):
            raise InvalidPkey(f"P_Key index {mod.pkey_index} is not in the table")
        if mod.path_mtu is not None and mod.path_mtu > self.port.max_mtu:
            raise InvalidSetting(f"path MTU {mod.path_mtu.bytes} is above the port's")
        if mod.init_depth is not None and mod.init_depth > self._attr.max_qp_init_depth:
            raise InvalidSetting(f"init_depth goes up to {self._attr.max_qp_init_depth}")
        if mod.resp_res is not None and mod.resp_res > self._attr.max_qp_resp_res:
            raise InvalidSetting(f"resp_res goes up to {self._attr.max_qp_resp_res}")

    @serialized
    def modify_qp(self, h_qp: Any, mod: QpMod) -> QpAttr:
        qp = self._qp(h_qp)
        self._check_qp_mod(mod)
        # The access layer has checked the transition already; checking again
        # costs nothing and keeps the QP sane whoever calls.
        qp_fsm.check_modify(qp.qp_type, qp.state, mod)
        if mod.state is QpState.RESET:
            # Back to RESET is like new: queues emptied without completions.
            qp.sq.clear()
            qp.rq.clear()
            qp.established = False
            qp.attr = QpAttr(
                qp_type=qp.qp_type, qp_num=qp.qp_num, caps=qp.attr.caps,
                sq_signaled=qp.attr.sq_signaled,
            )
        else:
            changes = {name: getattr(mod, name) for name in mod.given() & _QP_ATTR_FIELDS}
            qp.attr = dataclasses.replace(qp.attr, state=mod.state, **changes)
        loopback.run(self)  # ERROR flushes; a sender waiting for this QP may go on
        return qp.attr

    @serialized
    def query_qp(self, h_qp: Any) -> QpAttr:
        return self._qp(h_qp).attr

    @serialized
    def destroy_qp(self, h_qp: Any, timewait_us: int = 0) -> None:
        qp = self._qp(h_qp)
        qp.alive = False
        del self.qps[qp.qp_num]
        qp.sq.clear()  # outstanding work never completes once destroy returns
        qp.rq.clear()
        qp.pd.users -= 1
        qp.send_cq.users -= 1
        qp.recv_cq.users -= 1
        loopback.run(self)  # a peer waiting on this QP now fails (retries exhausted)

    # ------------------------------------------------------------------------ CQ
    def _check_cq_size(self, size: int) -> None:
        if not 1 <= size <= self._attr.max_cqes:
            raise InvalidCqSize(f"CQ sizes go from 1 to {self._attr.max_cqes}")

    @serialized
    def create_cq(self, h_ca: Any, size: int, cq_context: Any) -> CqCreated:
        self._ca(h_ca)
        self._check_cq_size(size)
        self._limit(len(self._cqs), self._attr.max_cqs, "CQs")
        cq = Cq(self, size, cq_context)
        self._cqs.add(cq)
        return CqCreated(cq, cq.size)

    @serialized
    def resize_cq(self, h_cq: Any, size: int) -> int:
        cq = self._cq(h_cq)
        self._check_cq_size(size)
        if size < len(cq.entries):
            raise Overflow(f"the CQ holds {len(cq.entries)} completions")
        cq.size = size
        return cq.size

    @serialized
    def query_cq(self, h_cq: Any) -> int:
        return self._cq(h_cq).size

    @serialized
    def destroy_cq(self, h_cq: Any) -> None:
        cq = self._cq(h_cq)
        if cq.users:
            raise ResourceBusy(f"the CQ is used by {cq.users} QP queues")
        cq.alive = False
        self._cqs.remove(cq)

    # ------------------------------------------------------------------------ MR
    @serialized
    def register_mr(
        self, h_pd: Any, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        pd = self._pd(h_pd)
        if access & (AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC) and not (
            access & AccessFlags.LOCAL_WRITE
        ):
            raise InvalidPermission("remote write and atomic access need local write")
        try:
            view = memoryview(buffer).cast("B")
        except TypeError as exc:
            raise InvalidParameter(f"the buffer must be contiguous: {exc}") from None
        if view.readonly and access & (AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE):
            raise InvalidPermission("write access asked for a read-only buffer")
        if not 0 < len(view) <= self._attr.max_mr_size:
            raise InvalidParameter(f"regions hold 1 to {self._attr.max_mr_size} bytes")
        self._limit(len(self.keys), self._attr.max_mrs, "MRs")
        mr = Mr(self, pd, view, vaddr, access)
        self.keys.add(mr)
        pd.users += 1
        return MrKeys(mr, mr.lkey, mr.rkey, vaddr, mr.length)

    @serialized
    def query_mr(self, h_mr: Any) -> MrAttr:
        mr = self._mr(h_mr)
        last = mr.vaddr + mr.length - 1
        remote = (mr.vaddr, last) if mr.rkey else (0, 0)
        return MrAttr(mr.vaddr, last, *remote, access=mr.access, lkey=mr.lkey, rkey=mr.rkey)

    @serialized
    def deregister_mr(self, h_mr: Any) -> None:
        mr = self._mr(h_mr)
        self.keys.remove(mr)  # work that still names the keys fails with a protection error
        mr.alive = False
        mr.pd.users -= 1
        mr.view.release()  # let go of the consumer's buffer

    # ------------------------------------------------------------ post and poll
    @serialized
    def post_send(self, h_qp: Any, wrs: Sequence[SendWr]) -> None:
        qp = self._post_target(h_qp)
        try:
            for index, wr in enumerate(wrs):
                qp.sq.append(self._send_wqe(qp, wr, index))
        finally:
            loopback.run(self)  # what was posted before a bad WR runs all the same

    def _send_wqe(self, qp: Qp, wr: SendWr, index: int) -> SendWqe:
        """Check one send work request; a failure names it by ``index`` (``pp_failed``)."""

        def refuse(status: Status, why: str) -> PostError:
            return post_error(status, index, why)

        if not qp_fsm.can_post_send(qp.state):
            raise refuse(Status.INVALID_QP_STATE, f"sends are refused in {qp.state.name}")
        try:
            opcode = WrType(wr.opcode)
        except ValueError:
            raise refuse(Status.INVALID_WR_TYPE, f"unknown opcode {wr.opcode!r}") from None
        if opcode.is_atomic:
            raise refuse(Status.UNSUPPORTED, f"atomics: {CAPABILITIES.reason('atomics')}")
        if not CAPABILITIES.supports_opcode(qp.qp_type, opcode):
            raise refuse(Status.INVALID_WR_TYPE, f"no {opcode.name} on {qp.qp_type.name}")
        if wr.send_opt & SendOpt.IMMEDIATE and opcode is WrType.RDMA_READ:
            raise refuse(Status.INVALID_PARAMETER, "RDMA READ carries no immediate data")
        if wr.send_opt & SendOpt.INLINE:
            raise refuse(Status.UNSUPPORTED, f"inline_data: {CAPABILITIES.reason('inline_data')}")
        if len(wr.sg_list) > qp.attr.caps.sq_sge:
            raise refuse(Status.INVALID_MAX_SGE, f"the QP takes {qp.attr.caps.sq_sge} SGEs")
        av = None
        if qp.qp_type is QpType.UD:
            if wr.ud is None:
                raise refuse(Status.INVALID_PARAMETER, "a UD send needs its destination")
            av = wr.ud.av
            if not (isinstance(av, Av) and av.owner is self and av.alive and av.pd is qp.pd):
                raise refuse(Status.INVALID_AV_HANDLE, "not a live AV of the QP's PD")
        if len(qp.sq) >= qp.attr.caps.sq_depth:
            raise refuse(Status.INSUFFICIENT_RESOURCES, "the send queue is full")
        return SendWqe.from_wr(wr, av)

    @serialized
    def post_recv(self, h_qp: Any, wrs: Sequence[RecvWr]) -> None:
        qp = self._post_target(h_qp)
        try:
            for index, wr in enumerate(wrs):
                if not qp_fsm.can_post_recv(qp.state):
                    raise post_error(Status.INVALID_QP_STATE, index, "receives need INIT or later")
                if len(wr.sg_list) > qp.attr.caps.rq_sge:
                    raise post_error(Status.INVALID_MAX_SGE, index, "too many SGEs")
                if len(qp.rq) >= qp.attr.caps.rq_depth:
                    raise post_error(Status.INSUFFICIENT_RESOURCES, index, "the queue is full")
                qp.rq.append(RecvWqe.from_wr(wr))
        finally:
            loopback.run(self)  # a sender may have been waiting for a receive

    def _post_target(self, h_qp: Any) -> Qp:
        try:
            return self._qp(h_qp)
        except InvalidQpHandle as exc:
            raise post_error(Status.INVALID_QP_HANDLE, 0, exc.detail) from None

    @serialized
    def poll_cq(self, h_cq: Any, max_entries: int) -> list[Wc]:
        cq = self._cq(h_cq)
        if max_entries < 1:
            raise InvalidParameter("max_entries must be at least 1")
        return cq.poll(max_entries)

    @serialized
    def peek_cq(self, h_cq: Any) -> int:
        return len(self._cq(h_cq).entries)

    @serialized
    def enable_cq_notify(self, h_cq: Any, solicited: bool) -> None:
        self._cq(h_cq).arm(solicited)
