"""``RxeCa``: one rxe device as a :class:`~ibal.ci.ChannelInterface`.

The verbs are split by what they manage: CA, PD, AV, CQ and multicast here,
memory in :mod:`.mr_verbs`, QPs and SRQs in :mod:`.qp_verbs`.  All of them
run under one lock per CA, which the engine's receive and timer threads take
too (:mod:`.engine`); upcalls are made with it held, so none can follow the
return of a destroy verb.  The device (:mod:`.device`) owns the sockets and
the port; its port events become CA async events.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import threading
import zlib
from typing import Any

from ibal.ci import (
    AsyncEventCallback,
    Capabilities,
    ChannelInterface,
    CompletionCallback,
    CqCreated,
)
from ibal.providers.rxe.cq import Cq
from ibal.providers.rxe.device import Device, DeviceEvent
from ibal.providers.rxe.engine import Engine
from ibal.providers.rxe.fastpath import fast_rx_enabled
from ibal.providers.rxe.fmr_verbs import FmrVerbs
from ibal.providers.rxe.memory import KeyTable, Pd
from ibal.providers.rxe.mr_verbs import MemoryVerbs
from ibal.providers.rxe.qp_verbs import QpVerbs
from ibal.providers.rxe.qps import Av, McastAttach, gid_to_ip, is_multicast_ip
from ibal.providers.rxe.verbs import PORT, serialized
from ibal.status import (
    InsufficientResources,
    InvalidCaHandle,
    InvalidGid,
    InvalidParameter,
    InvalidPort,
    InvalidServiceType,
    InvalidState,
    MaxMcastQpsReached,
    NotFound,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    CA_MOD_TO_PORT_CAP,
    CA_MOD_VALID,
    AvAttr,
    CaAttr,
    CaMod,
    EventRecord,
    Gid,
    GidEntry,
    PdType,
    PortAttr,
    PortAttrMod,
    PortCap,
    QpType,
    Wc,
    WrType,
)

FW_VERSION = "ibal rxe 0.1"

REASONS = {
    "qp_types": "reliable datagram is not part of RoCE (rxe has none either)",
    "special_qps": "RoCE has no subnet manager, so no QP0; QP1 (GSI) carries the MADs",
    "phys_mr": "a software HCA reaches only the buffers it is given (no physical pages)",
    "local_mad": "RoCE ports have no subnet management agent",
    "mad_agents": "QP1 is a special QP the access layer owns and shares (no kernel MAD layer)",
    "vendor_call": "rxe has no private commands",
    "violation_counters": "rxe counts P_Key/Q_Key drops in its device counters, not in "
    "the port's violation counters",
    "modify_ca": "only the capability bits change: the port's state follows the network "
    "interface, and kernel rxe's modify_port takes no init type or system image GUID",
    "apm": "RoCE has no alternate path migration in rxe",
    "resize_qp": "queues keep the depths granted at creation, as kernel rxe's",
}

CAPABILITIES = Capabilities(
    qp_types=frozenset({QpType.RC, QpType.UC, QpType.UD}),
    opcodes={
        QpType.RC: frozenset(WrType),
        QpType.UC: frozenset({WrType.SEND, WrType.RDMA_WRITE, WrType.LOCAL_INV, WrType.BIND_MW}),
        QpType.UD: frozenset({WrType.SEND}),
    },
    special_qps=frozenset({QpType.QP1}),
    atomics=True,
    mw_types=frozenset({1, 2}),
    srq=True,
    peek_cq=True,
    rearm_n_cq=True,
    resize_cq=True,
    multicast=True,
    phys_mr=False,
    shared_mr=True,
    modify_mr=True,
    fmr=True,
    local_mad=False,
    mad_agents=False,
    vendor_call=False,
    violation_counters=False,
    port_counters=True,
    modify_ca=True,
    inline_data=True,
    immediate=True,
    solicited_events=True,
    sqd=True,
    apm=False,
    async_event_injection=True,
    resize_qp=False,
    reasons=REASONS,
)


class OpenCa:
    """What ``open_ca`` returns."""

    __slots__ = ("alive", "ca")

    def __init__(self, ca: RxeCa) -> None:
        self.ca = ca
        self.alive = True


def ca_guid(device: Device) -> int:
    """The device's node GUID; a device bound to one address mixes the address in,
    so several devices on one interface (127.0.0.2, 127.0.0.3 on lo) differ."""
    guid = device.node_guid
    addr = device.spec.address
    if addr is not None:
        guid = (0x0200_0000 << 32) | (guid & 0xFFFF_0000_0000) ^ zlib.crc32(addr.packed)
    return guid


class RxeCa(QpVerbs, MemoryVerbs, FmrVerbs, ChannelInterface):
    """One rxe device: port 1 on its interface, QPs driven by an :class:`Engine`."""

    provider_name = "rxe"

    def __init__(self, device: Device) -> None:
        self.device = device
        self.name = device.name
        self.guid = ca_guid(device)
        self.vendor_id = device.limits.vendor_id
        self._lock = threading.RLock()
        self._open: OpenCa | None = None
        self._completion_cb: CompletionCallback | None = None
        self._async_cb: AsyncEventCallback | None = None
        self._ca_context: Any = None
        self.keys = KeyTable()
        self._port_cap = PortCap.IS_CM_SUPPORTED  # what modify_ca sets and clears
        self._attr_memo: tuple[tuple[PortAttr, PortCap], CaAttr] | None = None
        self._n = {"pd": 0, "cq": 0, "qp": 0, "srq": 0, "av": 0, "mr": 0, "mw": 0}
        self._next_qpn = 0x11
        self.attr = self._ca_attr()
        self.engine = Engine(self.name, self._lock, device.io, device.counters,
                             self._on_completion, self._on_event)
        if device.engine == "c" and fast_rx_enabled():
            from ibal.providers.rxe.fastmr import MrMirror
            from ibal.providers.rxe.fastpath import ffi_lib

            # the receive fast path's R_Key checks: every key change reaches C
            self.keys.mirror = self.engine.mr_mirror = MrMirror(*ffi_lib())
        device.subscribe(self._on_device_event)

    def __repr__(self) -> str:
        return f"<RxeCa {self.name} guid={self.guid:016x}>"

    @property
    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def resource_counts(self) -> dict[str, int]:
        """Live resources by kind (the conformance suite's backdoor)."""
        with self._lock:
            return dict(self._n)

    def gid_table(self) -> tuple[GidEntry, ...]:
        """The device's GIDs; a device bound to one address has only that one, at
        index 0: the link-local GID of its interface reaches no socket of it."""
        table = self.device.gid_table
        addr = self.device.spec.address
        if addr is None:
            return table
        own = [e for e in table if gid_to_ip(e.gid) == addr.packed]
        return tuple(dataclasses.replace(e, index=i) for i, e in enumerate(own))

    def _ca_attr(self) -> CaAttr:
        """The CA's attributes, rebuilt only when the port's view or capabilities changed
        (``Device.port_attr`` is one object per view): the CM queries the CA per REQ."""
        key = (self.device.port_attr(), self._port_cap)
        memo = self._attr_memo
        if memo is not None and memo[0][0] is key[0] and memo[0][1] == key[1]:
            return memo[1]
        attr = self._build_ca_attr()
        self._attr_memo = (key, attr)
        return attr

    def _build_ca_attr(self) -> CaAttr:
        gids = self.gid_table()
        port = dataclasses.replace(self.device.port_attr(), port_guid=self.guid, gids=(),
                                   gid_table=gids, cap=self._port_cap)
        return dataclasses.replace(
            self.device.ca_attr(), ca_guid=self.guid, system_image_guid=self.guid,
            fw_version=f"{FW_VERSION} ({self.device.engine} engine)", ports=(port,),
        )  # fmt: skip

    # -------------------------------------------------------------- upcalls
    def _on_completion(self, context: Any) -> None:
        cb = self._completion_cb
        if cb is not None:
            cb(context)

    def _on_event(self, record: EventRecord) -> None:
        cb = self._async_cb
        if cb is not None:
            cb(record)

    def _on_device_event(self, ev: DeviceEvent) -> None:
        """Port events from the device's watcher thread."""
        with self._lock:
            if self._open is not None:
                self._on_event(EventRecord(ev.event, self._ca_context, port_num=ev.port_num))

    def shutdown(self) -> None:
        """The device is going away: stop the engine; no upcall afterwards."""
        with self._lock:
            self.device.set_receiver(None)
            self.device.io.rx_fast = None
            self._completion_cb = self._async_cb = None
        self.engine.close()

    # ------------------------------------------------------------- multicast
    @serialized
    def attach_mcast(self, h_qp: Any, gid: Gid, lid: int) -> McastAttach:
        """Join the group's IP address (the socket layer's ``join``): RoCE has no LIDs,
        ``lid`` is kept for ``query`` only."""
        qp = self._h_qp(h_qp)
        if qp.qp_type is not QpType.UD:
            raise InvalidServiceType(f"only UD QPs join multicast groups, not {qp.qp_type.name}")
        if not isinstance(gid, Gid) or not is_multicast_ip(gid_to_ip(gid)):
            raise InvalidGid(f"{gid!r} is not a multicast GID")
        ip = gid_to_ip(gid)
        members = self.engine.mcast.get(ip, [])
        if qp in members:
            raise InvalidParameter(f"QP 0x{qp.num:x} is already attached to {gid}")
        if not members and len(self.engine.mcast) >= self.attr.max_mcast_grps:
            raise InsufficientResources(f"{self.name} is in {len(self.engine.mcast)} groups")
        if len(members) >= self.attr.max_qps_per_mcast_grp:
            raise MaxMcastQpsReached(f"group {gid} has its maximum of QPs on {self.name}")
        if not members:
            try:
                self.device.io.join(ipaddress.ip_address(ip), self.device.ifindex)
            except KeyError:
                pass  # no address of that family: only this device's own members hear it
            except OSError as e:
                raise InsufficientResources(f"cannot join {gid}: {e.strerror or e}") from None
        self.engine.mcast.setdefault(ip, []).append(qp)
        qp.mcasts += 1
        return McastAttach(self, qp, gid, lid, ip)

    @serialized
    def detach_mcast(self, h_mcast: Any) -> None:
        m = self._h_mcast(h_mcast)
        m.alive = False
        m.qp.mcasts -= 1
        members = self.engine.mcast.get(m.ip, [])
        if m.qp in members:
            members.remove(m.qp)
        if not members:
            self.engine.mcast.pop(m.ip, None)
            self.device.io.leave(ipaddress.ip_address(m.ip))

    def inject_async_event(self, record: EventRecord) -> None:
        """Deliver ``record`` through the async event callback (fault injection)."""
        with self._lock:
            if not isinstance(record, EventRecord):
                raise InvalidParameter("inject_async_event needs an EventRecord")
            if self._open is None:
                raise InvalidState(f"{self.name} is not open: no callback to deliver to")
            self._on_event(record)

    # -------------------------------------------------------------- CA access
    def _h_ca(self, h: Any) -> OpenCa:
        if type(h) is not OpenCa or h.ca is not self or not h.alive:
            raise InvalidCaHandle(f"not an open handle of {self.name}: {h!r}")
        return h

    @serialized
    def open_ca(self, completion_cb: CompletionCallback, async_event_cb: AsyncEventCallback,
                ca_context: Any) -> OpenCa:
        if not callable(completion_cb) or not callable(async_event_cb):
            raise InvalidParameter("open_ca needs a completion and an async event callback")
        if self._open is not None:
            raise ResourceBusy(f"{self.name} is already open")
        if self.engine.closed:
            raise NotFound(f"{self.name} has been removed")
        self._open = OpenCa(self)
        self._completion_cb = completion_cb
        self._async_cb = async_event_cb
        self._ca_context = ca_context
        self.device.set_receiver(self.engine.on_packets)
        if self.device.engine == "c" and fast_rx_enabled():
            self.device.io.rx_fast = self.engine.on_ring
        return self._open

    @serialized
    def query_ca(self, h_ca: Any) -> CaAttr:
        self._h_ca(h_ca)
        self.attr = self._ca_attr()
        return self.attr

    def query_port_counters(self, h_ca: Any, port_num: int) -> dict[str, int]:
        # Not serialized: a snapshot of plain ints, safe while the engine runs.
        self._h_ca(h_ca)
        if port_num != 1:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        return self.device.counters.snapshot()

    @serialized
    def modify_ca(self, h_ca: Any, port_num: int, ca_mod: CaMod,
                  port_attr_mod: PortAttrMod) -> None:  # fmt: skip
        """The port's capability bits, as kernel rxe's ``modify_port`` sets and clears them."""
        self._h_ca(h_ca)
        if port_num != PORT:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        mod = int(ca_mod)
        if mod < 0 or mod & ~int(CA_MOD_VALID):
            raise InvalidParameter(f"unknown modify_ca bits 0x{mod & ~int(CA_MOD_VALID):x}")
        if not isinstance(port_attr_mod, PortAttrMod):
            raise InvalidParameter("modify_ca needs port attributes")
        others = mod & ~sum(int(b) for b in CA_MOD_TO_PORT_CAP)
        if others:
            raise Unsupported(f"{CaMod(others)!r}: {REASONS['modify_ca']}")
        cap = int(self._port_cap)
        for bit, port_bit in CA_MOD_TO_PORT_CAP.items():
            if mod & int(bit):
                cap = cap | int(port_bit) if port_attr_mod.cap & port_bit else cap & ~int(port_bit)
        self._port_cap = PortCap(cap)
        self.attr = self._ca_attr()

    @serialized
    def close_ca(self, h_ca: Any) -> None:
        self._close(h_ca)
        self._open = None
        self.device.set_receiver(None)
        self.device.io.rx_fast = None
        self._completion_cb = self._async_cb = None

    # -------------------------------------------------------------- PD / AV
    @serialized
    def allocate_pd(self, h_ca: Any, pd_type: PdType) -> Pd:
        self._h_ca(h_ca)
        try:
            PdType(pd_type)
        except ValueError:
            raise InvalidParameter(f"unknown PD type {pd_type!r}") from None
        self._check_count("pd", self.attr.max_pds)
        self._adopt("pd")
        return Pd(self)

    @serialized
    def deallocate_pd(self, h_pd: Any) -> None:
        self._release_pd(self._h_pd(h_pd))

    def _av_ip(self, attr: AvAttr) -> bytes:
        if not isinstance(attr, AvAttr):
            raise InvalidParameter("address vector attributes missing")
        if attr.port_num != PORT:
            raise InvalidPort(f"{self.name} has no port {attr.port_num}")
        if attr.grh is None:
            raise InvalidParameter("a RoCE address vector needs a GRH (the destination GID)")
        if not 0 <= attr.grh.sgid_index < max(len(self.attr.ports[0].gid_table), 1):
            raise InvalidParameter(f"SGID index {attr.grh.sgid_index} outside the GID table")
        return gid_to_ip(attr.grh.dgid)

    @serialized
    def create_av(self, h_pd: Any, attr: AvAttr) -> Av:
        pd = self._h_pd(h_pd)
        ip = self._av_ip(attr)
        self._check_count("av", self.attr.max_avs)
        self._adopt("av", pd)
        return Av(self, pd, attr, ip)

    @serialized
    def modify_av(self, h_av: Any, attr: AvAttr) -> None:
        av = self._h_av(h_av)
        av.dst_ip = self._av_ip(attr)
        av.attr = attr

    @serialized
    def destroy_av(self, h_av: Any) -> None:
        av = self._h_av(h_av)
        self._retire("av", av, av.pd)

    # -------------------------------------------------------------------- CQ
    @serialized
    def create_cq(self, h_ca: Any, size: int, cq_context: Any) -> CqCreated:
        self._take_cq(h_ca, size)
        return CqCreated(Cq(self, size, cq_context), size)

    @serialized
    def destroy_cq(self, h_cq: Any) -> None:
        cq = self._h_cq(h_cq)
        self._release_cq(cq)
        cq.disarm()

    def poll_cq(self, h_cq: Any, max_entries: int) -> list[Wc]:
        """Any thread; never blocks for long.  On an empty CQ that was never armed (a
        busy poller's) the caller receives what waits on the device's sockets itself
        (``DeviceIO.poll_rx``, outside the CA lock, which the receive thread takes
        after the receive lock).  A CQ armed for events has a consumer that polls
        when told: the receive thread serves it, with no system calls per poll."""
        with self._lock:
            cq = self._h_cq(h_cq)
            if not isinstance(max_entries, int) or max_entries < 0:
                raise InvalidParameter("max_entries < 0")
            if cq.entries or not max_entries or cq.evented:
                return cq.poll(max_entries)
        self.device.io.poll_rx()
        if not cq.entries:  # (the receive thread may have delivered meanwhile)
            return []
        with self._lock:
            return cq.poll(max_entries) if cq.alive else []

    @serialized
    def peek_cq(self, h_cq: Any) -> int:
        return len(self._h_cq(h_cq).entries)

    @serialized
    def enable_cq_notify(self, h_cq: Any, solicited: bool) -> None:
        self._h_cq(h_cq).arm(bool(solicited))

    @serialized
    def enable_ncomp_cq_notify(self, h_cq: Any, n_cqes: int) -> None:
        cq = self._h_cq(h_cq)
        if not isinstance(n_cqes, int) or not 1 <= n_cqes <= cq.size:
            raise InvalidParameter(f"n_cqes must be 1..{cq.size}")
        cq.arm_n(n_cqes)
