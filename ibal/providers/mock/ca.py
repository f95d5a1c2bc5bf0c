"""``MockCa``: one CA of the mock fabric, implementing every ChannelInterface verb."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from ibal import qp_fsm
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
from ibal.providers.mock import mad as mad_agent
from ibal.providers.mock.objects import (
    MockAv,
    MockCq,
    MockMcast,
    MockMr,
    MockMw,
    MockPd,
    MockQp,
    MockSrq,
    OpenCa,
    RecvWqe,
    SendWqe,
)
from ibal.providers.mock.topology import MockPort
from ibal.status import (
    Error,
    IbError,
    InsufficientResources,
    InvalidApmState,
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
    InvalidState,
    MaxMcastQpsReached,
    NotFound,
    Overflow,
    ResourceBusy,
    Status,
    Unsupported,
    post_error,
)
from ibal.types import (
    CA_MOD_TO_PORT_CAP,
    CA_MOD_VALID,
    MAD_SIZE,
    MULTICAST_LID_BASE,
    QP1_WELL_KNOWN_QKEY,
    VERBS_VERSION,
    AccessFlags,
    ApmState,
    AsyncEvent,
    AtomicCap,
    AvAttr,
    BindWr,
    CaAttr,
    CaMod,
    CiOp,
    EventRecord,
    Gid,
    GidEntry,
    GidType,
    LinkLayer,
    LinkState,
    MrAttr,
    MrKeys,
    MrModMask,
    NodeType,
    PdType,
    PhysCreate,
    PortAttr,
    PortAttrMod,
    PortCap,
    QpAttr,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    SrqAttr,
    SrqAttrMask,
    Wc,
    WcStatus,
    WrType,
)

if TYPE_CHECKING:
    from ibal.providers.mock.fabric import MockFabric

P = ParamSpec("P")
R = TypeVar("R")
_Obj = TypeVar("_Obj")

MOCK_OUI = 0x02_1B_A1
"""A locally administered company ID: the mock's GUIDs are EUI-64s under it."""

MOCK_DEVICE_ID = 0x1BA1
MOCK_REVISION = 1
FW_VERSION = "1.0.0 (ibal mock)"

_REMOTE = int(AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)
_NEEDS_LOCAL_WRITE = int(AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)
_ANY_WRITE = int(AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.ATOMIC)
_ALL_ACCESS = int(
    AccessFlags.RDMA_READ
    | AccessFlags.RDMA_WRITE
    | AccessFlags.ATOMIC
    | AccessFlags.LOCAL_WRITE
    | AccessFlags.MW_BIND
)
_MW_BIND = int(AccessFlags.MW_BIND)
_LOCAL_WRITE = int(AccessFlags.LOCAL_WRITE)

_SIGNALED = int(SendOpt.SIGNALED)
_IMMEDIATE = int(SendOpt.IMMEDIATE)
_SOLICITED = int(SendOpt.SOLICITED)
_FENCE = int(SendOpt.FENCE)
_INLINE = int(SendOpt.INLINE)

_RTS = QpState.RTS
_SQD = QpState.SQD
_RESET = QpState.RESET
_ERROR = QpState.ERROR
_SQERR = QpState.SQERR
_FLUSHING = frozenset({_ERROR, _SQERR})  # posted sends complete WR_FLUSHED_ERR at once

_OPCODES: dict[QpType, frozenset[WrType]] = {
    QpType.RC: frozenset(WrType),
    QpType.UC: frozenset({WrType.SEND, WrType.RDMA_WRITE}),
    QpType.UD: frozenset({WrType.SEND}),
}

PAGE_SIZES = frozenset(1 << k for k in range(12, 22))
"""Page sizes ``register_pmr`` accepts: 4 KiB to 2 MiB."""

IOVA_BASE = 0x0000_7E00_0000_0000
"""Where the I/O virtual addresses assigned to physical registrations start."""

# vendor_call commands
VENDOR_ECHO = 0x1
VENDOR_COUNTERS = 0x2
VENDOR_DESCRIBE = 0x3
VENDOR_STATUS_UNKNOWN = 0xFF
VENDOR_STATUS_BAD_HANDLES = 0xFE


@dataclass(frozen=True, slots=True)
class CaLimits:
    """What one mock CA allows; every field can be given to ``fabric.add_ca``."""

    max_pds: int = 1024
    max_qps: int = 1024
    max_wrs: int = 16384
    max_sges: int = 32
    max_cqs: int = 1024
    max_cqes: int = 65536
    max_srqs: int = 256
    max_srq_wrs: int = 16384
    max_srq_sges: int = 32
    max_avs: int = 65536
    max_mrs: int = 65536
    max_mws: int = 65536
    max_mr_size: int = 1 << 40
    max_inline: int = 512
    max_qp_init_depth: int = 16
    max_qp_resp_res: int = 16
    max_mcast_grps: int = 256
    max_qps_per_mcast_grp: int = 64
    local_ack_delay: int = 15

    @classmethod
    def names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))


def _verb(fn: Callable[Concatenate[MockCa, P], R]) -> Callable[Concatenate[MockCa, P], R]:
    """Run a verb under the fabric lock, with verb faults, and make upcalls after."""
    name = fn.__name__

    @functools.wraps(fn)
    def wrapper(self: MockCa, /, *args: P.args, **kwargs: P.kwargs) -> R:
        fab = self._fab
        try:
            with fab._lock:
                if fab._verb_faults:
                    fab.faults.check_verb(name, self)
                return fn(self, *args, **kwargs)
        finally:
            if fab._upcalls:
                fab._flush_upcalls()

    return wrapper



def _resized(qp: MockQp, mod: QpMod, max_wrs: int) -> QpCaps:
    """The QP's sizes after ``mod``'s ``sq_depth``/``rq_depth`` (IBAL SQ_DEPTH/RQ_DEPTH).

    A queue never shrinks below the work requests it holds (``InvalidMaxWrs``).
    """
    caps = qp.caps
    for name, queue in (("sq_depth", qp.sq), ("rq_depth", qp.rq)):
        depth = getattr(mod, name)
        if depth is None:
            continue
        if name == "rq_depth" and qp.srq is not None:
            raise InvalidSetting("the QP takes its receives from an SRQ: no rq_depth")
        if not max(1, len(queue)) <= depth <= max_wrs:
            raise InvalidMaxWrs(f"{name} {depth}: {len(queue)} outstanding, CA limit {max_wrs}")
        caps = replace(caps, **{name: depth})
    return caps

