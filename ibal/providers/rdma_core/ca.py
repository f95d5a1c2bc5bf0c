"""One RDMA device (``ibv_context``) as an ibal :class:`ChannelInterface`.

Handles are small objects owned by this CA (``Pd``, ``Qp``, ...).  Every
verb checks that a handle is of the right kind, belongs to this CA and is
alive, and raises that kind's ``Invalid*Handle`` otherwise.

pyverbs cascades: closing a PD closes its QPs and MRs, closing a CQ closes the
QPs that use it.  The contract wants ``ResourceBusy`` instead, so the
dependencies are counted here and checked before anything is closed.

The verbs are split by responsibility: :mod:`.state` (shared state, handle
checks, ports, AV routing), :mod:`.cq_verbs`, :mod:`.qp_verbs`,
:mod:`.srq_verbs`, :mod:`.mr_verbs`, and :mod:`.quirks` for kernel rxe.
"""

from __future__ import annotations

import contextlib
import logging
from ipaddress import IPv6Address
from typing import Any

from ibal.ci.interface import (
    AsyncEventCallback,
    ChannelInterface,
    CompletionCallback,
    Handle,
    QpCreated,
)
from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core import counters, peek, umad
from ibal.providers.rdma_core.cq_verbs import CqVerbs
from ibal.providers.rdma_core.errors import translate
from ibal.providers.rdma_core.events import AsyncDispatch, EventLoop
from ibal.providers.rdma_core.handles import (
    Av,
    CaHandle,
    Mcast,
    Pd,
)
from ibal.providers.rdma_core.mr_verbs import MemoryVerbs
from ibal.providers.rdma_core.qp_verbs import QpVerbs
from ibal.providers.rdma_core.srq_verbs import SrqVerbs
from ibal.providers.rdma_core.state import CaState
from ibal.status import (
    InvalidGid,
    InvalidLid,
    InvalidMcastHandle,
    InvalidParameter,
    InvalidServiceType,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    AsyncEvent,
    AvAttr,
    CaAttr,
    EventRecord,
    Gid,
    LinkLayer,
    MadAgentSpec,
    NodeType,
    PdType,
    QpCaps,
    QpState,
    QpType,
)

log = logging.getLogger("ibal.providers.rdma_core")


def _bswap64(v: int) -> int:
    return int.from_bytes(v.to_bytes(8, "little"), "big")


