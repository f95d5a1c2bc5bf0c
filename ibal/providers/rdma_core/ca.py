"""One RDMA device (``ibv_context``) as an ibal :class:`ChannelInterface`.

Handles are small objects owned by this CA (``Pd``, ``Qp``, ...).  Every
verb checks that a handle is of the right kind, belongs to this CA and is
alive, and raises that kind's ``Invalid*Handle`` otherwise.

pyverbs cascades: closing a PD closes its QPs and MRs, closing a CQ closes the
QPs that use it.  The contract wants ``ResourceBusy`` instead, so the
dependencies are counted here and checked before anything is closed.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import logging
import os
import socket
import threading
from collections.abc import Sequence
from ipaddress import IPv6Address
from typing import Any

from ibal.ci.interface import (
    AsyncEventCallback,
    Capabilities,
    ChannelInterface,
    CompletionCallback,
    CqCreated,
    Handle,
    MwCreated,
    QpCreated,
    SrqCreated,
)
from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core import peek, umad
from ibal.providers.rdma_core.caps import build_capabilities, is_rxe
from ibal.providers.rdma_core.errors import translate
from ibal.providers.rdma_core.events import AsyncDispatch, EventLoop
from ibal.providers.rdma_core.fastpath import (
    DATAPATH_ENV,
    FastPoller,
    FastRecvQueue,
    FastSendQueue,
    Ops,
    OpsUnavailable,
    wc_tuples_from_pyverbs,
)
from ibal.providers.rdma_core.handles import (
    ZERO_GID,
    Av,
    CaHandle,
    Cq,
    Mcast,
    Mr,
    Mw,
    Pd,
    PortInfo,
    Qp,
    Srq,
)
from ibal.providers.rdma_core.ipmcast import IpMemberships
from ibal.providers.rdma_core.nethdr import ReceiveAreas, classify
from ibal.providers.rdma_core.wr import (
    Held,
    PyverbsApi,
    RecvQueue,
    RecvTokens,
    SendQueue,
    SqAccount,
    convert_wcs,
    flush_tuples,
)
from ibal.qp_fsm import can_post_recv, sends_execute
from ibal.status import (
    IbError,
    InsufficientResources,
    InvalidAvHandle,
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidCqSize,
    InvalidGid,
    InvalidHandle,
    InvalidLid,
    InvalidMaxSge,
    InvalidMaxWrs,
    InvalidMcastHandle,
    InvalidMrHandle,
    InvalidMwHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPermission,
    InvalidPkey,
    InvalidPort,
    InvalidQpHandle,
    InvalidQpState,
    InvalidRkey,
    InvalidServiceType,
    InvalidSetting,
    InvalidSrqHandle,
    InvalidSrqSize,
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
    AvAttr,
    BindWr,
    CaAttr,
    EventRecord,
    Gid,
    GidEntry,
    GidType,
    Grh,
    LinkLayer,
    MadAgentSpec,
    MadSend,
    MrAttr,
    MrKeys,
    MrModMask,
    NetworkHeader,
    NodeType,
    PdType,
    PortAttr,
    PortCap,
    QpAttr,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvOpt,
    RecvWr,
    SendOpt,
    SendWr,
    SrqAttr,
    SrqAttrMask,
    Wc,
    WcStatus,
    WcType,
)

log = logging.getLogger("ibal.providers.rdma_core")

_PSN_MASK = 0xFFFFFF
_WRITE_ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC
_BIND_ACCESS = AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC
_INLINE_PROBES = (1024, 512, 400, 256, 128, 64, 32)


def _bswap64(v: int) -> int:
    return int.from_bytes(v.to_bytes(8, "little"), "big")


# ------------------------------------------------------------------ handles


class RdmaCoreCa(ChannelInterface):
    """A device seen through pyverbs; see the module docstring."""

    provider_name = "rdma_core"

    def __init__(self, pv: Any, name: str, guid: int, *, layout: peek.Layout | None) -> None:
        self.pv = pv
        self.name = name
        self.guid = guid
        self.layout = layout
        self._errs = pv.pyverbs_error
        self.api = PyverbsApi(
            pv.wr.SendWR,
            pv.wr.SGE,
            pv.wr.RecvWR,
            self._errs.PyverbsRDMAError,
            adopt_sge=layout.adopt_sge if layout is not None else None,
            free=peek.libc_free,
        )
        self.ctx = pv.device.Context(name=name)
        try:
            self._setup()
        except BaseException:
            self.ctx.close()
            raise

    def _setup(self) -> None:
        pv, layout = self.pv, self.layout
        self.dev = self.ctx.query_device()
        self.vendor_id = int(self.dev.vendor_id)
        self.device_id = int(self.dev.vendor_part_id)
        self.revision = int(self.dev.hw_ver)
        self._lock = threading.RLock()
        self._open: CaHandle | None = None
        self._loop: EventLoop | None = None
        self._pds: set[Pd] = set()
        self._cqs: dict[int, Cq] = {}
        self._qps: dict[int, Qp] = {}
        self._srqs: dict[int, Srq] = {}
        self._ud_qpns: set[int] = set()
        self._areas = ReceiveAreas()
        self._errored: set[int] = set()  # QPs with an error completion since the last look
        self._sq_accts: dict[int, SqAccount] = {}
        self.tokens = RecvTokens()
        self._ports: dict[int, PortInfo] = {}
        self._max_inline: int | None = None
        self._gid_total = 0
        self._n = dict.fromkeys(("pd", "cq", "qp", "srq", "av", "mr", "mw"), 0)
        self._mcast_lib: peek.Multicast | None = None
        self._ip_groups = IpMemberships()
        self.notes: list[str] = []
        self._async_ok = False
        if layout is not None:
            try:
                layout.check_async_event(pv.device.AsyncEvent)
                layout.async_fd(self.ctx)
                self._async_ok = True
            except peek.PeekError as exc:
                self.notes.append(f"async events unavailable: {exc}")
        else:
            self.notes.append("async events unavailable: pyverbs layout not recognised")
        self._umad: umad.UmadAgents | None = None
        self._caps = build_capabilities(
            self.dev,
            self._port_link_layers(),
            self._multicast_reason(),
            self.name,
            umad.availability(self.name),
        )
        self.rxe = is_rxe(self.dev, self.name)
        """Kernel rxe: its workarounds (SQD hold, ERROR re-entry) apply to it only."""
        self.ops: Ops | None = self._load_ops()
        self.datapath = "ctypes" if self.ops is not None else "pyverbs"

    # ---------------------------------------------------------- identity
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def _port_link_layers(self) -> dict[int, int]:
        out = {}
        self._gid_total = 0
        for p in range(1, int(self.dev.phys_port_cnt) + 1):
            try:
                pa = self.ctx.query_port(p)
                out[p] = int(pa.link_layer)
                self._gid_total += int(pa.gid_tbl_len)
            except self._errs.PyverbsError:
                out[p] = 0
        return out

    def _load_ops(self) -> Ops | None:
        """libibverbs' data-path slots, validated (see fastpath.py), or None."""
        mode = os.environ.get(DATAPATH_ENV, "auto").strip().lower() or "auto"
        if mode not in ("auto", "ctypes", "pyverbs"):
            raise ValueError(f"{DATAPATH_ENV}={mode!r}: expected auto, ctypes or pyverbs")
        if mode == "pyverbs":
            self.notes.append(f"data path: pyverbs ({DATAPATH_ENV}=pyverbs)")
            return None
        why = ""
        ops = None
        if self.layout is None:
            why = "pyverbs layout not recognised"
        else:
            try:
                ops = Ops(self.layout.context_ptr(self.ctx))
                cq = self.pv.cq.CQ(self.ctx, 1, None, None, 0)
                try:
                    ops.check_poll(self.layout.cq_ptr(cq, self.ctx))
                finally:
                    cq.close()
            except (OpsUnavailable, peek.PeekError, self._errs.PyverbsError) as exc:
                why = str(exc)
                ops = None
        if ops is None:
            if mode == "ctypes":
                raise OpsUnavailable(
                    f"{DATAPATH_ENV}=ctypes but the dispatch table is unusable: {why}"
                )
            self.notes.append(f"data path: pyverbs (ctypes path unavailable: {why})")
        return ops

    def _multicast_reason(self) -> str | None:
        if self.layout is None:
            return "the ibv_qp pointer ibv_attach_mcast needs is not reachable in this pyverbs"
        try:
            self._mcast_lib = peek.Multicast()
        except (OSError, AttributeError) as exc:
            return f"libibverbs.so.1 not loadable through ctypes: {exc}"
        return None

    def release(self) -> None:
        """Close the device (provider stop): stops events, pyverbs closes the rest."""
        with self._lock:
            loop, self._loop = self._loop, None
            if self._open is not None:
                self._open.alive = False
                self._open = None
        if loop is not None:
            loop.stop()
        self._ip_groups.close()
        with contextlib.suppress(Exception):
            self.ctx.close()

    # ---------------------------------------------------------- checks
    def _ca(self, h: Handle) -> CaHandle:
        if type(h) is not CaHandle or h.ci is not self or not h.alive:
            raise InvalidCaHandle("not an open CA handle of this device")
        return h

    def _pd(self, h: Handle) -> Pd:
        if type(h) is not Pd or h.ci is not self or not h.alive:
            raise InvalidPdHandle("invalid or deallocated PD")
        return h

    def _av(self, h: Handle) -> Av:
        if type(h) is not Av or h.ci is not self or not h.alive:
            raise InvalidAvHandle("invalid or destroyed AV")
        return h

    def _cq(self, h: Handle) -> Cq:
        if type(h) is not Cq or h.ci is not self or not h.alive:
            raise InvalidCqHandle("invalid or destroyed CQ")
        return h

    def _qp(self, h: Handle) -> Qp:
        if type(h) is not Qp or h.ci is not self or not h.alive:
            raise InvalidQpHandle("invalid or destroyed QP")
        return h

    def _srq(self, h: Handle) -> Srq:
        if type(h) is not Srq or h.ci is not self or not h.alive:
            raise InvalidSrqHandle("invalid or destroyed SRQ")
        return h

    def _mr(self, h: Handle) -> Mr:
        if type(h) is not Mr or h.ci is not self or not h.alive:
            raise InvalidMrHandle("invalid or deregistered MR")
        return h

    def _mw(self, h: Handle) -> Mw:
        if type(h) is not Mw or h.ci is not self or not h.alive:
            raise InvalidMwHandle("invalid or destroyed MW")
        return h

    def _ah_of(self, av: Any) -> Any:
        """The AV's pyverbs AH; None when invalid, destroyed, or a RoCE AV without GRH."""
        if type(av) is Av and av.ci is self and av.alive:
            return av.pv
        return None

    def _ah_ptr_of(self, av: Any) -> int:
        if type(av) is Av and av.ci is self and av.alive:
            return av.ptr
        return 0

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

    def _gid_table(
        self, port_num: int, length: int
    ) -> tuple[list[Gid | None], list[int], int, dict[int, str]]:
        """The port's GIDs by index (None for holes), their types, netdev and netdev names."""
        gids: list[Gid | None] = []
        types: list[int] = []
        names: dict[int, str] = {}
        ifindex = 0
        try:
            # The kernel refuses more entries than the device's GID tables hold.
            total = self._gid_total or length
            entries = [e for e in self.ctx.query_gid_table(total) if e.port_num == port_num]
            for e in entries:
                i = int(e.gid_index)
                while len(gids) <= i:
                    gids.append(None)
                    types.append(0)
                gids[i] = IPv6Address(e.gid_str())
                types[i] = int(e.gid_type)
                ifx = int(e.ndev_ifindex)
                ifindex = ifindex or ifx
                names[i] = self._netdev(port_num, i, ifx)
            return gids, types, ifindex, names
        except self._errs.PyverbsError:
            pass
        # Older kernels without the GID table ioctl: one query per index.
        for i in range(length):
            try:
                g = IPv6Address(self.ctx.query_gid(port_num, i).gid)
            except self._errs.PyverbsError:
                g = None
            if g == ZERO_GID:
                g = None
            gids.append(g)
            t = C.IBV_GID_TYPE_IB
            if g is not None:
                with contextlib.suppress(self._errs.PyverbsError):
                    t = (
                        C.IBV_GID_TYPE_ROCE_V2
                        if int(self.ctx.query_gid_type(port_num, i)) == 1
                        else C.IBV_GID_TYPE_ROCE_V1
                    )
            types.append(t)
        while gids and gids[-1] is None:
            gids.pop()
            types.pop()
        names = {i: self._netdev(port_num, i, 0) for i, g in enumerate(gids) if g is not None}
        return gids, types, 0, names

    def _netdev(self, port_num: int, index: int, ifindex: int) -> str:
        """The network device a RoCE GID lives on ("" for none or unknown)."""
        if ifindex:
            with contextlib.suppress(OSError):
                return socket.if_indextoname(ifindex)
        path = f"/sys/class/infiniband/{self.name}/ports/{port_num}/gid_attrs/ndevs/{index}"
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:  # no netdev (InfiniBand) or no sysfs
            return ""

    @staticmethod
    def _gid_entries(
        ll: LinkLayer, gids: list[Gid | None], types: list[int], names: dict[int, str]
    ) -> tuple[GidEntry, ...]:
        out = []
        for i, g in enumerate(gids):
            if g is None or g == ZERO_GID:
                continue
            t = C.GID_TYPE_FROM_IBV.get(types[i], GidType.IB)
            if t is GidType.IB and ll is LinkLayer.ETHERNET:
                t = GidType.ROCE_V1  # the kernel's "IB/RoCE v1" on an Ethernet port
            out.append(GidEntry(i, g, t, names.get(i, "") if ll is LinkLayer.ETHERNET else ""))
        return tuple(out)

    def _port_attr(self, port_num: int) -> PortAttr:
        pa = self.ctx.query_port(port_num)
        ll = C.LINK_LAYER_FROM_IBV.get(int(pa.link_layer), LinkLayer.INFINIBAND)
        gids, types, ifindex, names = self._gid_table(port_num, int(pa.gid_tbl_len))
        pkeys = []
        for i in range(int(pa.pkey_tbl_len)):
            try:
                pkeys.append(int(self.ctx.query_pkey(port_num, i)))
            except self._errs.PyverbsError:
                pkeys.append(0)
        table = self._gid_entries(ll, gids, types, names)
        v2 = frozenset(e.gid.packed for e in table if e.gid_type is GidType.ROCE_V2)
        self._ports[port_num] = PortInfo(ll, gids, types, tuple(pkeys), ifindex, v2)
        g0 = gids[0] if gids and gids[0] is not None else None
        port_guid = int(g0) & 0xFFFF_FFFF_FFFF_FFFF if g0 is not None else self.guid
        mtu_max = C.mtu_from_ibv(int(pa.max_mtu))
        mtu_act = C.mtu_from_ibv(int(pa.active_mtu))
        kw: dict[str, Any] = {}
        if mtu_max is not None:
            kw["max_mtu"] = mtu_max
        if mtu_act is not None:
            kw["active_mtu"] = mtu_act
        return PortAttr(
            port_num=port_num,
            port_guid=port_guid,
            lid=int(pa.lid),
            lmc=int(pa.lmc),
            sm_lid=int(pa.sm_lid),
            sm_sl=int(pa.sm_sl),
            link_state=C.LINK_STATE_FROM_IBV.get(int(pa.state), C.LINK_STATE_FROM_IBV[1]),
            cap=PortCap(int(pa.port_cap_flags)),
            pkeys=tuple(pkeys),
            gids=tuple(g if g is not None else ZERO_GID for g in gids),
            gid_table=table,
            qkey_violations=int(pa.qkey_viol_cntr),
            pkey_violations=int(pa.bad_pkey_cntr),
            subnet_timeout=int(pa.subnet_timeout),
            init_type_reply=int(pa.init_type_reply),
            max_vls=C.VLS_FROM_IBV.get(int(pa.max_vl_num), 1),
            link_layer=ll,
            active_speed=C.SPEED_FROM_IBV.get(
                int(pa.active_speed), f"speed {int(pa.active_speed)}"
            ),
            active_width=C.WIDTH_FROM_IBV.get(
                int(pa.active_width), f"width {int(pa.active_width)}"
            ),
            **kw,
        )

    def _port(self, port_num: int) -> PortInfo:
        info = self._ports.get(port_num)
        if info is None:
            if not isinstance(port_num, int) or not 1 <= port_num <= int(self.dev.phys_port_cnt):
                raise InvalidPort(f"{self.name} has no port {port_num}")
            self._port_attr(port_num)
            info = self._ports[port_num]
        return info

    def max_inline(self) -> int:
        """The largest inline size an RC QP is granted (probed once)."""
        if self._max_inline is not None:
            return self._max_inline
        best = 0
        pv = self.pv
        try:
            pd = pv.pd.PD(self.ctx)
            cq = pv.cq.CQ(self.ctx, 1, None, None, 0)
        except self._errs.PyverbsError:
            self._max_inline = 0
            return 0
        try:
            for want in _INLINE_PROBES:
                cap = pv.qp.QPCap(
                    max_send_wr=1,
                    max_recv_wr=1,
                    max_send_sge=1,
                    max_recv_sge=1,
                    max_inline_data=want,
                )
                ia = pv.qp.QPInitAttr(qp_type=C.IBV_QPT_RC, scq=cq, rcq=cq, cap=cap)
                try:
                    qp = pv.qp.QP(pd, ia)
                except self._errs.PyverbsError:
                    continue
                best = int(ia.max_inline_data)
                qp.close()
                break
        finally:
            cq.close()
            pd.close()
        self._max_inline = best
        return best

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

    def send_mad(self, h_agent: Handle, send: MadSend) -> None:
        agents = self._umad
        if agents is None or not isinstance(h_agent, umad.UmadAgent):
            raise InvalidHandle("not a MAD agent of this CA")
        agents.send(h_agent, send)

    def unregister_mad_agent(self, h_agent: Handle) -> None:
        agents = self._umad
        if agents is None or not isinstance(h_agent, umad.UmadAgent):
            raise InvalidHandle("not a MAD agent of this CA")
        agents.unregister(h_agent)

    # ------------------------------------------------------------- events
    def _retire(self, obj: Any, destroy: Any, what: str, fd: int | None = None) -> None:
        """Destroy ``obj`` with no upcall for it afterwards; on failure it stays usable."""
        loop = self._loop
        try:
            if loop is not None:
                loop.retire(obj, destroy, fd)
            else:
                obj.alive = False
                destroy()
        except self._errs.PyverbsError as exc:
            obj.alive = True
            raise translate(exc, what) from exc
        obj.alive = False

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

    def _route(self, attr: AvAttr, *, lazy: bool = False) -> tuple[Any, AvAttr]:
        """``AHAttr`` for an ibal AV; on RoCE, a usable source GID (see docs).

        With ``lazy`` (create_av/modify_av), a RoCE AV without a GRH gives
        ``None``: the contract lets create_av leave the attributes unchecked,
        and such an AV is refused when a send names it.
        """
        if not isinstance(attr, AvAttr):
            raise InvalidParameter("AV attributes must be an AvAttr")
        port = self._port(attr.port_num)
        grh = attr.grh
        if port.link_layer is LinkLayer.ETHERNET:
            if grh is None:
                if lazy:
                    return None, attr
                raise InvalidParameter("RoCE ports need a GRH (grh.dgid) in every address vector")
            grh = self._roce_grh(port, grh)
        a = self.pv.addr
        if grh is None:
            return a.AHAttr(
                dlid=attr.dlid,
                sl=attr.sl,
                src_path_bits=attr.path_bits,
                static_rate=attr.static_rate,
                is_global=0,
                port_num=attr.port_num,
            ), attr
        gr = a.GlobalRoute(
            dgid=a.GID(grh.dgid.exploded),
            flow_label=grh.flow_label,
            sgid_index=grh.sgid_index,
            hop_limit=grh.hop_limit,
            traffic_class=grh.traffic_class,
        )
        ah = a.AHAttr(
            dlid=attr.dlid,
            sl=attr.sl,
            src_path_bits=attr.path_bits,
            static_rate=attr.static_rate,
            is_global=1,
            port_num=attr.port_num,
            gr=gr,
        )
        return ah, attr

    def _roce_grh(self, port: PortInfo, grh: Grh) -> Grh:
        dgid = grh.dgid
        gids = port.gids
        if dgid in gids:
            # Loopback to this very port: any of its GIDs names it, and the
            # IPv4-mapped RoCE v2 one is the one every netdev (lo included) routes.
            i = port.roce_gid(ipv4=True)
            if i is None:
                i = port.roce_gid(ipv4=False)
            if i is not None:
                g = gids[i]
                assert g is not None
                return Grh(g, i, grh.flow_label, grh.hop_limit, grh.traffic_class)
            return grh
        want_v4 = dgid.ipv4_mapped is not None
        idx = grh.sgid_index
        sg = gids[idx] if 0 <= idx < len(gids) else None
        if sg is not None and (sg.ipv4_mapped is not None) == want_v4:
            return grh
        i = port.roce_gid(ipv4=want_v4)
        if i is None:
            return grh
        return Grh(dgid, i, grh.flow_label, grh.hop_limit, grh.traffic_class)

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

    # ------------------------------------------------------------------ CQ
    def create_cq(self, h_ca: Handle, size: int, cq_context: Any) -> CqCreated:
        self._ca(h_ca)
        if not isinstance(size, int) or size < 1 or size > int(self.dev.max_cqe):
            raise InvalidCqSize(f"CQ size {size} outside 1..{int(self.dev.max_cqe)}")
        loop = self._loop
        if loop is None:
            raise InvalidCaHandle("CA is not open")
        with self._lock:
            cq = Cq(self, cq_context)
            pvc = self.pv.cq
            try:
                channel = pvc.CompChannel(self.ctx)
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_create_comp_channel") from exc
            try:
                fd = self._channel_fd(channel)
                pv = pvc.CQ(self.ctx, size, cq, channel, 0)
            except BaseException as exc:
                channel.close()
                if isinstance(exc, self._errs.PyverbsError):
                    raise translate(exc, "ibv_create_cq", {errno.EINVAL: InvalidCqSize}) from exc
                raise
            cq.pv, cq.channel, cq.fd, cq.size = pv, channel, fd, int(pv.cqe)
            if self.ops is not None and self.layout is not None:
                try:
                    cq.poller = FastPoller(self.ops, self.layout.cq_ptr(pv, self.ctx))
                except peek.PeekError as exc:
                    log.debug("rdma_core %s: CQ pointer not found: %s", self.name, exc)
            self._cqs[id(cq)] = cq
            self._n["cq"] += 1

            def read_event() -> None:
                channel.get_cq_event(pv)
                pv.ack_events(1)

            def upcall() -> None:
                cq.armed = False
                h = self._open
                if h is not None:
                    h.completion_cb(cq_context)

            loop.add_channel(fd, cq, read_event, upcall)
            return CqCreated(cq, cq.size)

    def _channel_fd(self, channel: Any) -> int:
        if self.layout is None:
            raise Unsupported("completion channel fd not reachable in this pyverbs")
        try:
            return self.layout.comp_channel_fd(channel, self.ctx)
        except peek.PeekError as exc:
            raise Unsupported(f"completion channel fd not reachable: {exc}") from exc

    def resize_cq(self, h_cq: Handle, size: int) -> int:
        cq = self._cq(h_cq)
        if not isinstance(size, int) or size < 1 or size > int(self.dev.max_cqe):
            raise InvalidCqSize(f"CQ size {size} outside 1..{int(self.dev.max_cqe)}")
        with cq.lock:
            try:
                cq.pv.resize(size)
            except self._errs.PyverbsError as exc:
                # rxe (and mlx5) refuse a size below the queued entries with EINVAL;
                # the size itself was checked above.
                raise translate(exc, "ibv_resize_cq", {errno.EINVAL: Overflow}) from exc
            cq.size = int(cq.pv.cqe)
            return cq.size

    def query_cq(self, h_cq: Handle) -> int:
        return self._cq(h_cq).size

    def destroy_cq(self, h_cq: Handle) -> None:
        cq = self._cq(h_cq)
        with self._lock:
            if cq.users:
                raise ResourceBusy(f"CQ still used by {cq.users} QPs")

            def destroy() -> None:
                with cq.lock:
                    cq.pv.close()
                    cq.channel.close()

            self._retire(cq, destroy, "ibv_destroy_cq", cq.fd)
            del self._cqs[id(cq)]
            self._n["cq"] -= 1
            for tokens in cq.orphans:
                self.tokens.purge(tokens)
            cq.orphans.clear()

    def poll_cq(self, h_cq: Handle, max_entries: int) -> list[Wc]:
        cq = h_cq
        if cq.__class__ is not Cq or cq.ci is not self or not cq.alive:
            raise InvalidCqHandle("invalid or destroyed CQ")
        if max_entries < 1:
            return []
        with cq.lock:
            if not cq.alive:
                raise InvalidCqHandle("invalid or destroyed CQ")
            poller = cq.poller
            try:
                if poller is not None:
                    got = poller.poll(max_entries)
                else:
                    n, wcs = cq.pv.poll(max_entries)
                    got = wc_tuples_from_pyverbs(wcs) if n else ()
            except (OSError, self._errs.PyverbsError) as exc:
                raise translate(exc, "ibv_poll_cq") from exc
            out = convert_wcs(
                got, self.tokens, self._ud_qpns, cq.wc_cache, self._sq_accts, self._errored
            )
            if cq.pending and len(out) < max_entries:  # after the device's: they came later
                take = cq.pending[: max_entries - len(out)]
                del cq.pending[: len(take)]
                out += convert_wcs(
                    take, self.tokens, self._ud_qpns, None, self._sq_accts, self._errored
                )
            return self._headers(out) if self._ud_qpns else out

    def _complete_flushed(self, qp: Qp, lost: Held) -> None:
        """Complete send requests that never reached the device with ``WR_FLUSHED_ERR``.

        Called without the CA lock; upcalls once if the CQ was armed.
        """
        cq = qp.send_cq
        assert cq is not None
        with cq.lock:
            cq.pending.extend(flush_tuples(lost, qp.num))
            fire, cq.armed = cq.armed, False
        h = self._open
        if fire and h is not None:
            h.completion_cb(cq.context)

    def _headers(self, wcs: list[Wc]) -> list[Wc]:
        """Fill ``network_header`` of UD receives that carry a GRH area (see nethdr)."""
        ud = self._ud_qpns
        for j, wc in enumerate(wcs):
            if wc.wc_type is not WcType.RECV or wc.qp_num not in ud:
                continue
            qp = self._qps.get(wc.qp_num)
            if qp is None:
                continue
            area = self._areas.completed(qp.num, wc.wr_id) if qp.srq is None else None
            if wc.status is not WcStatus.SUCCESS or not wc.recv_opt & RecvOpt.GRH_VALID:
                continue
            port = self._ports.get(qp.port_num)
            if port is None:
                continue
            if port.link_layer is LinkLayer.INFINIBAND:
                hdr = NetworkHeader.IB_GRH
            elif area is None:
                continue
            else:
                found = classify(area, port.v2_gids, bool(port.v2_gids))
                if found is None:
                    continue
                hdr = found
            wcs[j] = dataclasses.replace(wc, network_header=hdr)
        return wcs

    def enable_cq_notify(self, h_cq: Handle, solicited: bool) -> None:
        cq = self._cq(h_cq)
        with cq.lock:
            try:
                cq.pv.req_notify(bool(solicited))
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_req_notify_cq") from exc
            cq.armed = True

    # ------------------------------------------------------------------ QP
    def create_qp(
        self,
        h_pd: Handle,
        qp_type: QpType,
        caps: QpCaps,
        send_cq: Handle,
        recv_cq: Handle,
        srq: Handle | None,
        sq_signaled: bool,
        qp_context: Any,
    ) -> QpCreated:
        pd = self._pd(h_pd)
        scq = self._cq(send_cq)
        rcq = self._cq(recv_cq)
        s = self._srq(srq) if srq is not None else None
        if s is not None and s.pd is not pd:
            raise InvalidSrqHandle("the SRQ belongs to another PD than the QP (IBA 10.2.3)")
        ibv_type = C.QPT_TO_IBV.get(qp_type)
        if ibv_type is None or qp_type not in self._caps.qp_types:
            raise InvalidServiceType(f"{qp_type!r} QPs are not available on {self.name}")
        d = self.dev
        depths = (caps.sq_depth,) + (() if s is not None else (caps.rq_depth,))
        if any(x < 0 or x > int(d.max_qp_wr) for x in depths):
            raise InvalidMaxWrs(f"queue depth above the device's {int(d.max_qp_wr)}")
        sges = (caps.sq_sge,) + (() if s is not None else (caps.rq_sge,))
        if any(x < 0 or x > int(d.max_sge) for x in sges):
            raise InvalidMaxSge(f"SGE count above the device's {int(d.max_sge)}")
        if caps.max_inline < 0:
            raise InvalidParameter("negative max_inline")
        q = self.pv.qp
        with self._lock:
            qp = Qp(self, pd, qp_type, qp_context)
            cap = q.QPCap(
                max_send_wr=caps.sq_depth,
                max_recv_wr=0 if s is not None else caps.rq_depth,
                max_send_sge=caps.sq_sge,
                max_recv_sge=0 if s is not None else caps.rq_sge,
                max_inline_data=caps.max_inline,
            )
            ia = q.QPInitAttr(
                qp_type=ibv_type,
                qp_context=qp,
                scq=scq.pv,
                rcq=rcq.pv,
                srq=s.pv if s is not None else None,
                cap=cap,
                sq_sig_all=1 if sq_signaled else 0,
            )
            try:
                pv = q.QP(pd.pv, ia)
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_create_qp") from exc
            qp.pv = pv
            qp.num = int(pv.qp_num)
            granted = QpCaps(
                sq_depth=int(ia.max_send_wr),
                rq_depth=0 if s is not None else int(ia.max_recv_wr),
                sq_sge=int(ia.max_send_sge),
                rq_sge=0 if s is not None else int(ia.max_recv_sge),
                max_inline=int(ia.max_inline_data),
            )
            qp.caps = granted
            qp.sq_signaled = bool(sq_signaled)
            qp.send_cq, qp.recv_cq, qp.srq = scq, rcq, s
            if self.layout is not None:
                try:
                    qp.ptr = self.layout.qp_ptr(pv, pd.pv, self.ctx)
                except peek.PeekError as exc:
                    log.debug("rdma_core %s: QP pointer not found: %s", self.name, exc)
            allowed = self._caps.opcodes.get(qp_type, frozenset())
            if self.ops is not None and qp.ptr:
                qp.sq = FastSendQueue(
                    self.ops,
                    qp.ptr,
                    qp_type,
                    max_sge=granted.sq_sge,
                    max_inline=granted.max_inline,
                    depth=granted.sq_depth,
                    atomics=self._caps.atomics,
                    ah_ptr_of=self._ah_ptr_of,
                    allowed=allowed,
                    all_signaled=bool(sq_signaled),
                )
            else:
                qp.sq = SendQueue(
                    self.api,
                    pv.post_send,
                    qp_type,
                    max_sge=granted.sq_sge,
                    max_inline=granted.max_inline,
                    depth=granted.sq_depth,
                    atomics=self._caps.atomics,
                    ah_of=self._ah_of,
                    allowed=allowed,
                    all_signaled=bool(sq_signaled),
                )
            if s is None:
                if self.ops is not None and qp.ptr:
                    qp.rq = FastRecvQueue(self.ops.post_recv, qp.ptr, max_sge=granted.rq_sge,
                                          tokens=self.tokens, owner=qp)  # fmt: skip
                else:
                    qp.rq = RecvQueue(self.api, pv.post_recv, max_sge=granted.rq_sge,
                                      tokens=self.tokens, owner=qp)  # fmt: skip
                rcq.orphans.append(qp.rtok)
            pd.users += 1
            scq.users += 1
            rcq.users += 1
            if s is not None:
                s.users += 1
            self._qps[qp.num] = qp
            self._n["qp"] += 1
            self._sq_accts[qp.num] = qp.sq.acct
            if qp_type is QpType.UD:
                self._ud_qpns.add(qp.num)
                if s is None:
                    self._areas.add_qp(qp.num)
            return QpCreated(qp, self._qp_attr_basic(qp))

    def _qp_attr_basic(self, qp: Qp) -> QpAttr:
        return QpAttr(
            qp_type=qp.qp_type,
            qp_num=qp.num,
            state=qp.state,
            caps=qp.caps,
            sq_signaled=qp.sq_signaled,
        )

    def _modify_attr(self, qp: Qp, mod: QpMod) -> tuple[Any, int]:
        a = self.pv.qp.QPAttr()
        mask = C.IBV_QP_STATE
        a.qp_state = C.QPS_TO_IBV[mod.state]
        if mod.current_state is not None:
            a.cur_qp_state = C.QPS_TO_IBV[mod.current_state]
            mask |= C.IBV_QP_CUR_STATE
        port_num = qp.port_num
        if mod.port_num is not None:
            self._port(mod.port_num)
            port_num = mod.port_num
            a.port_num = mod.port_num
            mask |= C.IBV_QP_PORT
        if mod.pkey_index is not None:
            if port_num:
                npk = len(self._port(port_num).pkeys)
                if not 0 <= mod.pkey_index < npk:
                    raise InvalidPkey(f"P_Key index {mod.pkey_index} outside the table of {npk}")
            a.pkey_index = mod.pkey_index
            mask |= C.IBV_QP_PKEY_INDEX
        if mod.qkey is not None:
            a.qkey = mod.qkey
            mask |= C.IBV_QP_QKEY
        if mod.access is not None:
            try:
                a.qp_access_flags = C.access_to_ibv(mod.access)
            except ValueError as exc:
                raise InvalidParameter(str(exc)) from exc
            mask |= C.IBV_QP_ACCESS_FLAGS
        if mod.primary_av is not None:
            ah, _ = self._route(mod.primary_av)
            a.ah_attr = ah
            mask |= C.IBV_QP_AV
        if mod.alternate_av is not None:
            ah, _ = self._route(mod.alternate_av)
            a.alt_ah_attr = ah
            a.alt_port_num = mod.alternate_av.port_num
            a.alt_pkey_index = mod.pkey_index if mod.pkey_index is not None else qp.pkey_index
            a.alt_timeout = (
                mod.local_ack_timeout if mod.local_ack_timeout is not None else qp.timeout
            )
            mask |= C.IBV_QP_ALT_PATH
        if mod.path_mtu is not None:
            a.path_mtu = int(mod.path_mtu)
            mask |= C.IBV_QP_PATH_MTU
        if mod.dest_qp is not None:
            _check_range("dest_qp", mod.dest_qp, 0xFFFFFF)
            a.dest_qp_num = mod.dest_qp
            mask |= C.IBV_QP_DEST_QPN
        if mod.rq_psn is not None:
            _check_range("rq_psn", mod.rq_psn, _PSN_MASK)
            a.rq_psn = mod.rq_psn
            mask |= C.IBV_QP_RQ_PSN
        if mod.sq_psn is not None:
            _check_range("sq_psn", mod.sq_psn, _PSN_MASK)
            a.sq_psn = mod.sq_psn
            mask |= C.IBV_QP_SQ_PSN
        if mod.resp_res is not None:
            _check_range("resp_res", mod.resp_res, int(self.dev.max_qp_rd_atom))
            a.max_dest_rd_atomic = mod.resp_res
            mask |= C.IBV_QP_MAX_DEST_RD_ATOMIC
        if mod.init_depth is not None:
            _check_range("init_depth", mod.init_depth, int(self.dev.max_qp_init_rd_atom))
            a.max_rd_atomic = mod.init_depth
            mask |= C.IBV_QP_MAX_QP_RD_ATOMIC
        if mod.rnr_nak_timeout is not None:
            _check_range("rnr_nak_timeout", mod.rnr_nak_timeout, 31)
            a.min_rnr_timer = mod.rnr_nak_timeout
            mask |= C.IBV_QP_MIN_RNR_TIMER
        if mod.local_ack_timeout is not None:
            _check_range("local_ack_timeout", mod.local_ack_timeout, 31)
            a.timeout = mod.local_ack_timeout
            mask |= C.IBV_QP_TIMEOUT
        if mod.retry_cnt is not None:
            _check_range("retry_cnt", mod.retry_cnt, 7)
            a.retry_cnt = mod.retry_cnt
            mask |= C.IBV_QP_RETRY_CNT
        if mod.rnr_retry_cnt is not None:
            _check_range("rnr_retry_cnt", mod.rnr_retry_cnt, 7)
            a.rnr_retry = mod.rnr_retry_cnt
            mask |= C.IBV_QP_RNR_RETRY
        if mod.apm_state is not None:
            a.path_mig_state = C.APM_TO_IBV[mod.apm_state]
            mask |= C.IBV_QP_PATH_MIG_STATE
        if mod.sqd_event is not None:
            a.en_sqd_async_notify = 1 if mod.sqd_event else 0
            mask |= C.IBV_QP_EN_SQD_ASYNC_NOTIFY
        if mod.sq_depth is not None or mod.rq_depth is not None:
            cap = self.pv.qp.QPCap(
                max_send_wr=mod.sq_depth if mod.sq_depth is not None else qp.caps.sq_depth,
                max_recv_wr=mod.rq_depth if mod.rq_depth is not None else qp.caps.rq_depth,
                max_send_sge=qp.caps.sq_sge,
                max_recv_sge=qp.caps.rq_sge,
                max_inline_data=qp.caps.max_inline,
            )
            a.cap = cap
            mask |= C.IBV_QP_CAP
        return a, mask

    def modify_qp(self, h_qp: Handle, mod: QpMod) -> QpAttr:
        qp = self._qp(h_qp)
        if (mod.alternate_av is not None or mod.apm_state is not None) and not (
            self.capabilities.apm
        ):
            # The kernel would take them (rxe advertises APM and never migrates).
            raise Unsupported(f"apm: {self.capabilities.reason('apm')}")
        try:
            attr, mask = self._modify_attr(qp, mod)
        except (OverflowError, TypeError) as exc:
            raise InvalidParameter(f"modify_qp: {exc}") from exc
        lost: Held = []
        with self._lock:
            old_state = qp.state
            try:
                qp.pv.modify(attr, mask)
            except self._errs.PyverbsError as exc:
                raise translate(
                    exc, f"ibv_modify_qp to {mod.state.name}", {errno.EOPNOTSUPP: Unsupported}
                ) from exc
            qp.state = mod.state
            if mod.port_num is not None:
                qp.port_num = mod.port_num
            if mod.pkey_index is not None:
                qp.pkey_index = mod.pkey_index
            if mod.local_ack_timeout is not None:
                qp.timeout = mod.local_ack_timeout
            if mod.primary_av is not None:
                qp.primary_av = mod.primary_av
            if mod.alternate_av is not None:
                qp.alternate_av = mod.alternate_av
            if mod.sq_depth is not None or mod.rq_depth is not None:
                qp.caps = QpCaps(
                    sq_depth=int(attr.cap.max_send_wr),
                    rq_depth=int(attr.cap.max_recv_wr),
                    sq_sge=qp.caps.sq_sge,
                    rq_sge=qp.caps.rq_sge,
                    max_inline=qp.caps.max_inline,
                )
            sq = qp.sq
            assert sq is not None
            if mod.state is QpState.RESET:
                self._areas.reset(qp.num)
                qp.primary_av = qp.alternate_av = None
                sq.drop_held()
                sq.acct.reset()
                if qp.srq is None and qp.rtok:
                    # Completions already queued may still name these receives.
                    assert qp.recv_cq is not None
                    qp.recv_cq.orphans.append(qp.rtok)
                    qp.rtok = set()
            elif old_state is QpState.SQD and mod.state is not QpState.SQD:
                lost = sq.release()  # sends held in SQD run now (and flush on ERROR)
            result = self._query(qp)
        if lost:
            self._complete_flushed(qp, lost)
        return result

    def query_qp(self, h_qp: Handle) -> QpAttr:
        return self._query(self._qp(h_qp))

    def _query(self, qp: Qp) -> QpAttr:
        try:
            a, ia = qp.pv.query(C.IBV_QP_ALL_ATTRS)
        except self._errs.PyverbsError as exc:
            raise translate(exc, "ibv_query_qp") from exc
        state = C.QPS_FROM_IBV.get(int(a.qp_state), qp.state)
        qp.state = state
        caps = qp.caps
        connected = qp.qp_type is not QpType.UD
        primary = qp.primary_av
        if primary is None and connected and state not in (QpState.RESET, QpState.INIT):
            primary = self._av_from_ibv(a.ah_attr)
        return QpAttr(
            qp_type=qp.qp_type,
            qp_num=qp.num,
            state=state,
            caps=caps,
            sq_signaled=bool(ia.sq_sig_all),
            dest_qp=int(a.dest_qp_num) if connected else 0,
            port_num=int(a.port_num),
            pkey_index=int(a.pkey_index),
            qkey=int(a.qkey) if not connected else 0,
            access=C.access_from_ibv(int(a.qp_access_flags)),
            primary_av=primary,
            alternate_av=qp.alternate_av,
            path_mtu=C.mtu_from_ibv(int(a.path_mtu)) if connected else None,
            sq_psn=int(a.sq_psn),
            rq_psn=int(a.rq_psn) if connected else 0,
            resp_res=int(a.max_dest_rd_atomic),
            init_depth=int(a.max_rd_atomic),
            rnr_nak_timeout=int(a.min_rnr_timer),
            local_ack_timeout=int(a.timeout),
            retry_cnt=int(a.retry_cnt),
            rnr_retry_cnt=int(a.rnr_retry),
            apm_state=C.APM_FROM_IBV.get(int(a.path_mig_state), C.APM_FROM_IBV[0]),
            sq_draining=bool(a.sq_draining),
        )

    def _av_from_ibv(self, ah: Any) -> AvAttr:
        grh = None
        if int(ah.is_global):
            grh = Grh(
                dgid=IPv6Address(ah.dgid),
                sgid_index=int(ah.sgid_index),
                flow_label=int(ah.flow_label),
                hop_limit=int(ah.hop_limit),
                traffic_class=int(ah.traffic_class),
            )
        return AvAttr(
            port_num=int(ah.port_num),
            dlid=int(ah.dlid),
            sl=int(ah.sl),
            grh=grh,
            static_rate=int(ah.static_rate),
            path_bits=int(ah.src_path_bits),
        )

    def destroy_qp(self, h_qp: Handle, timewait_us: int = 0) -> None:
        qp = self._qp(h_qp)
        with self._lock:
            if qp.mcast:
                raise ResourceBusy(
                    f"QP {qp.num} is still attached to {len(qp.mcast)} multicast groups"
                )
            sq, rq = qp.sq, qp.rq
            assert sq is not None

            def destroy() -> None:
                with sq.lock, rq.lock if rq is not None else contextlib.nullcontext():
                    qp.pv.close()
                    # Under the same locks: a post that raced the destroy and waits
                    # for them must find the queues closed, never the freed ibv_qp.
                    sq.closed = True
                    if rq is not None:
                        rq.closed = True

            self._retire(qp, destroy, "ibv_destroy_qp")
            sq.close()
            if rq is not None:
                rq.close()
            self._qps.pop(qp.num, None)
            self._n["qp"] -= 1
            self._ud_qpns.discard(qp.num)
            self._areas.drop_qp(qp.num)
            self._sq_accts.pop(qp.num, None)
            qp.pd.users -= 1
            assert qp.send_cq is not None and qp.recv_cq is not None
            qp.send_cq.users -= 1
            qp.recv_cq.users -= 1
            if qp.srq is not None:
                qp.srq.users -= 1

    # ------------------------------------------------------------------ SRQ
    def create_srq(self, h_pd: Handle, attr: SrqAttr, srq_context: Any) -> SrqCreated:
        pd = self._pd(h_pd)
        if not self._caps.srq:
            raise Unsupported(self._caps.reason("srq"))
        d = self.dev
        if not 1 <= attr.max_wr <= int(d.max_srq_wr):
            raise InvalidMaxWrs(f"SRQ max_wr {attr.max_wr} outside 1..{int(d.max_srq_wr)}")
        if not 1 <= attr.max_sge <= int(d.max_srq_sge):
            raise InvalidMaxSge(f"SRQ max_sge {attr.max_sge} outside 1..{int(d.max_srq_sge)}")
        if attr.srq_limit < 0:
            raise InvalidParameter("negative srq_limit")
        if attr.srq_limit > attr.max_wr:
            raise InvalidSetting(f"srq_limit {attr.srq_limit} above max_wr {attr.max_wr}")
        m = self.pv.srq
        with self._lock:
            s = Srq(self, pd, srq_context)
            try:
                pv = m.SRQ(
                    pd.pv, m.SrqInitAttr(m.SrqAttr(max_wr=attr.max_wr, max_sge=attr.max_sge))
                )
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_create_srq", {errno.EINVAL: InvalidSrqSize}) from exc
            try:
                if attr.srq_limit:
                    pv.modify(m.SrqAttr(srq_limit=attr.srq_limit), C.IBV_SRQ_LIMIT)
                granted = pv.query()
            except self._errs.PyverbsError as exc:
                pv.close()
                raise translate(exc, "ibv_modify_srq") from exc
            s.pv = pv
            if self.layout is not None:
                try:
                    s.ptr = self.layout.srq_ptr(pv, self.ctx)
                except peek.PeekError as exc:
                    log.debug("rdma_core %s: SRQ pointer not found: %s", self.name, exc)
            out = SrqAttr(int(granted.max_wr), int(granted.max_sge), int(granted.srq_limit))
            s.max_wr = out.max_wr
            s.rq = RecvQueue(
                self.api, pv.post_recv, max_sge=out.max_sge, tokens=self.tokens, owner=s
            )
            pd.users += 1
            self._n["srq"] += 1
            if s.ptr:
                self._srqs[s.ptr] = s
            return SrqCreated(s, out)

    def modify_srq(self, h_srq: Handle, attr: SrqAttr, mask: SrqAttrMask) -> None:
        s = self._srq(h_srq)
        m = int(mask)
        if not m or m & ~int(SrqAttrMask.MAX_WR | SrqAttrMask.LIMIT):
            raise InvalidParameter(f"invalid SRQ attribute mask {m:#x}")
        ibv_mask = 0
        if m & SrqAttrMask.MAX_WR:
            if not 1 <= attr.max_wr <= int(self.dev.max_srq_wr):
                raise InvalidSrqSize(
                    f"SRQ max_wr {attr.max_wr} outside 1..{int(self.dev.max_srq_wr)}"
                )
            ibv_mask |= C.IBV_SRQ_MAX_WR
        if m & SrqAttrMask.LIMIT:
            if attr.srq_limit < 0:
                raise InvalidParameter("negative srq_limit")
            top = attr.max_wr if m & SrqAttrMask.MAX_WR else s.max_wr
            if attr.srq_limit > top:
                raise InvalidSetting(f"srq_limit {attr.srq_limit} above the SRQ's {top} entries")
            ibv_mask |= C.IBV_SRQ_LIMIT
        try:
            s.pv.modify(
                self.pv.srq.SrqAttr(
                    max_wr=attr.max_wr, max_sge=attr.max_sge, srq_limit=attr.srq_limit
                ),
                ibv_mask,
            )
        except self._errs.PyverbsError as exc:
            raise translate(exc, "ibv_modify_srq") from exc
        if ibv_mask & C.IBV_SRQ_MAX_WR:
            with contextlib.suppress(self._errs.PyverbsError):
                s.max_wr = int(s.pv.query().max_wr)

    def query_srq(self, h_srq: Handle) -> SrqAttr:
        s = self._srq(h_srq)
        try:
            a = s.pv.query()
        except self._errs.PyverbsError as exc:
            raise translate(exc, "ibv_query_srq") from exc
        return SrqAttr(int(a.max_wr), int(a.max_sge), int(a.srq_limit))

    def destroy_srq(self, h_srq: Handle) -> None:
        s = self._srq(h_srq)
        with self._lock:
            if s.users:
                raise ResourceBusy(f"SRQ still used by {s.users} QPs")
            rq = s.rq
            assert rq is not None

            def destroy() -> None:
                with rq.lock:
                    s.pv.close()

            self._retire(s, destroy, "ibv_destroy_srq")
            rq.close()
            self._srqs.pop(s.ptr, None)
            self._n["srq"] -= 1
            self.tokens.purge(s.rtok)
            s.pd.users -= 1

    def post_srq_recv(self, h_srq: Handle, wrs: Sequence[RecvWr]) -> None:
        s = h_srq
        if s.__class__ is not Srq or s.ci is not self or not s.alive:
            raise post_error(Status.INVALID_SRQ_HANDLE, 0, "invalid or destroyed SRQ")
        rq = s.rq
        assert rq is not None
        self._post_recv_limited(rq, wrs, s.max_wr - len(s.rtok))

    # ------------------------------------------------------------------- MR
    def _buffer_address(self, mv: memoryview, vaddr: int, access: AccessFlags) -> None:
        if not mv.contiguous:
            raise InvalidParameter("registered memory must be contiguous")
        if mv.readonly:
            if access & _WRITE_ACCESS:
                raise InvalidPermission("a read-only buffer cannot be registered for writing")
            return
        if mv.nbytes:
            real = ctypes.addressof(ctypes.c_char.from_buffer(mv.cast("B")))
            if real != vaddr:
                raise InvalidParameter(f"vaddr {vaddr:#x} is not the buffer's address {real:#x}")

    def _register(self, pd: Pd, mv: memoryview, vaddr: int, access: AccessFlags) -> Any:
        if (
            access & (AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)
            and not access & AccessFlags.LOCAL_WRITE
        ):
            raise InvalidPermission("remote write and atomic access need local write")
        try:
            ibv_access = C.access_to_ibv(access)
        except ValueError as exc:
            raise InvalidParameter(str(exc)) from exc
        if not vaddr:
            raise InvalidParameter("cannot register address 0")
        self._buffer_address(mv, vaddr, access)
        try:
            return self.pv.mr.MR(pd.pv, mv.nbytes, ibv_access, address=vaddr)
        except self._errs.PyverbsError as exc:
            raise translate(exc, "ibv_reg_mr", {errno.EFAULT: InvalidPermission}) from exc

    def _keys(self, mr: Mr) -> MrKeys:
        rkey = int(mr.pv.rkey) if mr.access.is_remote else 0
        return MrKeys(handle=mr, lkey=int(mr.pv.lkey), rkey=rkey, vaddr=mr.vaddr, length=mr.length)

    def register_mr(
        self, h_pd: Handle, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        pd = self._pd(h_pd)
        mv = memoryview(buffer)
        with self._lock:
            pv = self._register(pd, mv, vaddr, access)
            mr = Mr(self)
            mr.pd, mr.pv, mr.buffer, mr.vaddr, mr.length = pd, pv, mv, vaddr, mv.nbytes
            mr.access = AccessFlags(access)
            pd.users += 1
            self._n["mr"] += 1
            self._areas.regions[int(pv.lkey)] = mr
            return self._keys(mr)

    def query_mr(self, h_mr: Handle) -> MrAttr:
        mr = self._mr(h_mr)
        remote = mr.access.is_remote
        return MrAttr(
            local_lb=mr.vaddr,
            local_ub=mr.vaddr + mr.length,
            remote_lb=mr.vaddr if remote else 0,
            remote_ub=mr.vaddr + mr.length if remote else 0,
            access=mr.access,
            lkey=int(mr.pv.lkey),
            rkey=int(mr.pv.rkey) if remote else 0,
        )

    def modify_mr(
        self,
        h_mr: Handle,
        mask: MrModMask,
        buffer: memoryview | None,
        vaddr: int | None,
        access: AccessFlags | None,
        h_pd: Handle | None,
    ) -> MrKeys:
        """Re-registration as register-new then deregister-old (rxe has no rereg_mr).

        A failure leaves the old registration untouched; success gives new keys.
        """
        mr = self._mr(h_mr)
        m = int(mask)
        if not m or m & ~int(MrModMask.ADDR | MrModMask.PD | MrModMask.ACCESS):
            raise InvalidParameter(f"invalid re-registration mask {m:#x}")
        new_pd = self._pd(h_pd) if m & MrModMask.PD else mr.pd
        assert new_pd is not None and mr.pd is not None
        if m & MrModMask.ADDR:
            if buffer is None or vaddr is None:
                raise InvalidParameter("MrModMask.ADDR needs a buffer and its vaddr")
            mv, va = memoryview(buffer), vaddr
        else:
            assert mr.buffer is not None
            mv, va = mr.buffer, mr.vaddr
        if m & MrModMask.ACCESS:
            if access is None:
                raise InvalidParameter("MrModMask.ACCESS needs access flags")
            acc = AccessFlags(access)
        else:
            acc = mr.access
        with self._lock:
            if mr.mws:
                raise ResourceBusy(f"{len(mr.mws)} memory windows are bound to this region")
            pv = self._register(new_pd, mv, va, acc)
            old = mr.pv
            old_lkey = int(old.lkey)
            try:
                old.close()
            except self._errs.PyverbsError as exc:
                pv.close()
                raise translate(exc, "ibv_dereg_mr", {errno.EINVAL: ResourceBusy}) from exc
            mr.pd.users -= 1
            new_pd.users += 1
            self._areas.regions.pop(old_lkey, None)
            self._areas.regions[int(pv.lkey)] = mr
            mr.pd, mr.pv, mr.buffer, mr.vaddr, mr.length, mr.access = (
                new_pd,
                pv,
                mv,
                va,
                mv.nbytes,
                acc,
            )
            return self._keys(mr)

    def deregister_mr(self, h_mr: Handle) -> None:
        mr = self._mr(h_mr)
        with self._lock:
            if mr.mws:
                raise ResourceBusy(f"{len(mr.mws)} memory windows are bound to this region")
            lkey = int(mr.pv.lkey)
            try:
                mr.pv.close()
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_dereg_mr", {errno.EINVAL: ResourceBusy}) from exc
            if self._areas.regions.get(lkey) is mr:
                del self._areas.regions[lkey]
            mr.alive = False
            assert mr.pd is not None
            mr.pd.users -= 1
            self._n["mr"] -= 1
            mr.buffer = None

    # ------------------------------------------------------------------- MW
    def create_mw(self, h_pd: Handle) -> MwCreated:
        pd = self._pd(h_pd)
        if 1 not in self._caps.mw_types:
            raise Unsupported(self._caps.reason("mw_types"))
        with self._lock:
            try:
                pv = self.pv.mr.MW(pd.pv, C.IBV_MW_TYPE_1)
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_alloc_mw") from exc
            pd.users += 1
            self._n["mw"] += 1
            mw = Mw(self, pd, pv)
            return MwCreated(mw, int(pv.rkey))

    def query_mw(self, h_mw: Handle) -> int:
        return int(self._mw(h_mw).pv.rkey)

    def bind_mw(self, h_mw: Handle, h_qp: Handle, bind: BindWr) -> int:
        mw = self._mw(h_mw)
        qp = self._qp(h_qp)
        if qp.qp_type not in (QpType.RC, QpType.UC):
            raise InvalidServiceType("memory windows are bound on RC or UC QPs")
        if not sends_execute(qp.state):
            raise InvalidQpState(f"QP is in {qp.state.name}")
        if qp.pd is not mw.pd:
            raise InvalidParameter("the binding QP must be in the window's PD (IBA 10.6.7)")
        mr: Mr | None
        if bind.length or bind.mr is not None:
            mr = self._mr(bind.mr)
            if mr.pd is not mw.pd:
                raise InvalidParameter("the region must be in the window's PD")
        else:
            mr = mw.bound or mw.last  # an unbind names no region; verbs still wants one
        if bind.current_rkey and bind.current_rkey != int(mw.pv.rkey):
            raise InvalidRkey(f"current_rkey {bind.current_rkey:#x} is not the window's")
        acc = AccessFlags(bind.access)
        if acc & ~_BIND_ACCESS:
            raise InvalidParameter("a window grants only remote read, write and atomic access")
        if bind.length and mr is not None:
            if not mr.access & AccessFlags.MW_BIND:
                raise InvalidPermission("the region was not registered with MW_BIND access")
            if (
                acc & (AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)
                and not mr.access & AccessFlags.LOCAL_WRITE
            ):
                raise InvalidPermission(
                    "remote write through a window needs local write on the region"
                )
            if bind.addr < mr.vaddr or bind.addr + bind.length > mr.vaddr + mr.length:
                raise InvalidParameter("window range outside the region")
        flags = 0
        if bind.send_opt & SendOpt.SIGNALED:
            flags |= C.IBV_SEND_SIGNALED
        if bind.send_opt & SendOpt.FENCE:
            flags |= C.IBV_SEND_FENCE
        m = self.pv.mr
        sq = qp.sq
        assert sq is not None
        scratch: Any = None
        with self._lock, sq.lock:
            if sq.acct.room() < 1:
                raise InsufficientResources(f"send queue full ({sq.acct.depth} granted)")
            try:
                if mr is None:
                    # Unbinding a window that was never bound: rxe's library reads
                    # the region's lkey even for a zero-length bind.
                    scratch = m.MR(mw.pd.pv, 8, 0)
                    region = scratch
                else:
                    region = mr.pv
                info = m.MWBindInfo(region, bind.addr, bind.length, C.access_to_ibv(acc))
                mwb = m.MWBind(info, flags, wr_id=bind.wr_id)
                qp.pv.bind_mw(mw.pv, mwb)
            except (OverflowError, TypeError, ValueError) as exc:
                raise InvalidParameter(f"bind_mw: {exc}") from exc
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_bind_mw", {errno.ENOMEM: InsufficientResources}) from exc
            finally:
                if scratch is not None:
                    with contextlib.suppress(self._errs.PyverbsError):
                        scratch.close()
            sq.acct.note_one(bool(flags & C.IBV_SEND_SIGNALED) or qp.sq_signaled)
            if mw.bound is not None:
                mw.bound.mws.discard(mw)
                mw.bound = None
            if bind.length and mr is not None:
                mw.bound = mw.last = mr
                mr.mws.add(mw)
            return int(mw.pv.rkey)

    def destroy_mw(self, h_mw: Handle) -> None:
        mw = self._mw(h_mw)
        with self._lock:
            try:
                mw.pv.close()
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_dealloc_mw") from exc
            mw.alive = False
            if mw.bound is not None:
                mw.bound.mws.discard(mw)
                mw.bound = None
            mw.pd.users -= 1
            self._n["mw"] -= 1

    # ------------------------------------------------------- post and poll
    def post_send(self, h_qp: Handle, wrs: Sequence[SendWr]) -> None:
        qp = h_qp
        if qp.__class__ is not Qp or qp.ci is not self or not qp.alive:
            raise post_error(Status.INVALID_QP_HANDLE, 0, "invalid or destroyed QP")
        if self._errored:
            self._refresh_state(qp)
        state = qp.state
        if state is QpState.RTS:
            qp.sq.post(wrs)  # type: ignore[union-attr]  # set for every live QP
        elif state is QpState.SQD:
            # A device queues sends posted in SQD until RTS; rxe does not restart a
            # drained send queue on SQD -> RTS: hold them (validated) until then.
            qp.sq.post(wrs, hold=self.rxe)  # type: ignore[union-attr]
        elif state is QpState.ERROR or state is QpState.SQERR:
            # IBA 10.8.3: accepted and completed WR_FLUSHED_ERR by the device; rxe's
            # requester flushes only when it runs, so nudge it as for receives.
            qp.sq.post(wrs)  # type: ignore[union-attr]
            if state is QpState.ERROR and self.rxe:
                self._kick_flush(qp)
        else:
            raise post_error(Status.INVALID_QP_STATE, 0, f"QP is in {state.name}")

    def post_recv(self, h_qp: Handle, wrs: Sequence[RecvWr]) -> None:
        qp = h_qp
        if qp.__class__ is not Qp or qp.ci is not self or not qp.alive:
            raise post_error(Status.INVALID_QP_HANDLE, 0, "invalid or destroyed QP")
        if self._errored:
            self._refresh_state(qp)
        if not can_post_recv(qp.state):
            raise post_error(Status.INVALID_QP_STATE, 0, f"QP is in {qp.state.name}")
        rq = qp.rq
        if rq is None:
            raise post_error(Status.INVALID_PARAMETER, 0, "the QP receives through its SRQ")
        if qp.qp_type is QpType.UD:
            try:
                self._post_recv_limited(rq, wrs, qp.caps.rq_depth - len(qp.rtok))
            except PostError as exc:
                self._areas.posted(qp.num, wrs[: exc.failed_index])
                raise
            self._areas.posted(qp.num, wrs)
        else:
            self._post_recv_limited(rq, wrs, qp.caps.rq_depth - len(qp.rtok))
        if qp.state is QpState.ERROR and self.rxe:
            self._kick_flush(qp)

    def _post_recv_limited(
        self, rq: RecvQueue | FastRecvQueue, wrs: Sequence[RecvWr], room: int
    ) -> None:
        n = len(wrs)
        if n <= room:
            rq.post(wrs)
            return
        room = max(room, 0)
        if room:
            rq.post(wrs[:room])
        raise post_error(Status.INSUFFICIENT_RESOURCES, room, "receive queue full")

    def _refresh_state(self, qp: Qp) -> None:
        """An error completion was polled for ``qp``: the kernel may have moved it to
        ERROR (rxe does for every error), which the cached state does not know yet;
        posts there must be flushed, so ask once (``ibv_query_qp``)."""
        if qp.num not in self._errored:
            return
        self._errored.discard(qp.num)
        with contextlib.suppress(IbError):
            self._query(qp)

    def _kick_flush(self, qp: Qp) -> None:
        """Receives posted to a QP in ERROR must complete flushed; rxe's responder only
        runs on a state change or a packet, so re-enter ERROR (a legal ERR -> ERR)."""
        a = self.pv.qp.QPAttr()
        a.qp_state = C.IBV_QPS_ERR
        try:
            qp.pv.modify(a, C.IBV_QP_STATE)
        except self._errs.PyverbsError as exc:
            log.debug("rdma_core %s: ERR -> ERR on QP %d failed: %s", self.name, qp.num, exc)

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


def _check_range(name: str, value: int, top: int) -> None:
    if not isinstance(value, int) or not 0 <= value <= top:
        raise InvalidParameter(f"{name} {value} outside 0..{top}")


__all__ = ["RdmaCoreCa"]
