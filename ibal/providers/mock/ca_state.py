"""State every mock CA verb module shares: identity, limits, handle checks, the verb lock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from ibal import osrandom
from ibal.ci.interface import (
    Capabilities,
    Handle,
)
from ibal.providers.mock.objects import (
    MockAv,
    MockCq,
    MockFmr,
    MockMr,
    MockMw,
    MockPd,
    MockQp,
    MockSrq,
    OpenCa,
)
from ibal.providers.mock.topology import MockPort
from ibal.providers.softca import SoftCa, shared
from ibal.status import (
    InvalidAvHandle,
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidFmrHandle,
    InvalidMrHandle,
    InvalidMwHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPort,
    InvalidQpHandle,
    InvalidSrqHandle,
    InvalidState,
)
from ibal.types import (
    AvAttr,
    QpState,
    QpType,
    SendOpt,
    SrqAttr,
    WrType,
)

if TYPE_CHECKING:
    from ibal.providers.mock.engine import Engine
    from ibal.providers.mock.fabric import MockFabric

P = ParamSpec("P")
R = TypeVar("R")
_Obj = TypeVar("_Obj")
_Ca = TypeVar("_Ca", bound="CaState")

MOCK_OUI = 0x02_1B_A1
"""A locally administered company ID: the mock's GUIDs are EUI-64s under it."""

MOCK_DEVICE_ID = 0x1BA1
MOCK_REVISION = 1
FW_VERSION = "1.0.0 (ibal mock)"

SIGNALED = int(SendOpt.SIGNALED)
IMMEDIATE = int(SendOpt.IMMEDIATE)
SOLICITED = int(SendOpt.SOLICITED)
FENCE = int(SendOpt.FENCE)
INLINE = int(SendOpt.INLINE)

RTS = QpState.RTS
SQD = QpState.SQD
RESET = QpState.RESET
ERROR = QpState.ERROR
SQERR = QpState.SQERR
FLUSHING = frozenset({ERROR, SQERR})  # posted sends complete WR_FLUSHED_ERR at once

