"""Ports, GIDs and address vectors of an rdma_core CA (a mixin of :class:`.state.CaState`).

Queries the port attributes and GID tables through pyverbs (with the
per-index fallback for kernels without the GID-table ioctl), probes the
largest inline size once, and turns an ibal AV into a pyverbs ``AHAttr``
(choosing a routable source GID on RoCE).
"""

from __future__ import annotations

import contextlib
import socket
from ipaddress import IPv6Address
from typing import Any

from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core.handles import ZERO_GID, PortInfo
from ibal.status import InvalidParameter, InvalidPort
from ibal.types import AvAttr, Gid, GidEntry, GidType, Grh, LinkLayer, PortAttr, PortCap

_INLINE_PROBES = (1024, 512, 400, 256, 128, 64, 32)


class PortQueries:
    """Port, GID and AV queries; :class:`.state.CaState` sets the attributes below."""

    pv: Any
    ctx: Any
    dev: Any
    name: str
    guid: int
    _errs: Any
    _ports: dict[int, PortInfo]
    _gid_total: int
    _max_inline: int | None

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