class RdmaCoreCa(QpVerbs, SrqVerbs, CqVerbs, MemoryVerbs, CaState, umad.AgentVerbs,
                 ChannelInterface):
    """A device seen through pyverbs; see the module docstring.

    The verbs are grouped by responsibility: the CA itself, events, PDs, AVs,
    multicast and MAD agents here; CQs, QPs, SRQs and memory in their mixins.
    """

    provider_name = "rdma_core"

    # ------------------------------------------------------------ CA access
    def open_ca(
        self, completion_cb: CompletionCallback, async_event_cb: AsyncEventCallback, ca_context: Any
    ) -> Handle:
        if not callable(completion_cb) or not callable(async_event_cb):
            raise InvalidParameter("open_ca needs a completion and an async event callback")
        with self._lock:
            if self._open is not None:
                raise ResourceBusy(f"{self.name} is already open")
            h = CaHandle(self, completion_cb, async_event_cb, ca_context)
            loop = EventLoop(
                self.name, on_async=self._read_async, rdma_error=self._errs.PyverbsRDMAError
            )
            async_fd = None
            if self._async_ok and self.layout is not None:
                try:
                    async_fd = self.layout.async_fd(self.ctx)
                except peek.PeekError as exc:
                    self.notes.append(f"async events unavailable: {exc}")
            loop.start(async_fd)
            self._loop = loop
            self._open = h
            return h

    def query_ca(self, h_ca: Handle) -> CaAttr:
        self._ca(h_ca)
        return self.ca_attr()

    def ca_attr(self) -> CaAttr:
        """``CaAttr`` of the device (also used before open, e.g. by ``ibal info``)."""
        d = self.dev
        ports = tuple(self._port_attr(p) for p in range(1, int(d.phys_port_cnt) + 1))
        return CaAttr(
            ca_guid=self.guid,
            vendor_id=self.vendor_id,
            device_id=self.device_id,
            revision=self.revision,
            fw_version=str(d.fw_version),
            system_image_guid=_bswap64(int(d.sys_image_guid)),
            node_type=NodeType.CA,
            max_pds=int(d.max_pd),
            max_qps=int(d.max_qp),
            max_wrs=int(d.max_qp_wr),
            max_sges=int(d.max_sge),
            max_cqs=int(d.max_cq),
            max_cqes=int(d.max_cqe),
            max_srqs=int(d.max_srq),
            max_srq_wrs=int(d.max_srq_wr),
            max_srq_sges=int(d.max_srq_sge),
            max_avs=int(d.max_ah),
            max_mrs=int(d.max_mr),
            max_mws=int(d.max_mw),
            max_mr_size=int(d.max_mr_size),
            max_inline=self.max_inline(),
            max_qp_init_depth=int(d.max_qp_init_rd_atom),
            max_qp_resp_res=int(d.max_qp_rd_atom),
            max_mcast_grps=int(d.max_mcast_grp),
            max_qps_per_mcast_grp=int(d.max_mcast_qp_attach),
            page_size_cap=int(d.page_size_cap),
            atomicity=C.ATOMIC_FROM_IBV.get(int(d.atomic_caps), C.ATOMIC_FROM_IBV[0]),
            local_ack_delay=int(d.local_ca_ack_delay),
            has_local_sma=False,
            ports=ports,
        )

    def modify_ca(self, h_ca: Handle, port_num: int, ca_mod: Any, port_attr_mod: Any) -> None:
        self._ca(h_ca)
        self._port(port_num)
        raise Unsupported(self._caps.reason("modify_ca"))

    def close_ca(self, h_ca: Handle) -> None:
        h = self._ca(h_ca)
        with self._lock:
            if self._pds or self._cqs:
                raise ResourceBusy(
                    f"{len(self._pds)} PDs and {len(self._cqs)} CQs still allocated on {self.name}"
                )
            loop, self._loop = self._loop, None
            agents, self._umad = self._umad, None
            h.alive = False
            self._open = None
        if loop is not None:
            loop.stop()
        if agents is not None:
            agents.close()

    # --------------------------------------------------------- MAD agents
    def register_mad_agent(self, h_ca: Handle, spec: MadAgentSpec) -> Handle:
        """Over libibumad: the kernel's MAD layer routes (see :mod:`.umad`)."""
        self._ca(h_ca)
        if not self._caps.mad_agents:
            raise Unsupported(self._caps.reason("mad_agents"))
        if not isinstance(spec, MadAgentSpec):
            raise InvalidParameter("a MadAgentSpec is required")
        self._port(spec.port_num)
        with self._lock:
            if self._umad is None:
                self._umad = umad.UmadAgents(self.name)
            agents = self._umad
        return agents.register(spec)

    def _agent_table(self) -> umad.UmadAgents | None:
        return self._umad

    # ------------------------------------------------------------- events
    def _read_async(self) -> AsyncDispatch | None:
        """Read one async event (called by the loop under its lock)."""
        ev = self.ctx.get_async_event()
        ack = ev.ack
        etype = int(ev.event_type)
        h = self._open
        if h is None or self.layout is None:
            ack()
            return None
        element = self.layout.event_element(ev)
        code_kind = C.EVENT_FROM_IBV.get(etype)
        if code_kind is None:
            log.debug("rdma_core %s: async event %d ignored", self.name, etype)
            ack()
            return None
        code, kind = code_kind
        port = 0
        target: Any = h
        context = h.context
        if kind == C.EV_QP:
            target = self._qps.get(peek.qp_num_of(element)) if element else None
            if target is None or target.ptr not in (0, element):
                ack()
                return None
            context = target.context
            if code in (AsyncEvent.QP_FATAL, AsyncEvent.WQ_REQ_ERROR, AsyncEvent.WQ_ACCESS_ERROR):
                target.state = QpState.ERROR
        elif kind == C.EV_CQ:
            cid = peek.cq_context_of(element) if element else 0
            target = self._cqs.get(cid)
            if target is None:
                ack()
                return None
            context = target.context
        elif kind == C.EV_SRQ:
            target = self._srqs.get(element)
            if target is None:
                ack()
                return None
            context = target.context
        elif kind == C.EV_PORT:
            port = int(element) & 0xFF
            if code.name in ("GID_CHANGE", "PKEY_CHANGE", "LID_CHANGE", "PORT_ACTIVE"):
                self._ports.pop(port, None)
        if not target.alive:
            ack()
            return None
        record = EventRecord(code=code, context=context, vendor_specific=etype, port_num=port)
        cb = h.event_cb

        def upcall() -> None:
            cb(record)

        return target, upcall, ack

    # -------------------------------------------------------------- PD / AV
    def allocate_pd(self, h_ca: Handle, pd_type: PdType) -> Handle:
        self._ca(h_ca)
        with self._lock:
            try:
                pv = self.pv.pd.PD(self.ctx)
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_alloc_pd") from exc
            pd = Pd(self, pv, pd_type)
            self._pds.add(pd)
            self._n["pd"] += 1
            return pd

    def deallocate_pd(self, h_pd: Handle) -> None:
        pd = self._pd(h_pd)
        with self._lock:
            if pd.users:
                raise ResourceBusy(f"PD still used by {pd.users} QPs, SRQs, AVs, MRs or MWs")
            try:
                pd.pv.close()
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_dealloc_pd") from exc
            pd.alive = False
            self._pds.discard(pd)
            self._n["pd"] -= 1

    def _make_ah(self, pd: Pd, ah_attr: Any) -> Any:
        if ah_attr is None:
            return None
        try:
            return self.pv.addr.AH(pd.pv, attr=ah_attr)
        except self._errs.PyverbsError as exc:
            raise translate(exc, "ibv_create_ah") from exc

    def create_av(self, h_pd: Handle, attr: AvAttr) -> Handle:
        pd = self._pd(h_pd)
        ah_attr, attr = self._route(attr, lazy=True)
        with self._lock:
            pv = self._make_ah(pd, ah_attr)
            pd.users += 1
            self._n["av"] += 1
            return Av(self, pd, pv, attr, self._ah_ptr(pv, pd))

    def _ah_ptr(self, pv: Any, pd: Pd) -> int:
        if pv is None or self.ops is None or self.layout is None:
            return 0
        try:
            return self.layout.ah_ptr(pv, pd.pv, self.ctx)
        except peek.PeekError as exc:
            log.debug("rdma_core %s: AH pointer not found: %s", self.name, exc)
            return 0

    def query_av(self, h_av: Handle) -> AvAttr:
        return self._av(h_av).attr

    def modify_av(self, h_av: Handle, attr: AvAttr) -> None:
        av = self._av(h_av)
        ah_attr, attr = self._route(attr, lazy=True)
        with self._lock:
            pv = self._make_ah(av.pd, ah_attr)
            old, av.pv, av.attr = av.pv, pv, attr
            av.ptr = self._ah_ptr(pv, av.pd)
            if old is not None:
                with contextlib.suppress(self._errs.PyverbsError):
                    old.close()

    def destroy_av(self, h_av: Handle) -> None:
        av = self._av(h_av)
        with self._lock:
            if av.pv is not None:
                try:
                    av.pv.close()
                except self._errs.PyverbsError as exc:
                    raise translate(exc, "ibv_destroy_ah") from exc
            av.alive = False
            av.pd.users -= 1
            self._n["av"] -= 1

    # ------------------------------------------------------------ multicast
    def attach_mcast(self, h_qp: Handle, gid: Gid, lid: int) -> Handle:
        qp = self._qp(h_qp)
        if not self._caps.multicast or self._mcast_lib is None:
            raise Unsupported(self._caps.reason("multicast"))
        if qp.qp_type is not QpType.UD:
            raise InvalidServiceType("only UD QPs join multicast groups")
        try:
            raw = IPv6Address(gid).packed
        except ValueError as exc:
            raise InvalidGid(str(exc)) from exc
        port = self._port(qp.port_num or 1)
        v4_group = raw[:12] == bytes(10) + b"\xff\xff" and 224 <= raw[12] <= 239
        if raw[0] != 0xFF and not (port.link_layer is LinkLayer.ETHERNET and v4_group):
            raise InvalidGid(f"{gid} is not a multicast GID")
        in_range = 0xC000 <= lid <= 0xFFFE
        if port.link_layer is LinkLayer.INFINIBAND and not in_range:
            raise InvalidLid(f"LID {lid:#x} is not a multicast LID")
        if port.link_layer is LinkLayer.ETHERNET and lid and not in_range:
            raise InvalidLid(f"LID {lid:#x} is not a multicast LID (RoCE ignores the LID; pass 0)")
        if not qp.ptr:
            raise Unsupported("the QP's ibv_qp pointer is not reachable in this pyverbs")
        key = (raw, lid)
        with self._lock:
            if key not in qp.mcast:
                rc = self._mcast_lib.attach(qp.ptr, raw, lid)
                if rc:
                    raise translate(OSError(rc, "attach"), "ibv_attach_mcast")
                qp.mcast[key] = 0
                if port.link_layer is LinkLayer.ETHERNET and port.ifindex:
                    why = self._ip_groups.join(port.ifindex, raw)
                    if why is not None:
                        log.warning("rdma_core %s: %s; datagrams to %s may not arrive",
                                    self.name, why, IPv6Address(raw))  # fmt: skip
            qp.mcast[key] += 1
            return Mcast(self, qp, raw, lid, port.ifindex)

    def detach_mcast(self, h_mcast: Handle) -> None:
        if type(h_mcast) is not Mcast or h_mcast.ci is not self or not h_mcast.alive:
            raise InvalidMcastHandle("invalid or detached multicast attachment")
        m = h_mcast
        qp = m.qp
        key = (m.gid, m.lid)
        with self._lock:
            count = qp.mcast.get(key, 0)
            if count <= 1 and qp.alive and self._mcast_lib is not None:
                rc = self._mcast_lib.detach(qp.ptr, m.gid, m.lid)
                if rc:
                    raise translate(OSError(rc, "detach"), "ibv_detach_mcast")
                qp.mcast.pop(key, None)
                if m.ifindex:
                    self._ip_groups.leave(m.ifindex, m.gid)
            elif count > 1:
                qp.mcast[key] = count - 1
            m.alive = False

    # ------------------------------------------------------------ local MAD
    def local_mad(self, h_ca: Handle, port_num: int, mad: bytes) -> bytes:
        self._ca(h_ca)
        self._port(port_num)
        raise Unsupported(self._caps.reason("local_mad"))

    # ------------------------------------------------------------ counters
    def query_port_counters(self, h_ca: Handle, port_num: int) -> dict[str, int]:
        self._ca(h_ca)
        self._port(port_num)
        if not self._caps.port_counters:
            raise Unsupported(self._caps.reason("port_counters"))
        return counters.read(self.name, port_num)

    def create_spl_qp(
        self,
        h_pd: Handle,
        port_num: int,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: Handle,
        recv_cq: Handle,
        qp_context: Any,
    ) -> QpCreated:
        self._pd(h_pd)
        raise Unsupported(self._caps.reason("special_qps"))

    # ------------------------------------------------------------- details
    def resource_counts(self) -> dict[str, int]:
        """Live resources by kind (``pd``, ``cq``, ``qp``, ``srq``, ``av``, ``mr``, ``mw``)."""
        return dict(self._n)

    def describe(self) -> dict[str, Any]:
        """Facts for ``ibal info`` and the docs."""
        return {
            "name": self.name,
            "guid": f"{self.guid:016x}",
            "vendor_id": self.vendor_id,
            "device_id": self.device_id,
            "datapath": self.datapath,
            "notes": list(self.notes),
        }


__all__ = ["RdmaCoreCa"]