OPCODES: dict[QpType, frozenset[WrType]] = {
    QpType.RC: frozenset(WrType),
    # UC has no SEND with invalidate opcodes (IBA 9.2); the local ones work on it
    QpType.UC: frozenset({WrType.SEND, WrType.RDMA_WRITE, WrType.LOCAL_INV, WrType.BIND_MW}),
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


verb = shared
"""A mock verb runs under the fabric lock, with verb faults, and makes upcalls after
(:meth:`CaState._verb`)."""


class CaState(SoftCa):
    """Identity, limits, live-resource counters and handle checks of one mock CA."""

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
        self._fabric = fabric
        # the verbs drive the engine directly; the fabric only for topology
        self._engine: Engine = fabric.engine
        self.index = index
        self.name: str = name
        self.guid: int = guid
        self.system_image_guid = guid
        self.limits = limits
        self.description = description or f"ibal mock CA {name}"
        # ci_interface_t identity: no user-mode library, so vendor fields are zero.
        self.vendor_id: int = 0
        self.device_id: int = 0
        self.revision: int = 0
        # What query_ca / NodeInfo report.
        self.attr_vendor_id = MOCK_OUI
        self.attr_device_id = MOCK_DEVICE_ID
        self.attr_revision = MOCK_REVISION
        self.violation_counters = violation_counters
        self.ports: list[MockPort] = []
        self.opened: OpenCa | None = None
        self.qps: dict[int, MockQp] = {}
        self.keys: dict[int, MockMr | MockMw] = {}
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
            "qp_types": "reliable datagram (EE contexts) is not implemented",
            "special_qps": "QP0 and QP1 only: raw IPv6 / Ethertype QPs need a real link layer",
            "mad_agents": "QP0/QP1 are special QPs the access layer owns and shares",
            "port_counters": "the fabric counts for all its ports at once (fabric.counters)",
        }
        if not self.violation_counters:
            reasons["violation_counters"] = "this CA was created without P_Key/Q_Key counters"
        return Capabilities(
            qp_types=frozenset({QpType.RC, QpType.UC, QpType.UD}),
            opcodes=dict(OPCODES),
            special_qps=frozenset({QpType.QP0, QpType.QP1}),
            atomics=True,
            mw_types=frozenset({1, 2}),
            srq=True,
            peek_cq=True,
            rearm_n_cq=True,
            resize_cq=True,
            multicast=True,
            phys_mr=True,
            shared_mr=True,
            modify_mr=True,
            fmr=True,
            local_mad=True,
            vendor_call=True,
            violation_counters=self.violation_counters,
            resize_qp=True,
            modify_ca=True,
            inline_data=True,
            immediate=True,
            solicited_events=True,
            sqd=True,
            apm=True,
            async_event_injection=True,
            reasons=reasons,
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def fabric(self) -> MockFabric:
        return self._fabric

    def port(self, port_num: int) -> MockPort:
        """Port ``port_num`` (from 1) of this CA."""
        found = self.port_or_none(port_num)
        if found is None:
            raise InvalidPort(f"{self.name} has no port {port_num}")
        return found

    def port_or_none(self, port_num: int) -> MockPort | None:
        if isinstance(port_num, int) and 1 <= port_num <= len(self.ports):
            return self.ports[port_num - 1]
        return None

    def resource_counts(self) -> dict[str, int]:
        """Live resources by kind (``pd``, ``cq``, ``qp``, ``srq``, ``av``, ``mr``, ``mw``)."""
        return dict(self._n)

    def _verb(self, name: str, fn: Callable[..., R], /, *args: Any, **kwargs: Any) -> R:
        fab = self._engine
        try:
            with fab.lock:
                if fab.verb_faults_armed:
                    fab.faults.check_verb(name, self)
                return fn(*args, **kwargs)
        finally:
            if fab.upcalls:
                fab.flush_upcalls()

    @property
    def _lim(self) -> CaLimits:
        return self.limits

    def _make_srq(self, pd: MockPd, attr: SrqAttr, context: Any) -> MockSrq:
        return MockSrq(self, pd, attr.max_wr, attr.max_sge, attr.srq_limit, context)

    # ========================================================== handle checks
    def _h_ca(self, h: Handle) -> OpenCa:
        if type(h) is not OpenCa or h.ca is not self or not h.alive:
            raise InvalidCaHandle(f"not an open handle of {self.name}: {h!r}")
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

    def _h_fmr(self, h: Handle) -> MockFmr:
        return self._own(h, MockFmr, InvalidFmrHandle, "an FMR")

    def _no_callback(self, verb: str) -> None:
        if self._engine.in_callback():
            raise InvalidState(f"{verb} may not be called from a provider callback")

    def _new_key(self) -> int:
        # the key byte from the OS, as Linux drivers draw it: a peer that saw one key
        # must not be able to name the next region's (index times a constant could)
        index = self._next_key
        self._next_key += 1
        return ((index & 0xFFFFFF) << 8) | osrandom.randbits(8)

    @staticmethod
    def _rekey(key: int) -> int:
        """Another key byte for the same index (never the old one)."""
        return (key & ~0xFF) | ((key + 1 + osrandom.randbits(8) % 255) & 0xFF)

    def _check_av(self, attr: AvAttr) -> None:
        if not isinstance(attr, AvAttr):
            raise InvalidParameter("address vector attributes missing")
        if self.port_or_none(attr.port_num) is None:
            raise InvalidPort(f"{self.name} has no port {attr.port_num}")
        if not 0 <= attr.dlid <= 0xFFFF:
            raise InvalidParameter(f"DLID 0x{attr.dlid:x} out of range")
        if attr.grh is not None and attr.grh.sgid_index != 0:
            raise InvalidParameter(f"SGID index {attr.grh.sgid_index}: each port has one GID")

