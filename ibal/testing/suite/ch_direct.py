"""Chapter: the provider on its own.

The access layer checks many arguments before a provider sees them
(:data:`ibal.testing.rules.AL_ENFORCED` lists where).  A provider must not lean
on that: another access layer, a test harness or a future ibal may call it
directly.  Each check here calls the provider's ``ChannelInterface`` with what
the access layer would have refused, and asserts the status the contract
gives, with nothing created and the provider still usable.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from ibal.status import (
    InsufficientResources,
    InvalidGid,
    InvalidLid,
    InvalidMaxSge,
    InvalidParameter,
    InvalidPermission,
    InvalidPkey,
    InvalidPort,
    InvalidQpState,
    InvalidServiceType,
    InvalidWrType,
    NotFound,
    PostError,
    Unsupported,
)
from ibal.testing.helpers import UD_QKEY, is_roce
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, require, require_qp_type
from ibal.testing.suite.ch_contract import RawCa, address_of
from ibal.types import (
    AccessFlags,
    BindWr,
    CaMod,
    Gid,
    MrModMask,
    PdType,
    PortAttrMod,
    QpCaps,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    Sge,
    UdDest,
    WcStatus,
    WrType,
)

if TYPE_CHECKING:
    from ibal.ci import ChannelInterface, QpCreated

UNICAST_GID = Gid("fe80::1")
_RW = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
MCAST_GID = Gid("ff12:401b:ffff::d1")
MCAST_LID = 0xC0D1


def _post_refused(exc: type[Exception], index: int) -> Any:
    """``pytest.raises`` for a post verb refusing at WR ``index`` (a ``PostError``)."""
    return _PostRefused(exc, index)


class _PostRefused:
    def __init__(self, exc: type[Exception], index: int) -> None:
        self.raises = pytest.raises(exc)
        self.index = index

    def __enter__(self) -> None:
        self.raises.__enter__()

    def __exit__(self, *exc_info: Any) -> bool:
        handled = bool(self.raises.__exit__(*exc_info))
        err = self.raises.excinfo.value if self.raises.excinfo else None
        assert isinstance(err, PostError), f"{type(err).__name__} is not a PostError"
        assert err.failed_index == self.index, f"failed at WR {err.failed_index}, not {self.index}"
        return handled


class Ready(NamedTuple):
    """A raw QP ready to send (see :meth:`DirectChecks._ready`)."""

    qp: QpCreated
    h_cq: Any
    keys: Any
    ud: UdDest | None
    h_pd: Any

    def sge(self, offset: int = 0, length: int = 8) -> Sge:
        return Sge(self.keys.vaddr + offset, length, self.keys.lkey)

    def send(self, wr_id: int) -> SendWr:
        """A signaled WR that completes without a receive: a UD SEND, or an RC RDMA WRITE
        into the region's second half."""
        opcode = WrType.SEND if self.ud is not None else WrType.RDMA_WRITE
        return SendWr(wr_id=wr_id, opcode=opcode, sg_list=[self.sge()], ud=self.ud,
                      remote_addr=self.keys.vaddr + 2048, rkey=self.keys.rkey)  # fmt: skip


