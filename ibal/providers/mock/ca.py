"""``MockCa``: one CA of the mock fabric, implementing every ChannelInterface verb.

The verbs live in one module per resource (``pd_av_verbs``, ``qp_verbs``, ``srq_verbs``,
``cq_verbs``, ``memory_verbs``, ``fmr_verbs``, ``post_verbs``, ``mcast_verbs``) over the shared
:class:`~ibal.providers.mock.ca_state.CaState`; this module keeps CA access, local MADs
and the async event backdoor.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ibal.ci.interface import (
    AsyncEventCallback,
    ChannelInterface,
    CompletionCallback,
    Handle,
)
from ibal.providers.mock import pma, smi
from ibal.providers.mock.objects import (
    MockAv,
    MockCq,
    MockMr,
    MockMw,
    MockPd,
    MockQp,
    OpenCa,
)
from ibal.providers.mock.topology import MockPort
from ibal.status import (
    Error,
    InvalidHandle,
    InvalidParameter,
    InvalidPort,
    InvalidState,
    NotFound,
    ResourceBusy,
    Timeout,
    Unsupported,
)
from ibal.types import (
    CA_MOD_TO_PORT_CAP,
    CA_MOD_VALID,
    MAD_SIZE,
    VERBS_VERSION,
    AtomicCap,
    CaAttr,
    CaMod,
    CiOp,
    EventRecord,
    GidEntry,
    GidType,
    LinkLayer,
    LinkState,
    NodeType,
    PortAttr,
    PortAttrMod,
    PortCap,
)
from ibal.wire.mad.consts import MgmtClass

if TYPE_CHECKING:
    pass

from ibal.providers.mock.ca_state import (
    FW_VERSION,
    MOCK_OUI,
    PAGE_SIZES,
    VENDOR_COUNTERS,
    VENDOR_DESCRIBE,
    VENDOR_ECHO,
    VENDOR_STATUS_UNKNOWN,
    CaLimits,
    verb,
)
from ibal.providers.mock.cq_verbs import CqVerbs
from ibal.providers.mock.fmr_verbs import FmrVerbs
from ibal.providers.mock.mcast_verbs import McastVerbs
from ibal.providers.mock.memory_verbs import MemoryVerbs
from ibal.providers.mock.pd_av_verbs import PdAvVerbs
from ibal.providers.mock.post_verbs import PostVerbs
from ibal.providers.mock.qp_verbs import QpVerbs
from ibal.providers.mock.srq_verbs import SrqVerbs

__all__ = ["MOCK_OUI", "CaLimits", "MockCa"]


class MockCa(
    PdAvVerbs,
    QpVerbs,
    SrqVerbs,
    CqVerbs,
    FmrVerbs,
    MemoryVerbs,
    PostVerbs,
    McastVerbs,
    ChannelInterface,
):
    """One CA of a :class:`~ibal.providers.mock.fabric.MockFabric`."""

    provider_name = "mock"
    version = VERBS_VERSION

    # ================================================================ CA access
    def open_ca(
        self,
        completion_cb: CompletionCallback,
        async_event_cb: AsyncEventCallback,
        ca_context: Any,
    ) -> Handle:
        with self._engine.lock:
            if self._engine.verb_faults_armed:
                self._engine.faults.check_verb("open_ca", self)
            if not callable(completion_cb) or not callable(async_event_cb):
                raise InvalidParameter("open_ca needs a completion and an async event callback")
            if self.removed:
                raise NotFound(f"{self.name} has been removed from the fabric")
            if self.opened is not None:
                raise ResourceBusy(f"{self.name} is already open")
            self.opened = OpenCa(self, completion_cb, async_event_cb, ca_context)
            return self.opened

    @verb
    def query_ca(self, h_ca: Handle) -> CaAttr:
        self._h_ca(h_ca)
        return self.ca_attr()

    def ca_attr(self) -> CaAttr:
        """What ``query_ca`` reports (also usable before the CA is opened)."""
        lim = self.limits
        return CaAttr(
            ca_guid=self.guid,
            vendor_id=self.attr_vendor_id,
            device_id=self.attr_device_id,
            revision=self.attr_revision,
            fw_version=FW_VERSION,
            system_image_guid=self.system_image_guid,
            node_type=NodeType.CA,
            max_pds=lim.max_pds,
            max_qps=lim.max_qps,
            max_wrs=lim.max_wrs,
            max_sges=lim.max_sges,
            max_cqs=lim.max_cqs,
            max_cqes=lim.max_cqes,
            max_srqs=lim.max_srqs,
            max_srq_wrs=lim.max_srq_wrs,
            max_srq_sges=lim.max_srq_sges,
            max_avs=lim.max_avs,
            max_mrs=lim.max_mrs,
            max_mws=lim.max_mws,
            max_mr_size=lim.max_mr_size,
            max_inline=lim.max_inline,
            max_qp_init_depth=lim.max_qp_init_depth,
            max_qp_resp_res=lim.max_qp_resp_res,
            max_mcast_grps=lim.max_mcast_grps,
            max_qps_per_mcast_grp=lim.max_qps_per_mcast_grp,
            page_size_cap=sum(PAGE_SIZES),
            atomicity=AtomicCap.GLOBAL,
            local_ack_delay=lim.local_ack_delay,
            has_local_sma=False,
            ports=tuple(self._port_attr(p) for p in self.ports),
        )

    def _port_attr(self, port: MockPort) -> PortAttr:
        fab = self._fabric
        return PortAttr(
            port_num=port.num,
            port_guid=port.guid,
            lid=port.lid,
            lmc=port.lmc,
            sm_lid=fab.sm_lid,
            sm_sl=0,
            link_state=port.state,
            active_mtu=port.max_mtu,
            max_mtu=port.max_mtu,
            cap=port.cap,
            pkeys=tuple(port.pkeys),
            gids=(port.gid,),
            gid_table=(GidEntry(0, port.gid, GidType.IB),),
            qkey_violations=port.qkey_violations,
            pkey_violations=port.pkey_violations,
            subnet_timeout=fab.subnet_timeout,
            init_type_reply=0,
            max_vls=1,
            link_layer=LinkLayer.INFINIBAND,
            active_speed="10.0 Gbps",
            active_width="4X",
        )

    @verb
    def modify_ca(
        self, h_ca: Handle, port_num: int, ca_mod: CaMod, port_attr_mod: PortAttrMod
    ) -> None:
        self._h_ca(h_ca)
        port = self.port_or_none(port_num)
        if port is None:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        mod = int(ca_mod)
        if mod & ~int(CA_MOD_VALID) or mod < 0:
            raise InvalidParameter(f"unknown modify_ca bits 0x{mod & ~int(CA_MOD_VALID):x}")
        if not isinstance(port_attr_mod, PortAttrMod):
            raise InvalidParameter("modify_ca needs port attributes")
        counters = int(CaMod.QKEY_CTR | CaMod.PKEY_CTR)
        if mod & counters and not self.violation_counters:
            raise Unsupported(f"{self.name} has no P_Key/Q_Key violation counters")
        cap = int(port.cap)
        for bit, port_bit in CA_MOD_TO_PORT_CAP.items():
            if mod & int(bit):
                if port_attr_mod.cap & port_bit:
                    cap |= int(port_bit)
                else:
                    cap &= ~int(port_bit)
        if mod & int(CaMod.QKEY_CTR):
            port.qkey_violations = 0
        if mod & int(CaMod.PKEY_CTR):
            port.pkey_violations = 0
        if mod & int(CaMod.INIT_TYPE_VALUE):
            port.init_type = port_attr_mod.init_type & 0xF
        if mod & int(CaMod.SYSTEM_IMAGE_GUID):
            self.system_image_guid = port_attr_mod.system_image_guid
        port.cap = PortCap(cap)
        if mod & int(CaMod.SHUTDOWN_PORT) and port.state is LinkState.ACTIVE:
            self._fabric.set_port_link_locked(port, False)

    def close_ca(self, h_ca: Handle) -> None:
        fab = self._engine
        self._no_callback("close_ca")
        with fab.lock:
            if fab.verb_faults_armed:
                fab.faults.check_verb("close_ca", self)
            self._close(h_ca)
            self.opened = None
        fab.callback_barrier()

    @verb
    def vendor_call(self, h_ca: Handle, handles: Sequence[Handle], op: CiOp) -> CiOp:
        """Demo commands: ``0x1`` echo ``data`` into ``out``; ``0x2`` the fabric
        counters as JSON; ``0x3`` a description of each handle in ``handles``."""
        self._h_ca(h_ca)
        if op is None or not isinstance(op, CiOp):
            raise InvalidParameter("vendor_call needs a CiOp")
        described = [self._describe_handle(h) for h in (handles or ())]
        if op.command == VENDOR_ECHO:
            op.out = bytes(op.data)
        elif op.command == VENDOR_COUNTERS:
            op.out = json.dumps(self._engine.counters.snapshot(), sort_keys=True).encode()
        elif op.command == VENDOR_DESCRIBE:
            op.out = json.dumps(described).encode()
        else:
            op.status = VENDOR_STATUS_UNKNOWN
            raise Error(f"vendor command 0x{op.command:x} unknown (status 0x{op.status:x})")
        op.status = 0
        return op

    def _describe_handle(self, h: Handle) -> dict[str, Any]:
        allowed = (OpenCa, MockPd, MockCq, MockAv, MockQp, MockMr, MockMw)
        if type(h) not in allowed or h.ca is not self or not h.alive:
            raise InvalidHandle(f"vendor_call: {h!r} is not a live CA, PD, CQ, AV, QP, MR or MW")
        if isinstance(h, MockQp):
            return {"kind": "qp", "qp_num": h.num, "type": h.qp_type.name, "state": h.state.name}
        if isinstance(h, MockCq):
            return {"kind": "cq", "size": h.size, "entries": len(h.entries)}
        if isinstance(h, MockMr):
            return {"kind": "mr", "vaddr": h.vaddr, "length": h.length, "lkey": h.lkey}
        if isinstance(h, MockMw):
            return {"kind": "mw", "rkey": h.rkey, "bound": h.mr is not None}
        if isinstance(h, MockAv):
            return {"kind": "av", "dlid": h.attr.dlid}
        if isinstance(h, MockPd):
            return {"kind": "pd", "users": h.users}
        return {"kind": "ca", "name": self.name}

    # ============================================================== local MAD
    @verb
    def local_mad(self, h_ca: Handle, port_num: int, mad: bytes) -> bytes:
        self._h_ca(h_ca)
        port = self.port_or_none(port_num)
        if port is None:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        if mad is None or len(mad) != MAD_SIZE:
            raise InvalidParameter(f"a MAD is {MAD_SIZE} bytes")
        if mad[1] == MgmtClass.PERF:
            return bytes(pma.answer(port, bytes(mad)))
        resp = smi.send(self.fabric, port, bytes(mad))
        if resp is None:
            raise Timeout(f"no response: the SMP was dropped on its path from {port.name}")
        return resp

    # ========================================================== fault backdoor
    def inject_async_event(self, record: EventRecord) -> None:
        """Deliver ``record`` through this CA's async event callback, as if raised."""
        fab = self._engine
        with fab.lock:
            if not isinstance(record, EventRecord):
                raise InvalidParameter("inject_async_event needs an EventRecord")
            h = self.opened
            if h is None:
                raise InvalidState(f"{self.name} is not open: no callback to deliver to")
            fab.upcalls.append((h, h.async_event_cb, record))
        fab.flush_upcalls()
