"""What every group of rdma_core verbs shares: the device, its state, handle checks.

:class:`CaState` is the base of the verb mixins (:mod:`.ca`, :mod:`.cq_verbs`,
:mod:`.qp_verbs`, :mod:`.srq_verbs`, :mod:`.mr_verbs`): it opens the device,
declares the state they work on (tables of live objects, the lock, counts),
checks handles, knows the ports and turns an ibal AV into a pyverbs ``AHAttr``.
The other modules use only what it names here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from ipaddress import IPv6Address
from typing import Any

from ibal.ci.interface import (
    Capabilities,
    Handle,
)
from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core import counters, peek, umad
from ibal.providers.rdma_core.caps import build_capabilities, is_rxe
from ibal.providers.rdma_core.errors import translate
from ibal.providers.rdma_core.events import EventLoop
from ibal.providers.rdma_core.fastpath import (
    DATAPATH_ENV,
    Ops,
    OpsUnavailable,
)
from ibal.providers.rdma_core.handles import (
    ZERO_GID,
    Av,
    CaHandle,
    Cq,
    Mr,
    Mw,
    Pd,
    PortInfo,
    Qp,
    Srq,
)
from ibal.providers.rdma_core.ipmcast import IpMemberships
from ibal.providers.rdma_core.nethdr import ReceiveAreas
from ibal.providers.rdma_core.quirks import RxeQuirks
from ibal.providers.rdma_core.wr import (
    PyverbsApi,
    RecvTokens,
    SqAccount,
)
from ibal.status import (
    InvalidAvHandle,
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidMrHandle,
    InvalidMwHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPort,
    InvalidQpHandle,
    InvalidSrqHandle,
)
from ibal.types import (
    AvAttr,
    Gid,
    GidEntry,
    GidType,
    Grh,
    LinkLayer,
    PortAttr,
    PortCap,
    SendWr,
)

log = logging.getLogger("ibal.providers.rdma_core")

_INLINE_PROBES = (1024, 512, 400, 256, 128, 64, 32)


class CaState:
    """The device and the state the verb mixins share (see the module docstring)."""

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
            set_bind_rkey=layout.set_bind_rkey if layout is not None else None,
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
            counters.availability(self.name),
        )
        self.rxe = is_rxe(self.dev, self.name)
        """Kernel rxe: its workarounds (SQD hold, ERROR re-entry) apply to it only."""
        self.quirks = RxeQuirks(self.rxe, self.name, pv.qp.QPAttr, self._errs.PyverbsError)
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

    def _bind_handles(self, wr: SendWr) -> tuple[Mw, Mr, int]:
        """A BIND_MW's window, region and ``ibv_access_flags``, checked (posting thread)."""
        mw, bind = wr.mw, wr.bind
        if type(mw) is not Mw or mw.ci is not self or not mw.alive:
            raise InvalidMwHandle("BIND_MW: invalid or destroyed window")
        if bind is None:
            raise InvalidParameter("BIND_MW needs wr.bind (a BindWr)")
        mr = self._mr(bind.mr)
        if mr.pd is not mw.pd:
            raise InvalidParameter("BIND_MW: the region must be in the window's PD")
        try:
            access = C.access_to_ibv(bind.access)
        except ValueError as exc:
            raise InvalidParameter(f"BIND_MW: {exc}") from exc
        return mw, mr, access

    def _bind_pv_of(self, wr: SendWr) -> tuple[Any, Any]:
        """A BIND_MW's pyverbs ``MW`` and ``MWBindInfo`` (the pyverbs data path)."""
        mw, mr, access = self._bind_handles(wr)
        assert wr.bind is not None
        if self.layout is not None and wr.bind.current_rkey:
            try:
                self._set_current_rkey(mw, wr.bind.current_rkey)
            except peek.PeekError as exc:
                log.debug("rdma_core %s: ibv_mw not found: %s", self.name, exc)
        return mw.pv, self.pv.mr.MWBindInfo(mr.pv, wr.bind.addr, wr.bind.length, access)

    def _bind_ptr_of(self, wr: SendWr) -> tuple[int, int, int]:
        """A BIND_MW's ``ibv_mw *``, ``ibv_mr *`` and access (the ctypes data path)."""
        mw, mr, access = self._bind_handles(wr)
        assert wr.bind is not None
        if self.layout is None:  # pragma: no cover - no fast path without a layout
            raise InvalidParameter("BIND_MW: pyverbs layout unknown")
        try:
            mw_ptr = self._set_current_rkey(mw, wr.bind.current_rkey)
            return mw_ptr, self.layout.mr_ptr(mr.pv, self.ctx), access
        except peek.PeekError as exc:
            raise InvalidParameter(f"BIND_MW: {exc}") from exc

    def _set_current_rkey(self, mw: Mw, current: int) -> int:
        """The window's ``ibv_mw *``, its ``rkey`` set to the consumer's ``current_rkey``
        (0: left alone): verbs names the window's current key there (see peek)."""
        assert self.layout is not None
        ptr = self.layout.mw_ptr(mw.pv, mw.pd.pv, self.ctx)
        if current:
            self.layout.set_mw_rkey(ptr, current & 0xFFFF_FFFF)
        return ptr

    def _ah_ptr_of(self, av: Any) -> int:
        if type(av) is Av and av.ci is self and av.alive:
            return av.ptr
        return 0

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

    def completion_upcall(self, cq: Cq) -> None:
        """Call the open CA's completion callback for ``cq`` (no lock held)."""
        h = self._open
        if h is not None:
            h.completion_cb(cq.context)