class DirectChecks(ConformanceBase):
    chapter = "provider on its own (direct CI)"

    @pytest.fixture
    def rawca(self, raw_cis: list[ChannelInterface]) -> Iterator[RawCa]:
        """The provider's first CA opened directly (no access layer)."""
        ca = RawCa(raw_cis[0])
        try:
            yield ca
        finally:
            ca.close()

    # ------------------------------------------------------------ helpers
    @staticmethod
    def _transport(raw: RawCa) -> QpType:
        """UD when the CA has it (no peer needed to reach RTS), else RC."""
        return QpType.UD if QpType.UD in raw.ci.capabilities.qp_types else QpType.RC

    def _ready(self, raw: RawCa, depth: int = 4, sges: int = 1) -> Ready:
        """A QP in RTS (UD, or RC looped to a second QP), its CQ, a 4 KiB region's keys and
        the UD addressing back to the QP itself (``None`` for RC)."""
        h_pd = raw.pd()
        cq = raw.cq(64)
        qt = self._transport(raw)
        caps = QpCaps(sq_depth=depth, rq_depth=depth, sq_sge=sges, rq_sge=sges)
        qp = raw.qp(h_pd, qt, cq.handle, caps)
        ud = None
        if qt is QpType.UD:
            raw.ud_ready(qp.handle)
            h_av = raw.ci.create_av(h_pd, raw.av_attr())
            raw.later(lambda: raw.ci.destroy_av(h_av))
            ud = UdDest(av=h_av, remote_qp=qp.attr.qp_num, remote_qkey=UD_QKEY)
        else:
            peer = raw.qp(h_pd, qt, cq.handle, caps)
            raw.rc_ready(qp.handle, peer.attr.qp_num)
            raw.rc_ready(peer.handle, qp.attr.qp_num)
        keys = raw.mr(h_pd, bytearray(4096), AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE)
        return Ready(qp, cq.handle, keys, ud, h_pd)

    # ------------------------------------------------------------- checks
    @rules("ci:26", "al:13")
    def test_ci_modify_ca_bad_port_raises_invalid_port(self, rawca: RawCa) -> None:
        """ci-contract rule 26: ci_modify_ca on a port the CA lacks → IB_INVALID_PORT (a CA
        without modify_ca may say IB_UNSUPPORTED instead)."""
        caps = rawca.ci.capabilities
        bad = max(p.port_num for p in rawca.attr.ports) + 1
        expected: Any = InvalidPort if caps.modify_ca else (InvalidPort, Unsupported)
        with pytest.raises(expected):
            rawca.ci.modify_ca(rawca.h, bad, CaMod.IS_SNMP_SUPPORTED, PortAttrMod())

    @rules("ci:27")
    def test_ci_modify_ca_unknown_bit_raises_invalid_parameter(self, rawca: RawCa) -> None:
        """ci-contract rule 27: an unknown ca_mod bit → IB_INVALID_PARAMETER at the provider."""
        require(rawca.ci.capabilities, "modify_ca")
        with pytest.raises(InvalidParameter):
            rawca.ci.modify_ca(rawca.h, rawca.port.port_num, CaMod(1 << 30), PortAttrMod())

    @rules("ci:47", "ci:49")
    def test_ci_create_qp_too_many_sges_raises_invalid_max_sge(self, rawca: RawCa) -> None:
        """ci-contract rules 47, 49: more SGEs than the CA's maximum → IB_INVALID_MAX_SGE and
        no QP left on the PD."""
        h_pd = rawca.ci.allocate_pd(rawca.h, PdType.NORMAL)
        cq = rawca.cq()
        too_many = QpCaps(sq_sge=rawca.attr.max_sges + 1, rq_sge=1)
        with pytest.raises(InvalidMaxSge):
            rawca.ci.create_qp(h_pd, self._transport(rawca), too_many, cq.handle, cq.handle, None,
                               True, "qp")  # fmt: skip
        rawca.ci.deallocate_pd(h_pd)

    @rules("ci:48")
    def test_ci_create_qp_unsupported_type_refused(self, rawca: RawCa) -> None:
        """ci-contract rule 48: a transport the CA lacks (RD, or what it leaves out) →
        IB_INVALID_SERVICE_TYPE or IB_UNSUPPORTED."""
        caps = rawca.ci.capabilities
        lacking = [t for t in (QpType.RD, QpType.UC, QpType.UD) if t not in caps.qp_types]
        if not lacking:
            pytest.skip("provider lacks nothing of RD, UC and UD: no transport to refuse")
        h_pd = rawca.pd()
        cq = rawca.cq()
        for qt in lacking:
            with pytest.raises((InvalidServiceType, Unsupported)):
                rawca.ci.create_qp(h_pd, qt, QpCaps(), cq.handle, cq.handle, None, True, "qp")

    @rules("ci:55", "iba:qps.transitions")
    def test_ci_illegal_transition_raises_invalid_qp_state(self, rawca: RawCa) -> None:
        """ci-contract rule 55: RESET → RTS (and RESET → RTR) at the provider →
        IB_INVALID_QP_STATE; the QP stays in RESET."""
        h_pd = rawca.pd()
        cq = rawca.cq()
        qp = rawca.qp(h_pd, self._transport(rawca), cq.handle)
        for mod in (QpMod(QpState.RTS, sq_psn=0), QpMod(QpState.RTR)):
            with pytest.raises(InvalidQpState):
                rawca.ci.modify_qp(qp.handle, mod)
            assert rawca.ci.query_qp(qp.handle).state is QpState.RESET

    @rules("ci:56")
    def test_ci_bad_pkey_index_raises_invalid_pkey(self, rawca: RawCa) -> None:
        """ci-contract rule 56: a P_Key index past the port's table → IB_INVALID_PKEY."""
        h_pd = rawca.pd()
        cq = rawca.cq()
        qt = self._transport(rawca)
        qp = rawca.qp(h_pd, qt, cq.handle)
        bad = max(len(rawca.port.pkeys), 1)
        mod = QpMod(QpState.INIT, pkey_index=bad, port_num=rawca.port.port_num, qkey=UD_QKEY)
        if not qt.is_datagram:
            mod = QpMod(QpState.INIT, pkey_index=bad, port_num=rawca.port.port_num,
                        access=AccessFlags.LOCAL_WRITE)  # fmt: skip
        with pytest.raises(InvalidPkey):
            rawca.ci.modify_qp(qp.handle, mod)
        assert rawca.ci.query_qp(qp.handle).state is QpState.RESET

    @rules("ci:58")
    def test_ci_atomic_access_matches_capability(self, rawca: RawCa) -> None:
        """ci-contract rule 58: enabling remote atomics on an RC QP of a CA without atomics →
        IB_UNSUPPORTED and the QP stays in RESET; with atomics the right is granted."""
        caps = rawca.ci.capabilities
        require_qp_type(caps, QpType.RC)
        h_pd = rawca.pd()
        cq = rawca.cq()
        qp = rawca.qp(h_pd, QpType.RC, cq.handle)
        access = AccessFlags.LOCAL_WRITE | AccessFlags.ATOMIC
        mod = QpMod(QpState.INIT, pkey_index=0, port_num=rawca.port.port_num, access=access)
        if not caps.atomics:
            with pytest.raises(Unsupported):
                rawca.ci.modify_qp(qp.handle, mod)
            assert rawca.ci.query_qp(qp.handle).state is QpState.RESET
            return
        assert AccessFlags.ATOMIC in rawca.ci.modify_qp(qp.handle, mod).access

    @rules("ci:75", "al:52")
    def test_ci_remote_write_without_local_write_refused(self, rawca: RawCa) -> None:
        """ci-contract rule 75: registering remote write or atomic without local write →
        IB_INVALID_PERMISSION; nothing is registered."""
        h_pd = rawca.ci.allocate_pd(rawca.h, PdType.NORMAL)
        buf = bytearray(64)

        rights = [AccessFlags.RDMA_WRITE]
        if rawca.ci.capabilities.atomics:
            rights.append(AccessFlags.ATOMIC)
        for access in rights:
            with pytest.raises(InvalidPermission):
                rawca.ci.register_mr(h_pd, memoryview(buf), address_of(buf), access)
        rawca.ci.deallocate_pd(h_pd)  # busy if a refused registration stayed

    @rules("ci:81")
    def test_ci_modify_mr_bad_mask_raises_invalid_parameter(self, rawca: RawCa) -> None:
        """ci-contract rule 81: ci_modify_mr with an empty or unknown mask →
        IB_INVALID_PARAMETER; the region keeps its keys."""
        require(rawca.ci.capabilities, "modify_mr")
        h_pd = rawca.pd()
        keys = rawca.mr(h_pd, bytearray(64))
        for mask in (MrModMask(0), MrModMask(1 << 7)):
            with pytest.raises(InvalidParameter):
                rawca.ci.modify_mr(keys.handle, mask, None, None, None, None)
        assert rawca.ci.query_mr(keys.handle).lkey == keys.lkey

    @rules("ci:90", "iba:qps.rtr")
    def test_ci_post_send_in_rtr_raises_invalid_qp_state(self, rawca: RawCa) -> None:
        """ci-contract rule 90: sends are refused in RTR at the provider, at the first WR."""
        h_pd = rawca.pd()
        cq = rawca.cq()
        qt = self._transport(rawca)
        qp = rawca.qp(h_pd, qt, cq.handle)
        if qt is QpType.UD:
            rawca.ci.modify_qp(qp.handle, QpMod(QpState.INIT, pkey_index=0,
                                                port_num=rawca.port.port_num, qkey=UD_QKEY))
            rawca.ci.modify_qp(qp.handle, QpMod(QpState.RTR))  # fmt: skip
        else:
            peer = rawca.qp(h_pd, qt, cq.handle)
            access = AccessFlags.LOCAL_WRITE
            rawca.ci.modify_qp(qp.handle, QpMod(QpState.INIT, pkey_index=0,
                                                port_num=rawca.port.port_num, access=access))
            rawca.ci.modify_qp(qp.handle, QpMod(QpState.RTR, primary_av=rawca.av_attr(),
                                                path_mtu=rawca.port.active_mtu,
                                                dest_qp=peer.attr.qp_num, rq_psn=0, resp_res=1,
                                                rnr_nak_timeout=1))  # fmt: skip
        assert rawca.ci.query_qp(qp.handle).state is QpState.RTR
        keys = rawca.mr(h_pd, bytearray(16))
        with _post_refused(InvalidQpState, 0):
            rawca.ci.post_send(qp.handle, [SendWr(sg_list=[Sge(keys.vaddr, 4, keys.lkey)])])

    @rules("ci:91", "al:48")
    def test_ci_post_send_beyond_sq_depth_refused_at_that_wr(self, rawca: RawCa) -> None:
        """ci-contract rule 91: a list longer than the free SQ slots → IB_INSUFFICIENT_RESOURCES
        at the first WR that does not fit; the ones before it are posted."""
        r = self._ready(rawca, depth=4)
        depth = r.qp.attr.caps.sq_depth
        wrs = [r.send(i) for i in range(depth + 1)]
        with _post_refused(InsufficientResources, depth):
            rawca.ci.post_send(r.qp.handle, wrs)

    @rules("ci:92", "al:49")
    def test_ci_post_send_too_many_sges_raises_invalid_max_sge(self, rawca: RawCa) -> None:
        """ci-contract rule 92: a WR with more SGEs than the QP was granted →
        IB_INVALID_MAX_SGE at that WR."""
        r = self._ready(rawca, sges=1)
        granted = r.qp.attr.caps.sq_sge
        sgl = [r.sge(8 * i) for i in range(granted + 1)]
        with _post_refused(InvalidMaxSge, 0):
            rawca.ci.post_send(r.qp.handle, [SendWr(sg_list=sgl, ud=r.ud)])

    @rules("ci:92", "al:49")
    def test_ci_post_send_unknown_opcode_raises_invalid_wr_type(self, rawca: RawCa) -> None:
        """ci-contract rule 92: an opcode outside ib_wr_type_t → IB_INVALID_WR_TYPE; one the
        transport lacks (RDMA READ on UD) → IB_INVALID_WR_TYPE or IB_UNSUPPORTED."""
        r = self._ready(rawca)
        bogus = SendWr(opcode=99, sg_list=[r.sge()], ud=r.ud)  # type: ignore[arg-type]
        with _post_refused(InvalidWrType, 0):
            rawca.ci.post_send(r.qp.handle, [bogus])
        if r.ud is not None:
            read = SendWr(opcode=WrType.RDMA_READ, sg_list=[r.sge()], remote_addr=r.keys.vaddr,
                          rkey=1, ud=r.ud)  # fmt: skip
            with pytest.raises((InvalidWrType, Unsupported)):
                rawca.ci.post_send(r.qp.handle, [read])

    @rules("ci:92", "al:49")
    def test_ci_unlisted_invalidate_opcodes_refused(self, rawca: RawCa) -> None:
        """access-layer rule 49 / ci-contract rule 92: an invalidate opcode the CA does not list
        → IB_UNSUPPORTED or IB_INVALID_WR_TYPE from the provider, at that WR."""
        r = self._ready(rawca)
        caps = rawca.ci.capabilities
        qt = r.qp.attr.qp_type
        unlisted = [op for op in (WrType.LOCAL_INV, WrType.SEND_WITH_INV)
                    if not caps.supports_opcode(qt, op)]  # fmt: skip
        if not unlisted:
            pytest.skip(f"provider lists LOCAL_INV and SEND_WITH_INV for {qt.name}")
        for op in unlisted:
            wr = SendWr(wr_id=3, opcode=op, sg_list=[r.sge()], ud=r.ud, invalidate_rkey=1)
            with pytest.raises((Unsupported, InvalidWrType)) as info:
                rawca.ci.post_send(r.qp.handle, [r.send(1), wr])
            assert isinstance(info.value, PostError) and info.value.failed_index == 1
            (wc,) = rawca.poll(r.h_cq)
            assert (wc.wr_id, wc.status) == (1, WcStatus.SUCCESS), "the WR before it was lost"

    @rules("ci:93", "al:48")
    def test_ci_post_recv_beyond_rq_depth_refused_at_that_wr(self, rawca: RawCa) -> None:
        """ci-contract rule 93: receives beyond the RQ depth → IB_INSUFFICIENT_RESOURCES at the
        first that does not fit."""
        r = self._ready(rawca, depth=4)
        depth = r.qp.attr.caps.rq_depth
        wrs = [RecvWr(wr_id=i, sg_list=[r.sge(0, 64)]) for i in range(depth + 1)]
        with _post_refused(InsufficientResources, depth):
            rawca.ci.post_recv(r.qp.handle, wrs)

    @rules("ci:98", "al:29")
    def test_ci_ncomp_notify_bad_count_raises_invalid_parameter(self, rawca: RawCa) -> None:
        """ci-contract rule 98: enable_ncomp_cq_notify with 0 or more than the CQ holds →
        IB_INVALID_PARAMETER (IB_UNSUPPORTED from a CA without it); 1 and the CQ's size are
        taken."""
        cq = rawca.cq(16)
        for n in (0, cq.size + 1):
            expected = InvalidParameter if rawca.ci.capabilities.rearm_n_cq else Unsupported
            with pytest.raises(expected):
                rawca.ci.enable_ncomp_cq_notify(cq.handle, n)
        if rawca.ci.capabilities.rearm_n_cq:
            for n in (1, cq.size):  # both ends of the valid range are taken
                rawca.ci.enable_ncomp_cq_notify(cq.handle, n)

    @rules("ci:99")
    def test_ci_attach_mcast_checks_its_arguments(self, rawca: RawCa) -> None:
        """ci-contract rule 99: attach on a non-UD QP → IB_INVALID_SERVICE_TYPE, a unicast GID
        → IB_INVALID_GID, a unicast LID → IB_INVALID_LID (InfiniBand), at the provider."""
        caps = rawca.ci.capabilities
        require(caps, "multicast")
        require_qp_type(caps, QpType.UD)
        h_pd = rawca.pd()
        cq = rawca.cq()
        ud = rawca.qp(h_pd, QpType.UD, cq.handle)
        rawca.ud_ready(ud.handle)
        with pytest.raises(InvalidGid):
            rawca.ci.attach_mcast(ud.handle, UNICAST_GID, MCAST_LID)
        if not is_roce(rawca.port):  # RoCE carries no LIDs: nothing to refuse
            with pytest.raises(InvalidLid):
                rawca.ci.attach_mcast(ud.handle, MCAST_GID, 0x0001)
        connected = [t for t in (QpType.RC, QpType.UC) if t in caps.qp_types]
        for qt in connected:
            qp = rawca.qp(h_pd, qt, cq.handle)
            with pytest.raises(InvalidServiceType):
                rawca.ci.attach_mcast(qp.handle, MCAST_GID, MCAST_LID)
        rawca.ci.detach_mcast(rawca.ci.attach_mcast(ud.handle, MCAST_GID, MCAST_LID))

    @rules("ci:52")
    def test_ci_special_qp_on_unknown_port_refused(self, rawca: RawCa) -> None:
        """ci-contract rule 52: ci_create_spl_qp on a port the CA lacks → IB_INVALID_PORT (or
        IB_NOT_FOUND)."""
        caps = rawca.ci.capabilities
        if not caps.special_qps:
            pytest.skip(f"provider lacks special_qps: {caps.reason('special_qps')}")
        h_pd = rawca.pd()
        cq = rawca.cq()
        bad = max(p.port_num for p in rawca.attr.ports) + 1
        qt = sorted(caps.special_qps)[0]
        with pytest.raises((InvalidPort, NotFound)):
            rawca.ci.create_spl_qp(h_pd, bad, qt, QpCaps(), cq.handle, cq.handle, "spl")

    @rules("ci:87")
    def test_ci_bind_on_ud_qp_raises_invalid_service_type(self, rawca: RawCa) -> None:
        """ci-contract rule 87: ci_bind_mw through a UD QP → IB_INVALID_SERVICE_TYPE; the window
        stays unbound."""
        caps = rawca.ci.capabilities
        require(caps, "mw_types")
        require_qp_type(caps, QpType.UD)
        if 1 not in caps.mw_types:
            pytest.skip(f"provider lacks mw_types 1: {caps.reason('mw_types')}")
        h_pd = rawca.pd()
        cq = rawca.cq()
        ud = rawca.qp(h_pd, QpType.UD, cq.handle)
        rawca.ud_ready(ud.handle)
        keys = rawca.mr(h_pd, bytearray(256),
                        AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.MW_BIND)
        mw = rawca.ci.create_mw(h_pd, 1)
        rawca.later(lambda: rawca.ci.destroy_mw(mw.handle))
        bind = BindWr(mr=keys.handle, addr=keys.vaddr, length=64, access=AccessFlags.RDMA_WRITE,
                      current_rkey=mw.rkey)
        with pytest.raises(InvalidServiceType):
            rawca.ci.bind_mw(mw.handle, ud.handle, bind)
        assert rawca.ci.query_mw(mw.handle) == mw.rkey

    @rules("ci:10", "ci:74")
    def test_ci_keys_stay_distinct_32_bit_through_churn(self, rawca: RawCa) -> None:
        """ci-contract rules 10, 74: through 300 registrations and deregistrations (past any
        8-bit key counter) every key is a non-zero 32-bit value, no live region shares one,
        and the last region still reaches its bytes."""
        r = self._ready(rawca)
        live: list[Any] = []
        for i in range(300):
            keys = rawca.mr(r.h_pd, bytearray(16), _RW)  # close() skips what was freed
            for kind in ("lkey", "rkey"):
                v = getattr(keys, kind)
                assert 0 < v < 1 << 32, f"registration {i}: {kind} {v:#x} outside 1..2^32-1"
                assert v not in {getattr(k, kind) for k in live}, f"registration {i}: a live {kind}"
            if i % 30 == 0:
                live.append(keys)  # kept: later keys must stay clear of it
            else:
                rawca.ci.deregister_mr(keys.handle)
        last = live[-1]
        attr = rawca.ci.query_mr(last.handle)
        assert (attr.lkey, attr.rkey) == (last.lkey, last.rkey)
        wr = replace(r.send(9), sg_list=[Sge(last.vaddr, 8, last.lkey)])
        rawca.ci.post_send(r.qp.handle, [wr])
        (wc,) = rawca.poll(r.h_cq)
        assert (wc.wr_id, wc.status) == (9, WcStatus.SUCCESS), "a kept region's L_Key failed"

    @rules("ci:18", "ci:36")
    def test_ci_refusals_leave_the_ca_usable(self, rawca: RawCa) -> None:
        """ci-contract rules 18, 36: after refused verbs the CA still moves data and closes
        cleanly once its objects are gone (nothing half-made holds it)."""
        r = self._ready(rawca)
        with pytest.raises(InvalidQpState):
            rawca.ci.modify_qp(r.qp.handle, QpMod(QpState.RTR))  # RTS → RTR is no transition
        rawca.ci.post_send(r.qp.handle, [r.send(5)])
        (wc,) = rawca.poll(r.h_cq)
        assert (wc.wr_id, wc.status) == (5, WcStatus.SUCCESS)
