"""``Ca``: one AL instance's handle on a registered CA (``ib_open_ca``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ibal.al import cq as cq_mod
from ibal.al.cq import CompCallback, Cq
from ibal.al.obj import (
    AlObject,
    CaObject,
    DestroyCallback,
    SyncDestroy,
    check_callback,
    is_handle_of,
)
from ibal.al.pd import Pd
from ibal.al.ranges import check_port_attr_mod
from ibal.ci.interface import Capabilities
from ibal.status import (
    InvalidCaHandle,
    InvalidHandle,
    InvalidIndex,
    InvalidParameter,
    InvalidPkey,
    InvalidPort,
    NotFound,
    Unsupported,
)
from ibal.types import (
    CA_MOD_VALID,
    MAD_SIZE,
    AsyncEventRec,
    CaAttr,
    CaMod,
    CiOp,
    Gid,
    GidEntry,
    PdType,
    PortAttr,
    PortAttrMod,
)

if TYPE_CHECKING:
    from ibal.al.access_layer import AccessLayer
    from ibal.al.cica import CiCa

EventCallback = Callable[[AsyncEventRec], object]


def _as_gid(gid: object) -> Gid:
    try:
        if isinstance(gid, Gid):
            return gid
        if isinstance(gid, (str, bytes)):
            return Gid(gid)
    except ValueError:
        pass
    raise InvalidParameter(f"{gid!r} is not a GID")


class Ca(CaObject):
    """An open CA.  Several AL instances may open the same CA; each gets its own ``Ca``."""

    _invalid = InvalidCaHandle
    _rank = 70
    _kind = "CA"

    def __init__(
        self, al: AccessLayer, cica: CiCa, event_cb: EventCallback | None, context: Any
    ) -> None:
        super().__init__(al, context, cica=cica)
        self._event_cb = event_cb
        self._h = cica.h_ca
        self._close_cica = False

    def _extra_victims(self) -> list[AlObject]:
        # Windows go before everything else of a closing CA: a bound type 2 window holds
        # its QP (IBA 10.6.7.2), and a QP destroyed under it makes kernel rxe (6.1) wait
        # about 50 s for the reference and warn, where the cascade's rank order (CQs and
        # the QPs on them before PDs and their windows) would put the QP first.
        return self._descendants("MW")

    # ------------------------------------------------------------------ attributes
    @property
    def guid(self) -> int:
        return self._cica.guid

    @property
    def name(self) -> str:
        return self._cica.name

    @property
    def provider_name(self) -> str:
        return self._cica.provider_name

    @property
    def capabilities(self) -> Capabilities:
        return self._cica.capabilities

    # ------------------------------------------------------------------ verbs
    def query(self) -> CaAttr:
        """``ib_query_ca``: a fresh ``CaAttr`` (no size probe: Python returns objects)."""
        self._use()
        try:
            return self._ci.query_ca(self._h)
        finally:
            self._unuse()

    def query_port(self, port_num: int) -> PortAttr:
        """One port's attributes, freshly queried (``InvalidPort`` if the CA has no such port)."""
        self._check()
        if type(port_num) is not int:
            raise InvalidPort(f"a port number is an int, not {type(port_num).__name__}")
        for port in self.query().ports:
            if port.port_num == port_num:
                return port
        raise InvalidPort(f"CA {self.name} has no port {port_num}")

    def gid_entry(self, port_num: int, index: int) -> GidEntry:
        """GID table entry ``index`` of ``port_num``: the GID, its type, its netdev.

        ``InvalidIndex`` for a hole or an index past the table.
        """
        port = self.query_port(port_num)
        if type(index) is not int:
            raise InvalidParameter(f"a GID index is an int, not {type(index).__name__}")
        entry = port.gid_entry(index)
        if entry is None:
            raise InvalidIndex(f"port {port_num} of {self.name} has no GID at index {index}")
        return entry

    def find_gid(self, port_num: int, gid: Gid | str | bytes) -> int:
        """The index of ``gid`` in ``port_num``'s GID table (the lowest when listed twice).

        ``NotFound`` when the port does not have it; ``InvalidParameter`` for
        something that is not a GID.
        """
        want = _as_gid(gid)
        index = self.query_port(port_num).gid_index(want.packed)
        if index is not None:
            return index
        raise NotFound(f"port {port_num} of {self.name} has no GID {want}")

    def find_pkey(self, port_num: int, pkey: int) -> int:
        """The index of ``pkey`` (all 16 bits, membership included) in ``port_num``'s table.

        ``NotFound`` when the port does not have it; ``InvalidPkey`` for a
        value that is not a usable P_Key (not 16 bits, or a zero base key).
        """
        if type(pkey) is not int or not 0 <= pkey <= 0xFFFF or not pkey & 0x7FFF:
            raise InvalidPkey(f"{pkey!r} is not a P_Key")
        for i, k in enumerate(self.query_port(port_num).pkeys):
            if k == pkey:
                return i
        raise NotFound(f"port {port_num} of {self.name} has no P_Key 0x{pkey:04x}")

    def modify(self, port_num: int, ca_mod: CaMod, port_attr_mod: PortAttrMod) -> None:
        """``ib_modify_ca``: port capability bits and violation counters."""
        self._check()
        if not isinstance(port_num, int) or self._cica.port(port_num) is None:
            raise InvalidPort(f"CA {self.name} has no port {port_num!r}")
        if not isinstance(ca_mod, int) or int(ca_mod) & ~int(CA_MOD_VALID):
            raise InvalidParameter(f"unknown ca_mod bits in {ca_mod!r}")
        check_port_attr_mod(port_attr_mod)
        mod = CaMod(int(ca_mod))
        caps = self._cica.capabilities
        if mod & (CaMod.QKEY_CTR | CaMod.PKEY_CTR) and not caps.violation_counters:
            raise Unsupported(caps.reason("violation_counters"))
        self._use()
        try:
            self._ci.modify_ca(self._h, port_num, mod, port_attr_mod)
        finally:
            self._unuse()

    def close(
        self,
        destroy_cb: DestroyCallback | SyncDestroy | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """``ib_close_ca``: asynchronous; everything opened on it is destroyed first."""
        self._destroy(destroy_cb, wait, timeout)

    def alloc_pd(self, pd_type: PdType = PdType.NORMAL, *, context: Any = None) -> Pd:
        """``ib_alloc_pd``."""
        self._check()
        try:
            kind = PdType(pd_type)
        except ValueError:
            raise InvalidParameter(f"unknown PD type {pd_type!r}") from None
        pd = Pd(self, kind, context)

        def make() -> None:
            pd._h = self._ci.allocate_pd(self._h, kind)

        return self._spawn(pd, make)

    def create_cq(
        self,
        size: int,
        *,
        comp_cb: CompCallback | None = None,
        event_cb: EventCallback | None = None,
        context: Any = None,
    ) -> Cq:
        """``ib_create_cq``: ``comp_cb(cq, context)`` runs on the dispatcher after a rearm."""
        self._check()
        check_callback(comp_cb, "comp_cb")
        check_callback(event_cb, "event_cb")
        cq = Cq(self, comp_cb, event_cb, context)
        cq_mod.check_size(cq, size)

        def make() -> None:
            created = self._ci.create_cq(self._h, size, cq)
            cq_mod.created(cq, created.handle, created.size)

        return self._spawn(cq, make)

    def ci_call(self, op: CiOp, handles: Sequence[AlObject] = ()) -> CiOp:
        """``ib_ci_call``: the vendor escape hatch, with PD/CQ/AV/QP/MR/MW handles."""
        from ibal.al.av import Av
        from ibal.al.mr import Mr, Mw
        from ibal.al.qp import Qp

        self._check()
        if not isinstance(op, CiOp):
            raise InvalidParameter("a CiOp is required")
        allowed = (Pd, Cq, Av, Qp, Mr, Mw)
        objs = list(handles)
        for h in objs:
            if not is_handle_of(h, allowed, self._al, self._cica):
                raise InvalidHandle(f"{h!r} cannot be passed to ci_call")
        used: list[AlObject] = []
        try:
            for h in objs:
                try:
                    h._use()
                except InvalidHandle:
                    raise InvalidHandle(f"{h!r} was destroyed") from None
                used.append(h)
            self._use()
            used.append(self)
            return self._ci.vendor_call(self._h, [h.ci_handle for h in objs], op)
        finally:
            for h in used:
                h._unuse()

    def local_mad(self, port_num: int, mad: bytes) -> bytes:
        """``ib_local_mad``: the CA's response to a 256-byte MAD on ``port_num``."""
        self._check()
        if not isinstance(port_num, int) or self._cica.port(port_num) is None:
            raise InvalidPort(f"CA {self.name} has no port {port_num!r}")
        try:
            data = bytes(mad) if isinstance(mad, (bytes, bytearray, memoryview)) else b""
        except ValueError:  # a released memoryview
            data = b""
        if len(data) != MAD_SIZE:
            raise InvalidParameter(f"a MAD is {MAD_SIZE} bytes")
        self._use()
        try:
            return self._ci.local_mad(self._h, port_num, data)
        finally:
            self._unuse()

    def query_port_counters(self, port_num: int) -> dict[str, int]:
        """The provider's named counters of ``port_num`` (``Unsupported`` without them)."""
        self._check()
        if not isinstance(port_num, int) or self._cica.port(port_num) is None:
            raise InvalidPort(f"CA {self.name} has no port {port_num!r}")
        if not self._cica.capabilities.port_counters:
            raise Unsupported(
                f"{self.name}: port counters: {self._cica.capabilities.reason('port_counters')}"
            )
        self._use()
        try:
            return dict(self._ci.query_port_counters(self._h, port_num))
        finally:
            self._unuse()

    # ------------------------------------------------------------------ life cycle
    def _unlink(self) -> None:
        cica = self._cica
        cica.cas.pop(self, None)
        if cica.removing and not cica.cas and not cica.closing:
            cica.closing = True
            self._close_cica = True

    def _after_free(self) -> None:
        if self._close_cica:
            self._mgr._close_cica(self._cica)