class MockCa(ChannelInterface):
    """One CA of a :class:`~ibal.providers.mock.fabric.MockFabric`."""

    provider_name = "mock"
    version = VERBS_VERSION

    def __init__(
        self,
        fabric: MockFabric,
        index: int,
        name: str,
        guid: int,
        limits: CaLimits,
        *,
        violation_counters: bool = True,
        description: str | None = None,
    ) -> None:
        self._fab = fabric
        self.index = index
        self.name = name
        self.guid = guid
        self.system_image_guid = guid
        self.limits = limits
        self.description = description or f"ibal mock CA {name}"
        # ci_interface_t identity: no user-mode library, so vendor fields are zero.
        self.vendor_id = 0
        self.device_id = 0
        self.revision = 0
        # What query_ca / NodeInfo report.
        self.attr_vendor_id = MOCK_OUI
        self.attr_device_id = MOCK_DEVICE_ID
        self.attr_revision = MOCK_REVISION
        self._violation_counters = violation_counters
        self.ports: list[MockPort] = []
        self._open: OpenCa | None = None
        self._qps: dict[int, MockQp] = {}
        self._keys: dict[int, MockMr | MockMw] = {}
        self._next_qpn = 0x40
        self._next_key = 1
        self._iova = IOVA_BASE + (index << 36)
        self._n = {"pd": 0, "cq": 0, "qp": 0, "srq": 0, "av": 0, "mr": 0, "mw": 0}
        self.removed = False
        self._caps = self._make_capabilities()

    def __repr__(self) -> str:
        return f"<MockCa {self.name} guid={self.guid:016x} ports={len(self.ports)}>"

    # ============================================================== identity
    def _make_capabilities(self) -> Capabilities:
        reasons = {
            "apm": "alternate paths and automatic path migration are not modelled",
            "qp_types": "reliable datagram (EE contexts) is not implemented",
            "special_qps": "QP0 and QP1 only: raw IPv6 / Ethertype QPs need a real link layer",
            "mw_types": "only type 1 memory windows (bound with bind_mw)",
            "mad_agents": "QP0/QP1 are special QPs the access layer owns and shares",
        }
        if not self._violation_counters:
            reasons["violation_counters"] = "this CA was created without P_Key/Q_Key counters"
        return Capabilities(
            qp_types=frozenset({QpType.RC, QpType.UC, QpType.UD}),
            opcodes=dict(_OPCODES),
            special_qps=frozenset({QpType.QP0, QpType.QP1}),
            atomics=True,
            mw_types=frozenset({1}),
            srq=True,
            peek_cq=True,
            rearm_n_cq=True,
            resize_cq=True,
            multicast=True,
            phys_mr=True,
            shared_mr=True,
            modify_mr=True,
            local_mad=True,
            vendor_call=True,
            violation_counters=self._violation_counters,
            resize_qp=True,
            modify_ca=True,
            inline_data=True,
            immediate=True,
            solicited_events=True,
            sqd=True,
            apm=False,
            async_event_injection=True,
            reasons=reasons,
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def fabric(self) -> MockFabric:
        return self._fab

    def port(self, port_num: int) -> MockPort:
        """Port ``port_num`` (from 1) of this CA."""
        found = self._port_or_none(port_num)
        if found is None:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        return found

    def _port_or_none(self, port_num: int) -> MockPort | None:
        if isinstance(port_num, int) and 1 <= port_num <= len(self.ports):
            return self.ports[port_num - 1]
        return None

    def resource_counts(self) -> dict[str, int]:
        """Live resources by kind (``pd``, ``cq``, ``qp``, ``srq``, ``av``, ``mr``, ``mw``)."""
        return dict(self._n)

    # ========================================================== handle checks
    def _h_ca(self, h: Handle) -> OpenCa:
        if type(h) is not OpenCa or h.ca is not self or not h.alive:
            raise InvalidCaHandle(f"not an open handle of {self.name}: {h!r}")
        return h

    def _own(self, h: Handle, kind: type[_Obj], error: type[IbError], what: str) -> _Obj:
        """``h`` if it is a live ``kind`` of this CA, else ``error``."""
        if type(h) is not kind or getattr(h, "ca", None) is not self or not h.alive:  # type: ignore[attr-defined]
            raise error(f"not {what} of {self.name}: {h!r}")
        return h

    def _h_pd(self, h: Handle) -> MockPd:
        return self._own(h, MockPd, InvalidPdHandle, "a PD")

    def _h_cq(self, h: Handle) -> MockCq:
        return self._own(h, MockCq, InvalidCqHandle, "a CQ")

    def _h_qp(self, h: Handle) -> MockQp:
        return self._own(h, MockQp, InvalidQpHandle, "a QP")

    def _h_srq(self, h: Handle) -> MockSrq:
        return self._own(h, MockSrq, InvalidSrqHandle, "an SRQ")

    def _h_av(self, h: Handle) -> MockAv:
        return self._own(h, MockAv, InvalidAvHandle, "an AV")

    def _h_mr(self, h: Handle) -> MockMr:
        return self._own(h, MockMr, InvalidMrHandle, "an MR")

    def _h_mw(self, h: Handle) -> MockMw:
        return self._own(h, MockMw, InvalidMwHandle, "an MW")

    def _no_callback(self, verb: str) -> None:
        if self._fab.in_callback():
            raise InvalidState(f"{verb} may not be called from a provider callback")

    def _new_key(self) -> int:
        index = self._next_key
        self._next_key += 1
        return ((index & 0xFFFFFF) << 8) | (index * 0x3B & 0xFF)

    @staticmethod
    def _rekey(key: int) -> int:
        return (key & ~0xFF) | ((key + 1) & 0xFF)

    def _check_count(self, kind: str, limit: int) -> None:
        if self._n[kind] >= limit:
            raise InsufficientResources(f"{self.name}: no more {kind.upper()}s (limit {limit})")

    # ================================================================ CA access
    def open_ca(
        self,
        completion_cb: CompletionCallback,
        async_event_cb: AsyncEventCallback,
        ca_context: Any,
    ) -> Handle:
        with self._fab._lock:
            if self._fab._verb_faults:
                self._fab.faults.check_verb("open_ca", self)
            if not callable(completion_cb) or not callable(async_event_cb):
                raise InvalidParameter("open_ca needs a completion and an async event callback")
            if self.removed:
                raise NotFound(f"{self.name} has been removed from the fabric")
            if self._open is not None:
                raise ResourceBusy(f"{self.name} is already open")
            self._open = OpenCa(self, completion_cb, async_event_cb, ca_context)
            return self._open

    @_verb
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
        fab = self._fab
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

    @_verb
    def modify_ca(
        self, h_ca: Handle, port_num: int, ca_mod: CaMod, port_attr_mod: PortAttrMod
    ) -> None:
        self._h_ca(h_ca)
        port = self._port_or_none(port_num)
        if port is None:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        mod = int(ca_mod)
        if mod & ~int(CA_MOD_VALID) or mod < 0:
            raise InvalidParameter(f"unknown modify_ca bits 0x{mod & ~int(CA_MOD_VALID):x}")
        if not isinstance(port_attr_mod, PortAttrMod):
            raise InvalidParameter("modify_ca needs port attributes")
        counters = int(CaMod.QKEY_CTR | CaMod.PKEY_CTR)
        if mod & counters and not self._violation_counters:
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
            self._fab._set_port_link_locked(port, False)

    def close_ca(self, h_ca: Handle) -> None:
        fab = self._fab
        self._no_callback("close_ca")
        with fab._lock:
            if fab._verb_faults:
                fab.faults.check_verb("close_ca", self)
            h = self._h_ca(h_ca)
            busy = {k: v for k, v in self._n.items() if v}
            if busy:
                raise ResourceBusy(f"{self.name} still has {busy}")
            h.alive = False
            self._open = None
        fab._callback_barrier()

    @_verb
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
            op.out = json.dumps(self._fab.counters.snapshot(), sort_keys=True).encode()
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

    # ================================================================ PD / AV
    @_verb
    def allocate_pd(self, h_ca: Handle, pd_type: PdType) -> Handle:
        self._h_ca(h_ca)
        try:
            kind = PdType(pd_type)
        except ValueError:
            raise InvalidParameter(f"unknown PD type {pd_type!r}") from None
        self._check_count("pd", self.limits.max_pds)
        self._n["pd"] += 1
        return MockPd(self, kind)

    @_verb
    def deallocate_pd(self, h_pd: Handle) -> None:
        pd = self._h_pd(h_pd)
        if pd.users:
            raise ResourceBusy(f"PD still used by {pd.users} QP/SRQ/AV/MR/MW")
        pd.alive = False
        self._n["pd"] -= 1

    def _check_av(self, attr: AvAttr) -> None:
        if not isinstance(attr, AvAttr):
            raise InvalidParameter("address vector attributes missing")
        if self._port_or_none(attr.port_num) is None:
            raise InvalidPort(f"{self.name} has no port {attr.port_num}")
        if not 0 <= attr.dlid <= 0xFFFF:
            raise InvalidParameter(f"DLID 0x{attr.dlid:x} out of range")
        if attr.grh is not None and attr.grh.sgid_index != 0:
            raise InvalidParameter(f"SGID index {attr.grh.sgid_index}: each port has one GID")

    @_verb
    def create_av(self, h_pd: Handle, attr: AvAttr) -> Handle:
        pd = self._h_pd(h_pd)
        self._check_av(attr)
        self._check_count("av", self.limits.max_avs)
        self._n["av"] += 1
        pd.users += 1
        return MockAv(self, pd, attr)

    @_verb
    def query_av(self, h_av: Handle) -> AvAttr:
        return self._h_av(h_av).attr

    @_verb
    def modify_av(self, h_av: Handle, attr: AvAttr) -> None:
        av = self._h_av(h_av)
        self._check_av(attr)
        av.attr = attr

    @_verb
    def destroy_av(self, h_av: Handle) -> None:
        av = self._h_av(h_av)
        av.alive = False
        av.pd.users -= 1
        self._n["av"] -= 1

    # ==================================================================== QPs
    def _check_caps(self, caps: QpCaps, srq: MockSrq | None) -> None:
        lim = self.limits
        if not isinstance(caps, QpCaps):
            raise InvalidParameter("QP capabilities missing")
        if not 0 <= caps.sq_depth <= lim.max_wrs or (
            srq is None and not 0 <= caps.rq_depth <= lim.max_wrs
        ):
            raise InvalidMaxWrs(f"queue depth above {lim.max_wrs} (or negative)")
        if not 0 <= caps.sq_sge <= lim.max_sges or (
            srq is None and not 0 <= caps.rq_sge <= lim.max_sges
        ):
            raise InvalidMaxSge(f"SGE count above {lim.max_sges} (or negative)")
        if not 0 <= caps.max_inline <= lim.max_inline:
            raise InvalidSetting(f"inline size above {lim.max_inline}")

    def _alloc_qpn(self) -> int:
        qpn = self._next_qpn
        while qpn in self._qps or qpn < 2:
            qpn = (qpn + 1) & 0xFFFFFF
        self._next_qpn = (qpn + 1) & 0xFFFFFF
        return qpn

    @_verb
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
        pd = self._h_pd(h_pd)
        scq = self._h_cq(send_cq)
        rcq = self._h_cq(recv_cq)
        s = self._h_srq(srq) if srq is not None else None
        if s is not None and s.pd is not pd:
            raise InvalidSrqHandle("the SRQ belongs to another protection domain")
        if qp_type is QpType.RD:
            raise Unsupported("reliable datagram QPs are not implemented")
        if qp_type not in (QpType.RC, QpType.UC, QpType.UD, QpType.MAD):
            raise InvalidServiceType(f"create_qp does not make {qp_type!r} QPs")
        self._check_caps(caps, s)
        self._check_count("qp", self.limits.max_qps)
        qp = MockQp(self, pd, qp_type, self._alloc_qpn(), caps, scq, rcq, s, bool(sq_signaled),
                    qp_context)
        self._qps[qp.num] = qp
        self._take_refs(qp)
        return QpCreated(qp, self._qp_attr(qp))

    def _take_refs(self, qp: MockQp) -> None:
        self._n["qp"] += 1
        qp.pd.users += 1
        qp.send_cq.users += 1
        qp.recv_cq.users += 1
        if qp.srq is not None:
            qp.srq.users += 1

    @_verb
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
        pd = self._h_pd(h_pd)
        port = self._port_or_none(port_num)
        if port is None:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        scq = self._h_cq(send_cq)
        rcq = self._h_cq(recv_cq)
        if qp_type in (QpType.RAW_IPV6, QpType.RAW_ETHER):
            raise Unsupported("raw IPv6 / Ethertype QPs are not modelled")
        if qp_type not in (QpType.QP0, QpType.QP1):
            raise InvalidServiceType(f"create_spl_qp makes QP0 and QP1, not {qp_type!r}")
        index = 0 if qp_type is QpType.QP0 else 1
        if port.special[index] is not None:
            raise ResourceBusy(f"{qp_type.name} of {port.name} already exists")
        self._check_caps(caps, None)
        self._check_count("qp", self.limits.max_qps)
        qp = MockQp(self, pd, qp_type, index, caps, scq, rcq, None, True, qp_context)
        qp.port = port
        qp.port_num = port.num
        if qp_type is QpType.QP1:
            qp.qkey = QP1_WELL_KNOWN_QKEY
        port.special[index] = qp
        self._take_refs(qp)
        return QpCreated(qp, self._qp_attr(qp))

    def _qp_attr(self, qp: MockQp) -> QpAttr:
        return QpAttr(
            qp_type=qp.qp_type,
            qp_num=qp.num,
            state=qp.state,
            caps=qp.caps,
            sq_signaled=qp.sq_signaled,
            dest_qp=qp.dest_qp,
            port_num=qp.port_num,
            pkey_index=qp.pkey_index,
            qkey=qp.qkey,
            access=qp.access,
            primary_av=qp.av,
            alternate_av=None,
            path_mtu=qp.path_mtu,
            sq_psn=qp.sq_psn,
            rq_psn=qp.epsn,
            resp_res=qp.resp_res,
            init_depth=qp.init_depth,
            rnr_nak_timeout=qp.rnr_nak_timeout,
            local_ack_timeout=qp.local_ack_timeout,
            retry_cnt=qp.retry_cnt,
            rnr_retry_cnt=qp.rnr_retry_cnt,
            apm_state=qp.apm_state,
            sq_draining=qp.state is _SQD and qp.send_idx > 0,
        )

    @_verb
    def query_qp(self, h_qp: Handle) -> QpAttr:
        return self._qp_attr(self._h_qp(h_qp))

    @_verb
    def modify_qp(self, h_qp: Handle, mod: QpMod) -> QpAttr:
        qp = self._h_qp(h_qp)
        if not isinstance(mod, QpMod):
            raise InvalidParameter("modify_qp needs a QpMod")
        qp_fsm.check_modify(qp.qp_type, qp.state, mod)
        # ------------------------------------------------ validate everything first
        lim = self.limits
        port = qp.port
        if mod.port_num is not None:
            port = self._port_or_none(mod.port_num)
            if port is None:
                raise InvalidPort(f"{self.name} has no port {mod.port_num}")
        av = mod.primary_av
        if av is not None:
            self._check_av(av)
            port = self.ports[av.port_num - 1]
        if mod.pkey_index is not None:
            table = port.pkeys if port is not None else self.ports[0].pkeys
            if not 0 <= mod.pkey_index < len(table):
                raise InvalidPkey(f"P_Key index {mod.pkey_index} outside the table")
        if mod.alternate_av is not None:
            raise Unsupported("alternate paths (APM) are not supported by the mock")
        if mod.apm_state is not None and mod.apm_state is not ApmState.MIGRATED:
            raise InvalidApmState("no alternate path is loaded: only MIGRATED is valid")
        if mod.path_mtu is not None and (port is None or mod.path_mtu > port.max_mtu):
            raise InvalidSetting(f"path MTU {mod.path_mtu!r} above the port MTU")
        for name, top in (("dest_qp", 0xFFFFFF), ("rq_psn", 0xFFFFFF), ("sq_psn", 0xFFFFFF),
                          ("rnr_nak_timeout", 31), ("local_ack_timeout", 31),
                          ("retry_cnt", 7), ("rnr_retry_cnt", 7), ("qkey", 0xFFFFFFFF)):
            value = getattr(mod, name)
            if value is not None and not 0 <= value <= top:
                raise InvalidParameter(f"{name} {value} out of range 0..{top}")
        if mod.resp_res is not None and not 0 <= mod.resp_res <= lim.max_qp_resp_res:
            raise InvalidSetting(f"resp_res above {lim.max_qp_resp_res}")
        if mod.init_depth is not None and not 0 <= mod.init_depth <= lim.max_qp_init_depth:
            raise InvalidSetting(f"init_depth above {lim.max_qp_init_depth}")
        if mod.access is not None and int(mod.access) & ~_ALL_ACCESS:
            raise InvalidParameter(f"unknown access bits in {mod.access!r}")
        caps = _resized(qp, mod, lim.max_wrs)
        # ---------------------------------------------------------------- apply
        qp.caps = caps
        if port is not None and not qp.special:
            qp.port = port
            qp.port_num = port.num
        if mod.pkey_index is not None:
            qp.pkey_index = mod.pkey_index
        if mod.qkey is not None and qp.qp_type is not QpType.QP1:
            qp.qkey = mod.qkey
        if mod.access is not None:
            qp.access = AccessFlags(mod.access)
            qp.acc = int(mod.access)
        if av is not None:
            qp.av = av
        if mod.path_mtu is not None:
            qp.path_mtu = mod.path_mtu
            qp.mtu_bytes = mod.path_mtu.bytes
        if mod.dest_qp is not None:
            qp.dest_qp = mod.dest_qp
        if mod.rq_psn is not None:
            qp.rq_psn = mod.rq_psn
            qp.epsn = mod.rq_psn
        if mod.sq_psn is not None:
            qp.sq_psn = mod.sq_psn
        if mod.resp_res is not None:
            qp.resp_res = mod.resp_res
        if mod.init_depth is not None:
            qp.init_depth = mod.init_depth
        if mod.rnr_nak_timeout is not None:
            qp.rnr_nak_timeout = mod.rnr_nak_timeout
        if mod.local_ack_timeout is not None:
            qp.local_ack_timeout = mod.local_ack_timeout
        if mod.retry_cnt is not None:
            qp.retry_cnt = qp.retry_left = mod.retry_cnt
        if mod.rnr_retry_cnt is not None:
            qp.rnr_retry_cnt = qp.rnr_left = mod.rnr_retry_cnt
        if mod.apm_state is not None:
            qp.apm_state = mod.apm_state
        self._transition(qp, mod)
        return self._qp_attr(qp)

    def _transition(self, qp: MockQp, mod: QpMod) -> None:
        fab = self._fab
        old, new = qp.state, mod.state
        if new is _RESET:
            self._reset_qp(qp)
            return
        if new is _ERROR:
            fab._qp_error(qp)
            return
        qp.state = new
        if new is _SQD and old is not _SQD:
            qp.sqd_notify = mod.sqd_event is not False
            if qp.sqd_notify and qp.send_idx == 0:
                qp.sqd_notify = False
                fab._qp_event(qp, AsyncEvent.SQ_DRAINED)
        if new is _RTS and old is not _RTS:
            fab._sq_progress(qp)
            if fab._inline:
                fab._drive()

    def _reset_qp(self, qp: MockQp) -> None:
        """RESET discards every WQE without a completion and clears the transport state."""
        self._fab._cancel_timer(qp)
        self._fab._ack_wait.discard(qp)
        qp.state = _RESET
        qp.sq.clear()
        qp.rq.clear()
        qp.send_idx = 0
        qp.rd_atomic_out = 0
        qp.comm_est = False
        qp.nak_sent = False
        qp.atomic_cache.clear()
        qp.sqd_notify = False
        qp.epsn = qp.sq_psn = qp.rq_psn = 0

    def destroy_qp(self, h_qp: Handle, timewait_us: int = 0) -> None:
        fab = self._fab
        self._no_callback("destroy_qp")
        with fab._lock:
            if fab._verb_faults:
                fab.faults.check_verb("destroy_qp", self)
            qp = self._h_qp(h_qp)
            if qp.mcasts:
                raise ResourceBusy(f"QP 0x{qp.num:x} is still attached to {qp.mcasts} group(s)")
            qp.alive = False
            fab._cancel_timer(qp)
            fab._ack_wait.discard(qp)
            qp.sq.clear()
            qp.rq.clear()
            if qp.special:
                assert qp.port is not None
                qp.port.special[qp.num] = None
            else:
                del self._qps[qp.num]
            self._n["qp"] -= 1
            qp.pd.users -= 1
            qp.send_cq.users -= 1
            qp.recv_cq.users -= 1
            if qp.srq is not None:
                qp.srq.users -= 1
        fab._callback_barrier()

    # =================================================================== SRQ
    @_verb
    def create_srq(self, h_pd: Handle, attr: SrqAttr, srq_context: Any) -> SrqCreated:
        pd = self._h_pd(h_pd)
        if not isinstance(attr, SrqAttr):
            raise InvalidParameter("SRQ attributes missing")
        lim = self.limits
        if not 1 <= attr.max_wr <= lim.max_srq_wrs:
            raise InvalidMaxWrs(f"SRQ depth must be 1..{lim.max_srq_wrs}")
        if not 0 <= attr.max_sge <= lim.max_srq_sges:
            raise InvalidMaxSge(f"SRQ SGE count must be 0..{lim.max_srq_sges}")
        if not 0 <= attr.srq_limit <= attr.max_wr:
            raise InvalidSetting("SRQ limit above its depth")
        self._check_count("srq", lim.max_srqs)
        srq = MockSrq(self, pd, attr.max_wr, attr.max_sge, attr.srq_limit, srq_context)
        self._n["srq"] += 1
        pd.users += 1
        return SrqCreated(srq, SrqAttr(srq.max_wr, srq.max_sge, srq.limit))

    @_verb
    def modify_srq(self, h_srq: Handle, attr: SrqAttr, mask: SrqAttrMask) -> None:
        srq = self._h_srq(h_srq)
        m = int(mask)
        if not m or m & ~int(SrqAttrMask.MAX_WR | SrqAttrMask.LIMIT) or attr is None:
            raise InvalidParameter(f"bad SRQ attribute mask {mask!r}")
        max_wr = srq.max_wr
        if m & int(SrqAttrMask.MAX_WR):
            if not max(1, len(srq.wqes)) <= attr.max_wr <= self.limits.max_srq_wrs:
                raise InvalidSetting(
                    f"SRQ depth {attr.max_wr}: below the {len(srq.wqes)} posted or above the CA"
                )
            max_wr = attr.max_wr
        if m & int(SrqAttrMask.LIMIT) and not 0 <= attr.srq_limit <= max_wr:
            raise InvalidSetting(f"SRQ limit {attr.srq_limit} above its depth {max_wr}")
        srq.max_wr = max_wr
        if m & int(SrqAttrMask.LIMIT):
            srq.limit = attr.srq_limit

    @_verb
    def query_srq(self, h_srq: Handle) -> SrqAttr:
        srq = self._h_srq(h_srq)
        return SrqAttr(srq.max_wr, srq.max_sge, srq.limit)

    def destroy_srq(self, h_srq: Handle) -> None:
        fab = self._fab
        self._no_callback("destroy_srq")
        with fab._lock:
            if fab._verb_faults:
                fab.faults.check_verb("destroy_srq", self)
            srq = self._h_srq(h_srq)
            if srq.users:
                raise ResourceBusy(f"SRQ still used by {srq.users} QP(s)")
            srq.alive = False
            srq.wqes.clear()
            srq.pd.users -= 1
            self._n["srq"] -= 1
        fab._callback_barrier()

    def post_srq_recv(self, h_srq: Handle, wrs: Sequence[RecvWr]) -> None:
        fab = self._fab
        with fab._lock:
            if fab._verb_faults:
                fab.faults.check_verb("post_srq_recv", self)
            srq = h_srq
            if type(srq) is not MockSrq or srq.ca is not self or not srq.alive:
                raise post_error(Status.INVALID_SRQ_HANDLE, 0, f"not an SRQ of {self.name}")
            wqes = srq.wqes
            for i, wr in enumerate(wrs):
                sg = wr.sg_list
                if len(sg) > srq.max_sge:
                    raise post_error(Status.INVALID_MAX_SGE, i, f"{len(sg)} SGEs > {srq.max_sge}")
                if len(wqes) >= srq.max_wr:
                    raise post_error(Status.INSUFFICIENT_RESOURCES, i, "SRQ full")
                wqes.append((wr.wr_id, tuple((s.addr, s.length, s.lkey) for s in sg)))

    # ==================================================================== CQ
    @_verb
    def create_cq(self, h_ca: Handle, size: int, cq_context: Any) -> CqCreated:
        self._h_ca(h_ca)
        if not isinstance(size, int) or not 1 <= size <= self.limits.max_cqes:
            raise InvalidCqSize(f"CQ size must be 1..{self.limits.max_cqes}")
        self._check_count("cq", self.limits.max_cqs)
        self._n["cq"] += 1
        cq = MockCq(self, size, cq_context)
        return CqCreated(cq, size)

    @_verb
    def resize_cq(self, h_cq: Handle, size: int) -> int:
        cq = self._h_cq(h_cq)
        if not isinstance(size, int) or not 1 <= size <= self.limits.max_cqes:
            raise InvalidCqSize(f"CQ size must be 1..{self.limits.max_cqes}")
        if size < len(cq.entries):
            raise Overflow(f"the CQ holds {len(cq.entries)} entries, more than {size}")
        cq.size = size
        if cq.notify_n > size:
            cq.notify_n = size
        return size

    @_verb
    def query_cq(self, h_cq: Handle) -> int:
        return self._h_cq(h_cq).size

    def destroy_cq(self, h_cq: Handle) -> None:
        fab = self._fab
        self._no_callback("destroy_cq")
        with fab._lock:
            if fab._verb_faults:
                fab.faults.check_verb("destroy_cq", self)
            cq = self._h_cq(h_cq)
            if cq.users:
                raise ResourceBusy(f"CQ still used by {cq.users} QP(s)")
            cq.alive = False
            cq.notify = cq.notify_n = 0
            self._n["cq"] -= 1
        fab._callback_barrier()

    # ==================================================================== MR
    @staticmethod
    def _check_access(access: AccessFlags) -> int:
        try:
            acc = int(access)
        except (TypeError, ValueError):
            raise InvalidParameter(f"bad access flags {access!r}") from None
        if acc & ~_ALL_ACCESS or acc < 0:
            raise InvalidParameter(f"unknown access bits in {access!r}")
        if acc & _NEEDS_LOCAL_WRITE and not acc & _LOCAL_WRITE:
            raise InvalidPermission("remote write and atomic access need local write")
        return acc

    @staticmethod
    def _as_bytes_view(buffer: Any, acc: int) -> memoryview:
        try:
            mv = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
        except TypeError:
            raise InvalidParameter(f"{type(buffer).__name__} is not a buffer") from None
        if not mv.contiguous:
            raise InvalidParameter("the buffer is not contiguous")
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        if mv.readonly and acc & _ANY_WRITE:
            raise InvalidPermission("write access requested on a read-only buffer")
        return mv

    def _install_keys(self, mr: MockMr, acc: int, key: int | None = None) -> None:
        key = self._new_key() if key is None else key
        mr.lkey = key
        mr.rkey = key if acc & _REMOTE else 0
        mr.access = AccessFlags(acc)
        mr.acc = acc
        self._keys[key] = mr

    @staticmethod
    def _keys_of(mr: MockMr) -> MrKeys:
        return MrKeys(mr, mr.lkey, mr.rkey, mr.vaddr, mr.length)

    @_verb
    def register_mr(
        self, h_pd: Handle, buffer: memoryview, vaddr: int, access: AccessFlags
    ) -> MrKeys:
        pd = self._h_pd(h_pd)
        if buffer is None:
            raise InvalidParameter("register_mr needs a buffer")
        acc = self._check_access(access)
        mv = self._as_bytes_view(buffer, acc)
        length = mv.nbytes
        if length > self.limits.max_mr_size:
            raise InvalidParameter(f"{length} bytes is above max_mr_size")
        if not isinstance(vaddr, int) or vaddr < 0 or vaddr + length > 1 << 64:
            raise InvalidParameter(f"virtual address {vaddr!r} out of range")
        self._check_count("mr", self.limits.max_mrs)
        mr = MockMr(self, pd)
        mr.vaddr = vaddr
        mr.length = length
        mr.mv = mv
        self._install_keys(mr, acc)
        self._n["mr"] += 1
        pd.users += 1
        return self._keys_of(mr)

    def _alloc_iova(self, size: int, align: int) -> int:
        base = (self._iova + align - 1) & ~(align - 1)
        self._iova = base + ((size + align - 1) & ~(align - 1)) + align  # a guard page
        return base

    @_verb
    def register_pmr(self, h_pd: Handle, create: PhysCreate, vaddr: int) -> MrKeys:
        pd = self._h_pd(h_pd)
        if not isinstance(create, PhysCreate):
            raise InvalidParameter("register_pmr needs a PhysCreate")
        acc = self._check_access(create.access)
        ps = create.page_size
        if ps not in PAGE_SIZES:
            raise InvalidParameter(f"page size {ps} not supported (4 KiB .. 2 MiB, powers of 2)")
        if not create.pages:
            raise InvalidParameter("no pages")
        if not 0 <= create.buf_offset < ps:
            raise InvalidParameter("buf_offset must lie inside the first page")
        if create.length <= 0 or create.buf_offset + create.length > len(create.pages) * ps:
            raise InvalidParameter("length does not fit the pages")
        if create.length > self.limits.max_mr_size:
            raise InvalidParameter(f"{create.length} bytes is above max_mr_size")
        pages = []
        for page in create.pages:
            mv = self._as_bytes_view(page, acc)
            if mv.nbytes < ps:
                raise InvalidParameter(f"a page buffer is shorter than {ps} bytes")
            pages.append(mv[:ps])
        if not isinstance(vaddr, int) or vaddr < 0:
            raise InvalidParameter(f"virtual address {vaddr!r} out of range")
        self._check_count("mr", self.limits.max_mrs)
        if vaddr and vaddr % ps == create.buf_offset:
            assigned = vaddr
        else:
            assigned = self._alloc_iova(create.buf_offset + create.length, ps) + create.buf_offset
        mr = MockMr(self, pd)
        mr.vaddr = assigned
        mr.length = create.length
        mr.pages = tuple(pages)
        mr.page_size = ps
        mr.base = create.buf_offset
        mr.phys = True
        self._install_keys(mr, acc)
        self._n["mr"] += 1
        pd.users += 1
        return self._keys_of(mr)

    @_verb
    def query_mr(self, h_mr: Handle) -> MrAttr:
        mr = self._h_mr(h_mr)
        remote = bool(mr.rkey)
        return MrAttr(
            local_lb=mr.vaddr,
            local_ub=mr.vaddr + mr.length,
            remote_lb=mr.vaddr if remote else 0,
            remote_ub=mr.vaddr + mr.length if remote else 0,
            access=mr.access,
            lkey=mr.lkey,
            rkey=mr.rkey,
        )

    @_verb
    def modify_mr(
        self,
        h_mr: Handle,
        mask: MrModMask,
        buffer: memoryview | None,
        vaddr: int | None,
        access: AccessFlags | None,
        h_pd: Handle | None,
    ) -> MrKeys:
        mr = self._h_mr(h_mr)
        m = int(mask)
        if not m or m & ~int(MrModMask.ADDR | MrModMask.PD | MrModMask.ACCESS):
            raise InvalidParameter(f"bad re-registration mask {mask!r}")
        if mr.windows:
            raise ResourceBusy(f"{mr.windows} memory window(s) bound to the region")
        if mr.shares:
            raise ResourceBusy(f"{mr.shares} shared region(s) use its pages")
        pd = self._h_pd(h_pd) if m & int(MrModMask.PD) else mr.pd
        if m & int(MrModMask.ACCESS):
            if access is None:
                raise InvalidParameter("MrModMask.ACCESS without access flags")
            acc = self._check_access(access)
        else:
            acc = mr.acc
        mv: memoryview | None = None
        if m & int(MrModMask.ADDR):
            if buffer is None or vaddr is None:
                raise InvalidParameter("MrModMask.ADDR needs a buffer and an address")
            mv = self._as_bytes_view(buffer, acc)
            if mv.nbytes > self.limits.max_mr_size:
                raise InvalidParameter("the new region is above max_mr_size")
            if vaddr < 0 or vaddr + mv.nbytes > 1 << 64:
                raise InvalidSetting(f"virtual address {vaddr!r} out of range")
        elif acc & _ANY_WRITE and (
            (mr.mv is not None and mr.mv.readonly) or any(p.readonly for p in mr.pages)
        ):
            raise InvalidPermission("write access requested on a read-only buffer")
        # apply: a deregistration and a registration, with new keys
        del self._keys[mr.lkey]
        if pd is not mr.pd:
            mr.pd.users -= 1
            pd.users += 1
            mr.pd = pd
        if mv is not None:
            assert vaddr is not None
            mr.mv = mv
            mr.pages = ()
            mr.page_size = 0
            mr.base = 0
            mr.phys = False
            mr.vaddr = vaddr
            mr.length = mv.nbytes
            if mr.parent is not None:
                mr.parent.shares -= 1
                mr.parent = None
        self._install_keys(mr, acc, self._rekey(mr.lkey))
        return self._keys_of(mr)

    @_verb
    def register_smr(
        self, h_mr: Handle, h_pd: Handle, access: AccessFlags, vaddr: int
    ) -> MrKeys:
        src = self._h_mr(h_mr)
        pd = self._h_pd(h_pd)
        acc = self._check_access(access)
        if acc & _ANY_WRITE and (
            (src.mv is not None and src.mv.readonly) or any(p.readonly for p in src.pages)
        ):
            raise InvalidPermission("write access requested on read-only pages")
        if not isinstance(vaddr, int) or vaddr < 0:
            raise InvalidParameter(f"virtual address {vaddr!r} out of range")
        self._check_count("mr", self.limits.max_mrs)
        page = src.page_size or 4096
        if not vaddr:
            assigned = src.vaddr
        elif vaddr % page == src.vaddr % page:
            assigned = vaddr
        else:
            assigned = (vaddr - vaddr % page) + src.vaddr % page
        mr = MockMr(self, pd)
        mr.vaddr = assigned
        mr.length = src.length
        mr.mv = src.mv
        mr.pages = src.pages
        mr.page_size = src.page_size
        mr.base = src.base
        mr.phys = src.phys
        mr.parent = src
        src.shares += 1
        self._install_keys(mr, acc)
        self._n["mr"] += 1
        pd.users += 1
        return self._keys_of(mr)

    @_verb
    def deregister_mr(self, h_mr: Handle) -> None:
        mr = self._h_mr(h_mr)
        if mr.windows:
            raise ResourceBusy(f"{mr.windows} memory window(s) bound to the region")
        if mr.shares:
            raise ResourceBusy(f"{mr.shares} shared region(s) use its pages")
        mr.alive = False
        del self._keys[mr.lkey]
        if mr.parent is not None:
            mr.parent.shares -= 1
            mr.parent = None
        mr.mv = None
        mr.pages = ()
        mr.pd.users -= 1
        self._n["mr"] -= 1

    # ==================================================================== MW
    @_verb
    def create_mw(self, h_pd: Handle) -> MwCreated:
        pd = self._h_pd(h_pd)
        self._check_count("mw", self.limits.max_mws)
        mw = MockMw(self, pd, self._new_key())
        self._keys[mw.rkey] = mw
        self._n["mw"] += 1
        pd.users += 1
        return MwCreated(mw, mw.rkey)

    @_verb
    def query_mw(self, h_mw: Handle) -> int:
        return self._h_mw(h_mw).rkey

    def _unbind(self, mw: MockMw) -> None:
        if mw.mr is not None:
            mw.mr.windows -= 1
            mw.mr = None
        mw.addr = mw.length = 0
        mw.access = AccessFlags.NONE
        mw.acc = 0

    def bind_mw(self, h_mw: Handle, h_qp: Handle, bind: BindWr) -> int:
        fab = self._fab
        try:
            with fab._lock:
                if fab._verb_faults:
                    fab.faults.check_verb("bind_mw", self)
                rkey = self._bind_mw(h_mw, h_qp, bind)
                if fab._inline:
                    fab._drive()
                return rkey
        finally:
            if fab._upcalls:
                fab._flush_upcalls()

    def _bind_mw(self, h_mw: Handle, h_qp: Handle, bind: BindWr) -> int:
        mw = self._h_mw(h_mw)
        qp = self._h_qp(h_qp)
        if qp.transport is QpType.UD:
            raise InvalidServiceType(f"{qp.qp_type.name} QPs cannot bind memory windows")
        if not isinstance(bind, BindWr):
            raise InvalidParameter("bind_mw needs a BindWr")
        if bind.current_rkey != mw.rkey:
            raise InvalidRkey(
                f"current_rkey 0x{bind.current_rkey:x} is not the window's 0x{mw.rkey:x}"
            )
        if qp.state is not _RTS and qp.state is not _SQD:
            raise InvalidQpState(f"bind_mw on a QP in {qp.state.name}")
        if len(qp.sq) >= qp.caps.sq_depth:
            raise InsufficientResources("send queue full")
        mr: MockMr | None = None
        acc = 0
        if bind.length:
            mr = self._h_mr(bind.mr)
            try:
                acc = int(bind.access) & _REMOTE
            except (TypeError, ValueError):
                raise InvalidParameter(f"bad access {bind.access!r}") from None
            if not mr.acc & _MW_BIND:
                raise InvalidPermission("the region was not registered with MW_BIND")
            if acc & _NEEDS_LOCAL_WRITE and not mr.acc & _LOCAL_WRITE:
                raise InvalidPermission("remote write/atomic windows need a locally writable MR")
            if bind.length < 0 or bind.addr < mr.vaddr or (
                bind.addr + bind.length > mr.vaddr + mr.length
            ):
                raise InvalidParameter("the window does not lie inside the region")
            if mr.pd is not qp.pd or mw.pd is not qp.pd:
                raise InvalidParameter("window, region and QP must share a protection domain")
        # Type 1 binds take effect when posted; the WQE gives the completion in order.
        old = mw.rkey
        new = self._rekey(old)
        del self._keys[old]
        self._unbind(mw)
        if mr is not None:
            mw.mr = mr
            mr.windows += 1
            mw.addr = bind.addr
            mw.length = bind.length
            mw.access = AccessFlags(acc)
            mw.acc = acc
        mw.rkey = new
        self._keys[new] = mw
        opt = int(bind.send_opt)
        wqe = SendWqe(bind.wr_id, WrType.SEND, bool(opt & _SIGNALED) or qp.sq_signaled)
        wqe.bind = (mw, mr, bind.addr, bind.length, AccessFlags(acc), new)
        wqe.fence = bool(opt & _FENCE)
        qp.sq.append(wqe)
        self._fab._sq_progress(qp)
        return new

    @_verb
    def destroy_mw(self, h_mw: Handle) -> None:
        mw = self._h_mw(h_mw)
        self._unbind(mw)
        mw.alive = False
        del self._keys[mw.rkey]
        mw.pd.users -= 1
        self._n["mw"] -= 1

    # ========================================================== post and poll
    def post_send(self, h_qp: Handle, wrs: Sequence[SendWr]) -> None:
        fab = self._fab
        try:
            with fab._lock:
                if fab._verb_faults:
                    fab.faults.check_verb("post_send", self)
                qp = h_qp
                if type(qp) is not MockQp or qp.ca is not self or not qp.alive:
                    raise post_error(Status.INVALID_QP_HANDLE, 0, f"not a QP of {self.name}")
                state = qp.state
                if state is not _RTS and state is not _SQD and state not in _FLUSHING:
                    raise post_error(Status.INVALID_QP_STATE, 0, f"post_send in {state.name}")
                sq = qp.sq
                depth = qp.caps.sq_depth
                try:
                    for i, wr in enumerate(wrs):
                        if len(sq) >= depth:
                            raise post_error(Status.INSUFFICIENT_RESOURCES, i, "send queue full")
                        sq.append(self._make_wqe(qp, wr, i))
                finally:
                    if state is _RTS:
                        fab._sq_progress(qp)
                        if fab._inline:
                            fab._drive()
                    elif state is _ERROR or state is _SQERR:
                        fab._flush_sq(qp)  # IBA 10.8.3: each WR completes WR_FLUSHED_ERR
        finally:
            if fab._upcalls:
                fab._flush_upcalls()

    def _make_wqe(self, qp: MockQp, wr: SendWr, i: int) -> SendWqe:
        op = wr.opcode
        if op not in _OPCODES[qp.transport]:
            if op in _OPCODES[QpType.RC]:
                raise post_error(Status.INVALID_WR_TYPE, i, f"{op!r} on a {qp.qp_type.name} QP")
            raise post_error(Status.INVALID_WR_TYPE, i, f"unknown work request type {op!r}")
        opt = int(wr.send_opt)
        w = SendWqe(wr.wr_id, op, bool(opt & _SIGNALED) or qp.sq_signaled)
        sg = wr.sg_list
        if opt & _INLINE and (op is WrType.SEND or op is WrType.RDMA_WRITE):
            sges = tuple((s.addr, s.length, s.lkey) for s in sg)
            total = sum(s[1] for s in sges)
            if total > qp.caps.max_inline:
                raise post_error(
                    Status.INVALID_PARAMETER, i, f"{total} inline bytes > {qp.caps.max_inline}"
                )
            w.sges = sges
            w.length = total
            data = self._fab._gather(qp, w)  # copied now: the buffer may be reused at once
            if data is not None:
                w.inline = bytes(data)
        else:
            if len(sg) > qp.caps.sq_sge:
                raise post_error(Status.INVALID_MAX_SGE, i, f"{len(sg)} SGEs > {qp.caps.sq_sge}")
            if len(sg) == 1:
                s = sg[0]
                w.sges = ((s.addr, s.length, s.lkey),)
                w.length = s.length
            else:
                w.sges = tuple((s.addr, s.length, s.lkey) for s in sg)
                w.length = sum(s[1] for s in w.sges)
        if opt & _IMMEDIATE and (op is WrType.SEND or op is WrType.RDMA_WRITE):
            w.imm = wr.imm & 0xFFFFFFFF
        if opt & _SOLICITED:
            w.solicited = True
        if opt & _FENCE:
            w.fence = True
        if op is not WrType.SEND:
            w.remote_addr = wr.remote_addr
            w.rkey = wr.rkey
            if w.is_rd_atomic and op is not WrType.RDMA_READ:
                w.compare = wr.compare_add
                w.swap = wr.swap
                w.length = 8
        if qp.transport is QpType.UD:
            ud = wr.ud
            if ud is None:
                raise post_error(Status.INVALID_PARAMETER, i, "a datagram send needs wr.ud")
            av = ud.av
            if type(av) is not MockAv or av.ca is not self or not av.alive:
                raise post_error(Status.INVALID_AV_HANDLE, i, f"not an AV of {self.name}")
            if av.pd is not qp.pd:
                w.status = WcStatus.LOCAL_PROTECTION_ERR  # IBA: the AV's PD must be the QP's
            w.ud = (av.attr, ud.remote_qp, ud.remote_qkey & 0xFFFFFFFF, ud.pkey_index)
        return w

    def post_recv(self, h_qp: Handle, wrs: Sequence[RecvWr]) -> None:
        fab = self._fab
        try:
            with fab._lock:
                if fab._verb_faults:
                    fab.faults.check_verb("post_recv", self)
                qp = h_qp
                if type(qp) is not MockQp or qp.ca is not self or not qp.alive:
                    raise post_error(Status.INVALID_QP_HANDLE, 0, f"not a QP of {self.name}")
                if qp.srq is not None:
                    raise post_error(
                        Status.INVALID_PARAMETER, 0, "the QP takes receives from its SRQ"
                    )
                state = qp.state
                if state is _RESET:
                    raise post_error(Status.INVALID_QP_STATE, 0, "post_recv in RESET")
                rq = qp.rq
                depth = qp.caps.rq_depth
                max_sge = qp.caps.rq_sge
                for i, wr in enumerate(wrs):
                    sg = wr.sg_list
                    if len(sg) > max_sge:
                        raise post_error(Status.INVALID_MAX_SGE, i, f"{len(sg)} SGEs > {max_sge}")
                    if len(rq) >= depth:
                        raise post_error(Status.INSUFFICIENT_RESOURCES, i, "receive queue full")
                    wqe: RecvWqe = (
                        wr.wr_id,
                        ((sg[0].addr, sg[0].length, sg[0].lkey),)
                        if len(sg) == 1
                        else tuple((s.addr, s.length, s.lkey) for s in sg),
                    )
                    if state is _ERROR:
                        fab._flush_recv(qp, wqe[0])
                    else:
                        rq.append(wqe)
        finally:
            if fab._upcalls:
                fab._flush_upcalls()

    def poll_cq(self, h_cq: Handle, max_entries: int) -> list[Wc]:
        fab = self._fab
        cq = h_cq
        if type(cq) is not MockCq or cq.ca is not self or not cq.alive:
            raise InvalidCqHandle(f"not a CQ of {self.name}: {cq!r}")
        with fab._lock:
            if fab._verb_faults:
                fab.faults.check_verb("poll_cq", self)
            ents = cq.entries
            if not ents:
                if not fab._heap or fab._manual:
                    if max_entries < 0:
                        raise InvalidParameter("max_entries < 0")
                    return []
                fab._drive()  # let due timers (RNR waits, retries) run while polling
            if max_entries >= len(ents):
                out = list(ents)
                ents.clear()
            elif max_entries > 0:
                out = [ents.popleft() for _ in range(max_entries)]
            elif max_entries == 0:
                out = []
            else:
                raise InvalidParameter("max_entries < 0")
        if fab._upcalls:
            fab._flush_upcalls()
        return out

    def peek_cq(self, h_cq: Handle) -> int:
        cq = h_cq
        if type(cq) is not MockCq or cq.ca is not self or not cq.alive:
            raise InvalidCqHandle(f"not a CQ of {self.name}: {cq!r}")
        fab = self._fab
        with fab._lock:
            if fab._verb_faults:
                fab.faults.check_verb("peek_cq", self)
            return len(cq.entries)

    @_verb
    def enable_cq_notify(self, h_cq: Handle, solicited: bool) -> None:
        cq = self._h_cq(h_cq)
        if solicited:
            if cq.notify != MockCq.NOTIFY_NEXT:
                cq.notify = MockCq.NOTIFY_SOLICITED
        else:
            cq.notify = MockCq.NOTIFY_NEXT

    @_verb
    def enable_ncomp_cq_notify(self, h_cq: Handle, n_cqes: int) -> None:
        cq = self._h_cq(h_cq)
        if not isinstance(n_cqes, int) or not 1 <= n_cqes <= cq.size:
            raise InvalidParameter(f"n_cqes must be 1..{cq.size}")
        cq.notify_n = n_cqes

    # ============================================================= multicast
    @_verb
    def attach_mcast(self, h_qp: Handle, gid: Gid, lid: int) -> Handle:
        qp = self._h_qp(h_qp)
        if qp.qp_type is not QpType.UD:
            raise InvalidServiceType(f"only UD QPs join multicast groups, not {qp.qp_type.name}")
        if not isinstance(gid, Gid) or not gid.is_multicast:
            raise InvalidGid(f"{gid!r} is not a multicast GID")
        if not isinstance(lid, int) or not MULTICAST_LID_BASE <= lid <= 0xFFFE:
            raise InvalidLid(f"LID {lid!r} is not a multicast LID (0xC000..0xFFFE)")
        groups = self._fab._mcast
        members = groups.get(lid, [])
        for m in members:
            if m.qp is qp and m.gid == gid:
                raise InvalidParameter(f"QP 0x{qp.num:x} is already attached to {gid}")
        if not any(m.qp.ca is self for m in members):
            mine = sum(1 for ms in groups.values() if any(m.qp.ca is self for m in ms))
            if mine >= self.limits.max_mcast_grps:
                raise InsufficientResources(f"{self.name} is in {mine} groups already")
        if sum(1 for m in members if m.qp.ca is self) >= self.limits.max_qps_per_mcast_grp:
            raise MaxMcastQpsReached(f"group 0x{lid:x} has its maximum of QPs on {self.name}")
        m = MockMcast(qp, gid, lid)
        groups.setdefault(lid, []).append(m)
        qp.mcasts += 1
        return m

    @_verb
    def detach_mcast(self, h_mcast: Handle) -> None:
        m = h_mcast
        if type(m) is not MockMcast or m.qp.ca is not self or not m.alive:
            raise InvalidMcastHandle(f"not a multicast attachment of {self.name}: {m!r}")
        m.alive = False
        m.qp.mcasts -= 1
        members = self._fab._mcast[m.lid]
        members.remove(m)
        if not members:
            del self._fab._mcast[m.lid]

    # ============================================================== local MAD
    @_verb
    def local_mad(self, h_ca: Handle, port_num: int, mad: bytes) -> bytes:
        self._h_ca(h_ca)
        port = self._port_or_none(port_num)
        if port is None:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        if mad is None or len(mad) != MAD_SIZE:
            raise InvalidParameter(f"a MAD is {MAD_SIZE} bytes")
        return mad_agent.process(self, port, bytes(mad))

    # ========================================================== fault backdoor
    def inject_async_event(self, record: EventRecord) -> None:
        """Deliver ``record`` through this CA's async event callback, as if raised."""
        fab = self._fab
        with fab._lock:
            if not isinstance(record, EventRecord):
                raise InvalidParameter("inject_async_event needs an EventRecord")
            h = self._open
            if h is None:
                raise InvalidState(f"{self.name} is not open: no callback to deliver to")
            fab._upcalls.append((h, h.async_event_cb, record))
        fab._flush_upcalls()

