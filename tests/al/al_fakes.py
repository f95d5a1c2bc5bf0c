"""A small, controllable ChannelInterface for the access layer's own tests.

It keeps every resource in dictionaries, enforces the contract's busy rules,
records every verb call (so tests can check what reached the provider and in
which order) and lets a test drive upcalls: completions on demand or from
inside ``post_send``, async events, port state changes.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ibal.ci import (
    Capabilities,
    ChannelInterface,
    CqCreated,
    MwCreated,
    Provider,
    QpCreated,
    SrqCreated,
)
from ibal.ci.provider import CaRegistrar
from ibal.status import (
    Error,
    InvalidAvHandle,
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidMcastHandle,
    InvalidMrHandle,
    InvalidMwHandle,
    InvalidPdHandle,
    InvalidQpHandle,
    InvalidSrqHandle,
    Overflow,
    ResourceBusy,
    Status,
    post_error,
)
from ibal.types import (
    WC_TYPE_FOR_WR,
    AccessFlags,
    AsyncEvent,
    AvAttr,
    BindWr,
    CaAttr,
    CaMod,
    CiOp,
    EventRecord,
    Gid,
    LinkLayer,
    LinkState,
    MrAttr,
    MrKeys,
    MrModMask,
    PdType,
    PhysCreate,
    PortAttr,
    PortAttrMod,
    QpAttr,
    QpCaps,
    QpMod,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    SrqAttr,
    SrqAttrMask,
    Wc,
    WcType,
)

_ids = itertools.count(1)


@dataclass(eq=False)
class H:
    """A provider handle: kind, id, liveness and whatever the verb keeps."""

    kind: str
    id: int = field(default_factory=lambda: next(_ids))
    alive: bool = True
    data: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"{self.kind}#{self.id}"


_ERR = {
    "ca": InvalidCaHandle,
    "pd": InvalidPdHandle,
    "av": InvalidAvHandle,
    "cq": InvalidCqHandle,
    "qp": InvalidQpHandle,
    "srq": InvalidSrqHandle,
    "mr": InvalidMrHandle,
    "mw": InvalidMwHandle,
    "mcast": InvalidMcastHandle,
}


def default_attr(guid: int, ports: int = 2) -> CaAttr:
    return CaAttr(
        ca_guid=guid,
        max_pds=64,
        max_qps=64,
        max_wrs=256,
        max_sges=4,
        max_cqs=64,
        max_cqes=1024,
        max_srqs=8,
        max_srq_wrs=256,
        max_srq_sges=4,
        max_mrs=64,
        max_mws=64,
        ports=tuple(
            PortAttr(
                port_num=n,
                port_guid=guid + n,
                lid=n,
                link_state=LinkState.ACTIVE,
                gids=(Gid(f"fe80::{guid:x}:{n}"),),
                pkeys=(0xFFFF, 0x8001),
            )
            for n in range(1, ports + 1)
        ),
    )


class FakeCi(ChannelInterface):
    """One fake CA."""

    def __init__(self, guid: int, name: str = "fake0", ports: int = 2, **caps: Any) -> None:
        self.guid = guid
        self.name = name
        self.provider_name = "fake"
        full: dict[str, Any] = {
            "special_qps": frozenset({QpType.QP0, QpType.QP1}),
            "phys_mr": True,
            "shared_mr": True,
            "vendor_call": True,
            "local_mad": True,
        }
        self._caps = Capabilities(**(full | caps))
        self.attr = default_attr(guid, ports)
        self.lock = threading.RLock()
        self.calls: list[tuple[str, Any]] = []
        self.live: dict[int, H] = {}
        self.ca: H | None = None
        self.comp_cb: Callable[[Any], None] | None = None
        self.event_cb: Callable[[EventRecord], None] | None = None
        self.ca_context: Any = None
        self.fail_next: dict[str, Exception] = {}  # verb name -> exception to raise once
        self.loopback = True  # post_send completes each signaled WR at once

    # ------------------------------------------------------------------ helpers
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def _call(self, verb: str, *args: Any) -> None:
        with self.lock:
            self.calls.append((verb, args))
            exc = self.fail_next.pop(verb, None)
        if exc is not None:
            raise exc

    def _new(self, kind: str, **data: Any) -> H:
        h = H(kind, data=data)
        with self.lock:
            self.live[h.id] = h
        return h

    def _get(self, h: Any, kind: str) -> H:
        if not isinstance(h, H) or h.kind != kind or not h.alive or self.live.get(h.id) is not h:
            raise _ERR[kind](f"fake: bad {kind} handle {h!r}")
        return h

    def _kill(self, h: H) -> None:
        with self.lock:
            h.alive = False
            self.live.pop(h.id, None)

    def _users(self, h: H, kind: str, key: str) -> list[H]:
        return [o for o in self.live.values() if o.kind == kind and o.data.get(key) is h]

    def live_kinds(self) -> list[str]:
        with self.lock:
            return sorted(h.kind for h in self.live.values())

    def verbs(self) -> list[str]:
        with self.lock:
            return [v for v, _ in self.calls]

    # ------------------------------------------------------------------ CA
    def open_ca(self, completion_cb: Any, async_event_cb: Any, ca_context: Any) -> H:
        self._call("open_ca")
        if self.ca is not None:
            raise ResourceBusy("fake: already open")
        self.comp_cb, self.event_cb, self.ca_context = completion_cb, async_event_cb, ca_context
        self.ca = H("ca")
        return self.ca

    def query_ca(self, h_ca: Any) -> CaAttr:
        self._call("query_ca")
        if h_ca is not self.ca or self.ca is None:
            raise InvalidCaHandle("fake")
        return self.attr

    def modify_ca(
        self, h_ca: Any, port_num: int, ca_mod: CaMod, port_attr_mod: PortAttrMod
    ) -> None:
        self._call("modify_ca", port_num, ca_mod)

    def close_ca(self, h_ca: Any) -> None:
        self._call("close_ca")
        if h_ca is not self.ca or self.ca is None:
            raise InvalidCaHandle("fake")
        if self.live:
            raise ResourceBusy(f"fake: still live: {self.live_kinds()}")
        self.ca = None
        self.comp_cb = self.event_cb = None

    def vendor_call(self, h_ca: Any, handles: Sequence[Any], op: CiOp) -> CiOp:
        self._call("vendor_call", tuple(handles))
        if op.command == 0xBAD:
            op.status = 7
            raise Error("fake: vendor failure")
        op.out = bytes(len(handles))
        return op

    def local_mad(self, h_ca: Any, port_num: int, mad: bytes) -> bytes:
        self._call("local_mad", port_num)
        return bytes(reversed(mad))

    # ------------------------------------------------------------------ PD / AV
    def allocate_pd(self, h_ca: Any, pd_type: PdType) -> H:
        self._call("allocate_pd", pd_type)
        return self._new("pd")

    def deallocate_pd(self, h_pd: Any) -> None:
        self._call("deallocate_pd", h_pd)
        pd = self._get(h_pd, "pd")
        users = [o for o in self.live.values() if o.data.get("pd") is pd]
        if users:
            raise ResourceBusy(f"fake: PD used by {users}")
        self._kill(pd)

    def create_av(self, h_pd: Any, attr: AvAttr) -> H:
        self._call("create_av")
        return self._new("av", pd=self._get(h_pd, "pd"), attr=attr)

    def query_av(self, h_av: Any) -> AvAttr:
        self._call("query_av")
        attr: AvAttr = self._get(h_av, "av").data["attr"]
        return attr

    def modify_av(self, h_av: Any, attr: AvAttr) -> None:
        self._call("modify_av")
        self._get(h_av, "av").data["attr"] = attr

    def destroy_av(self, h_av: Any) -> None:
        self._call("destroy_av", h_av)
        self._kill(self._get(h_av, "av"))

    # ------------------------------------------------------------------ QP
    def create_qp(
        self, h_pd: Any, qp_type: QpType, caps: QpCaps, send_cq: Any, recv_cq: Any,
        srq: Any, sq_signaled: bool, qp_context: Any,
    ) -> QpCreated:
        self._call("create_qp", qp_type)
        pd = self._get(h_pd, "pd")
        scq, rcq = self._get(send_cq, "cq"), self._get(recv_cq, "cq")
        s = self._get(srq, "srq") if srq is not None else None
        h = self._new("qp", pd=pd, scq=scq, rcq=rcq, srq=s, ctx=qp_context, type=qp_type)
        attr = QpAttr(qp_type=qp_type, qp_num=h.id, caps=caps)
        h.data["attr"] = attr
        return QpCreated(h, attr)

    def create_spl_qp(
        self, h_pd: Any, port_num: int, qp_type: QpType, caps: QpCaps, send_cq: Any,
        recv_cq: Any, qp_context: Any,
    ) -> QpCreated:
        self._call("create_spl_qp", qp_type, port_num)
        pd = self._get(h_pd, "pd")
        for o in self.live.values():
            if o.kind == "qp" and o.data.get("type") is qp_type and o.data.get("port") == port_num:
                raise ResourceBusy("fake: special QP exists")
        scq, rcq = self._get(send_cq, "cq"), self._get(recv_cq, "cq")
        h = self._new("qp", pd=pd, scq=scq, rcq=rcq, srq=None, ctx=qp_context, type=qp_type,
                      port=port_num)
        attr = QpAttr(qp_type=qp_type, qp_num=0 if qp_type is QpType.QP0 else 1, caps=caps)
        h.data["attr"] = attr
        return QpCreated(h, attr)

    def modify_qp(self, h_qp: Any, mod: QpMod) -> QpAttr:
        self._call("modify_qp", mod.state)
        qp = self._get(h_qp, "qp")
        qp.data["mod"] = mod
        attr: QpAttr = replace(qp.data["attr"], state=mod.state)
        qp.data["attr"] = attr
        return attr

    def query_qp(self, h_qp: Any) -> QpAttr:
        self._call("query_qp")
        attr: QpAttr = self._get(h_qp, "qp").data["attr"]
        return attr

    def destroy_qp(self, h_qp: Any, timewait_us: int = 0) -> None:
        self._call("destroy_qp", h_qp)
        qp = self._get(h_qp, "qp")
        if self._users(qp, "mcast", "qp"):
            raise ResourceBusy("fake: QP still attached to multicast groups")
        self._kill(qp)

    # ------------------------------------------------------------------ SRQ
    def create_srq(self, h_pd: Any, attr: SrqAttr, srq_context: Any) -> SrqCreated:
        self._call("create_srq")
        h = self._new("srq", pd=self._get(h_pd, "pd"), attr=attr, ctx=srq_context)
        return SrqCreated(h, attr)

    def modify_srq(self, h_srq: Any, attr: SrqAttr, mask: SrqAttrMask) -> None:
        self._call("modify_srq", mask)
        self._get(h_srq, "srq").data["attr"] = attr

    def query_srq(self, h_srq: Any) -> SrqAttr:
        self._call("query_srq")
        attr: SrqAttr = self._get(h_srq, "srq").data["attr"]
        return attr

    def destroy_srq(self, h_srq: Any) -> None:
        self._call("destroy_srq", h_srq)
        srq = self._get(h_srq, "srq")
        if self._users(srq, "qp", "srq"):
            raise ResourceBusy("fake: SRQ in use")
        self._kill(srq)

    def post_srq_recv(self, h_srq: Any, wrs: Sequence[RecvWr]) -> None:
        self._call("post_srq_recv", len(wrs))
        self._get(h_srq, "srq").data.setdefault("recvs", []).extend(wrs)

    # ------------------------------------------------------------------ CQ
    def create_cq(self, h_ca: Any, size: int, cq_context: Any) -> CqCreated:
        self._call("create_cq", size)
        h = self._new("cq", ctx=cq_context, size=size, wcs=[], armed=0)
        return CqCreated(h, size)

    def resize_cq(self, h_cq: Any, size: int) -> int:
        self._call("resize_cq", size)
        cq = self._get(h_cq, "cq")
        if size < len(cq.data["wcs"]):
            raise Overflow("fake: more entries than that")
        cq.data["size"] = size
        return size

    def query_cq(self, h_cq: Any) -> int:
        self._call("query_cq")
        size: int = self._get(h_cq, "cq").data["size"]
        return size

    def destroy_cq(self, h_cq: Any) -> None:
        self._call("destroy_cq", h_cq)
        cq = self._get(h_cq, "cq")
        if self._users(cq, "qp", "scq") or self._users(cq, "qp", "rcq"):
            raise ResourceBusy("fake: CQ in use")
        self._kill(cq)

    def poll_cq(self, h_cq: Any, max_entries: int) -> list[Wc]:
        cq = self._get(h_cq, "cq")
        with self.lock:
            wcs: list[Wc] = cq.data["wcs"]
            out, cq.data["wcs"] = wcs[:max_entries], wcs[max_entries:]
        return out

    def peek_cq(self, h_cq: Any) -> int:
        return len(self._get(h_cq, "cq").data["wcs"])

    def enable_cq_notify(self, h_cq: Any, solicited: bool) -> None:
        self._get(h_cq, "cq").data["armed"] = 1

    def enable_ncomp_cq_notify(self, h_cq: Any, n_cqes: int) -> None:
        self._get(h_cq, "cq").data["armed"] = n_cqes

    def complete(self, h_cq: Any, wc: Wc) -> None:
        """Add a completion; upcall if armed (from the calling thread, like hardware)."""
        cq = self._get(h_cq, "cq")
        fire = False
        with self.lock:
            cq.data["wcs"].append(wc)
            if cq.data["armed"]:
                cq.data["armed"] -= 1
                fire = cq.data["armed"] == 0
        if fire and self.comp_cb is not None:
            self.comp_cb(cq.data["ctx"])

    # ------------------------------------------------------------------ MR / MW
    def _keys(self, h: H, vaddr: int, length: int, access: AccessFlags) -> MrKeys:
        h.data.update(vaddr=vaddr, length=length, access=access)
        return MrKeys(h, h.id << 8 | 1, h.id << 8 | 2, vaddr, length)

    def register_mr(self, h_pd: Any, buffer: memoryview, vaddr: int, access: AccessFlags) -> MrKeys:
        self._call("register_mr", vaddr, len(buffer))
        h = self._new("mr", pd=self._get(h_pd, "pd"), buffer=buffer)
        return self._keys(h, vaddr, len(buffer), access)

    def register_pmr(self, h_pd: Any, create: PhysCreate, vaddr: int) -> MrKeys:
        self._call("register_pmr", vaddr)
        h = self._new("mr", pd=self._get(h_pd, "pd"))
        return self._keys(h, vaddr or 0x10000, create.length, create.access)

    def query_mr(self, h_mr: Any) -> MrAttr:
        self._call("query_mr")
        mr = self._get(h_mr, "mr")
        lo = mr.data["vaddr"]
        return MrAttr(lo, lo + mr.data["length"], lo, lo + mr.data["length"], mr.data["access"],
                      mr.id << 8 | 1, mr.id << 8 | 2)

    def modify_mr(
        self, h_mr: Any, mask: MrModMask, buffer: memoryview | None, vaddr: int | None,
        access: AccessFlags | None, h_pd: Any | None,
    ) -> MrKeys:
        self._call("modify_mr", mask)
        mr = self._get(h_mr, "mr")
        if self._users(mr, "mw", "mr"):
            raise ResourceBusy("fake: windows bound")
        if h_pd is not None:
            mr.data["pd"] = self._get(h_pd, "pd")
        return self._keys(
            mr,
            vaddr if vaddr is not None else mr.data["vaddr"],
            len(buffer) if buffer is not None else mr.data["length"],
            access if access is not None else mr.data["access"],
        )

    def register_smr(self, h_mr: Any, h_pd: Any, access: AccessFlags, vaddr: int) -> MrKeys:
        self._call("register_smr")
        src = self._get(h_mr, "mr")
        h = self._new("mr", pd=self._get(h_pd, "pd"), src=src)
        return self._keys(h, vaddr or src.data["vaddr"], src.data["length"], access)

    def deregister_mr(self, h_mr: Any) -> None:
        self._call("deregister_mr", h_mr)
        mr = self._get(h_mr, "mr")
        if self._users(mr, "mw", "mr") or self._users(mr, "mr", "src"):
            raise ResourceBusy("fake: windows bound or shared regions")
        self._kill(mr)

    def create_mw(self, h_pd: Any, mw_type: int = 1) -> MwCreated:
        self._call("create_mw", mw_type)
        h = self._new("mw", pd=self._get(h_pd, "pd"), mr=None, mw_type=mw_type)
        return MwCreated(h, h.id << 8 | 3)

    def query_mw(self, h_mw: Any) -> int:
        mw = self._get(h_mw, "mw")
        return mw.id << 8 | (4 if mw.data["mr"] is not None else 3)

    def bind_mw(self, h_mw: Any, h_qp: Any, bind: BindWr) -> int:
        self._call("bind_mw", bind.length)
        mw = self._get(h_mw, "mw")
        self._get(h_qp, "qp")
        mw.data["mr"] = self._get(bind.mr, "mr") if bind.length else None
        return self.query_mw(h_mw)

    def destroy_mw(self, h_mw: Any) -> None:
        self._call("destroy_mw", h_mw)
        self._kill(self._get(h_mw, "mw"))

    # ------------------------------------------------------------------ posting
    def post_send(self, h_qp: Any, wrs: Sequence[SendWr]) -> None:
        qp = self._get(h_qp, "qp")
        for i, wr in enumerate(wrs):
            if wr.ud is not None and not (isinstance(wr.ud.av, H) and wr.ud.av.alive):
                raise post_error(Status.INVALID_AV_HANDLE, i, "fake: not a provider AV")
            qp.data.setdefault("sent", []).append(wr)
            if self.loopback and wr.send_opt & SendOpt.SIGNALED:
                self.complete(qp.data["scq"], Wc(wr.wr_id, WC_TYPE_FOR_WR[wr.opcode]))

    def post_recv(self, h_qp: Any, wrs: Sequence[RecvWr]) -> None:
        self._get(h_qp, "qp").data.setdefault("recvs", []).extend(wrs)

    # ------------------------------------------------------------------ multicast
    def attach_mcast(self, h_qp: Any, gid: Gid, lid: int) -> H:
        self._call("attach_mcast", gid, lid)
        return self._new("mcast", qp=self._get(h_qp, "qp"), gid=gid)

    def detach_mcast(self, h_mcast: Any) -> None:
        self._call("detach_mcast", h_mcast)
        self._kill(self._get(h_mcast, "mcast"))

    # ------------------------------------------------------------------ test drivers
    def raise_event(self, code: AsyncEvent, context: Any = None, port_num: int = 0) -> None:
        """An async event upcall, as the hardware would make it."""
        assert self.event_cb is not None
        ctx = self.ca_context if context is None else context
        self.event_cb(EventRecord(code, ctx, vendor_specific=code.value, port_num=port_num))

    def qp_event(self, qp_handle: Any, code: AsyncEvent = AsyncEvent.QP_FATAL) -> None:
        self.raise_event(code, self._get(qp_handle, "qp").data["ctx"])

    def set_port_state(self, port_num: int, state: LinkState) -> None:
        ports = tuple(
            replace(p, link_state=state) if p.port_num == port_num else p for p in self.attr.ports
        )
        self.attr = replace(self.attr, ports=ports)
        code = AsyncEvent.PORT_ACTIVE if state is LinkState.ACTIVE else AsyncEvent.PORT_DOWN
        self.raise_event(code, port_num=port_num)


class FakeProvider(Provider):
    """Registers ``n`` fake CAs; ``stop`` withdraws them."""

    name = "fake"

    def __init__(self, n: int = 1, base_guid: int = 0x1000, **caps: Any) -> None:
        self.cis = [FakeCi(base_guid + 0x100 * i, f"fake{i}", **caps) for i in range(n)]
        self.registrar: CaRegistrar | None = None

    def start(self, registrar: CaRegistrar) -> None:
        self.registrar = registrar
        for ci in self.cis:
            registrar.register_ca(ci)

    def stop(self) -> None:
        if self.registrar is None:
            return
        for ci in self.cis:
            if ci.ca is not None:
                self.registrar.deregister_ca(ci.guid)
        self.registrar = None


__all__ = ["FakeCi", "FakeProvider", "H", "LinkLayer", "WcType"]
