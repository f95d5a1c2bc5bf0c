"""Chapter: opening and closing the access layer and CAs, querying CAs."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ibal.status import (
    Error,
    InvalidAlHandle,
    InvalidCaHandle,
    InvalidGuid,
    InvalidHandle,
    InvalidIndex,
    InvalidParameter,
    InvalidPdHandle,
    InvalidPort,
    InvalidSetting,
    NoMatch,
    NotFound,
    Unsupported,
)
from ibal.testing.helpers import CallbackLog
from ibal.testing.rules import rules
from ibal.testing.suite.base import ConformanceBase, Fabric, require
from ibal.types import (
    IB_ANY_INDEX,
    VERBS_VERSION,
    CaMod,
    CiOp,
    Gid,
    LinkState,
    PortAttr,
    PortAttrMod,
    PortCap,
)

if TYPE_CHECKING:
    from ibal.al import AccessLayer, Ca
    from ibal.ci import Capabilities

DEV_PORT_ACTIVE = 0x1
"""``IB_DEV_PORT_ACTIVE`` attribute mask of ``ib_get_guid``."""


class CaChecks(ConformanceBase):
    chapter = "open/close & CA query"

    # ------------------------------------------------------------ the AL
    @rules("al:1")
    def test_open_al_gives_distinct_instances(self, fabric: Fabric) -> None:
        """access-layer rule 1: each open_al returns a new, independent AL handle."""
        a, b = fabric.manager.open_al(), fabric.manager.open_al()
        try:
            assert a is not b
            assert (a.closed, b.closed) == (False, False)
            a.close()
            assert (a.closed, b.closed) == (True, False)
            assert b.get_ca_guids()
        finally:
            for al in (a, b):
                if not al.closed:
                    al.close()

    @rules("al:5")
    def test_close_al_twice_raises_invalid_al_handle(self, al: AccessLayer) -> None:
        """access-layer rule 5: a second ib_close_al → IB_INVALID_AL_HANDLE."""
        al.close()
        with pytest.raises(InvalidAlHandle):
            al.close()

    @rules("al:6")
    def test_closed_al_refuses_every_call(self, al: AccessLayer) -> None:
        """access-layer rule 6: calls on a closed AL → IB_INVALID_AL_HANDLE."""
        guid = al.get_ca_guids()[0]
        al.close()
        with pytest.raises(InvalidAlHandle):
            al.get_ca_guids()
        with pytest.raises(InvalidAlHandle):
            al.open_ca(guid)
        with pytest.raises(InvalidAlHandle):
            al.query_ca_by_guid(guid)
        with pytest.raises(InvalidAlHandle):
            al.get_guid(0, "ca")

    @rules("al:2")
    def test_close_al_destroys_its_resources(self, al: AccessLayer, ca: Ca) -> None:
        """access-layer rule 2: closing the AL destroys its CAs, PDs, CQs; handles go invalid."""
        pd = ca.alloc_pd()
        cq = ca.create_cq(16)
        al.close()
        with pytest.raises(InvalidCaHandle):
            ca.query()
        with pytest.raises(InvalidPdHandle):
            pd.create_mw()
        with pytest.raises(InvalidHandle):
            cq.poll()

    @rules("al:2")
    def test_close_al_leaves_other_al_resources(self, fabric: Fabric, al: AccessLayer) -> None:
        """access-layer rule 2: only resources opened through the closed AL are destroyed."""
        other = fabric.manager.open_al()
        guid = al.get_ca_guids()[0]
        mine = other.open_ca(guid)
        pd = mine.alloc_pd()
        al.open_ca(guid).alloc_pd()
        al.close()
        assert mine.query().ca_guid == guid
        pd.dealloc(wait=True)
        other.close()

    @rules("al:15")
    def test_get_ca_guids_lists_every_registered_ca(self, fabric: Fabric, al: AccessLayer) -> None:
        """access-layer rule 15: the GUID list holds every CA the provider registered."""
        guids = al.get_ca_guids()
        assert sorted(guids) == sorted(fabric.registrar.present)
        assert len(set(guids)) == len(guids)

    @rules("al:7")
    def test_open_ca_unknown_guid_raises_invalid_guid(self, al: AccessLayer) -> None:
        """access-layer rule 7: a GUID matching no CA → IB_INVALID_GUID."""
        unknown = max(al.get_ca_guids()) + 0x1234_5678
        with pytest.raises(InvalidGuid):
            al.open_ca(unknown)

    @rules("ci:15")
    def test_several_als_share_one_ca(self, fabric: Fabric, al: AccessLayer) -> None:
        """ci-contract rule 15 / api.md: the AL multiplexes one CI instance; several ALs open a
        CA."""
        guid = al.get_ca_guids()[0]
        other = fabric.manager.open_al()
        try:
            a, b, c = al.open_ca(guid), al.open_ca(guid), other.open_ca(guid)
            assert a.guid == b.guid == c.guid == guid
            pa, pc = a.alloc_pd(), c.alloc_pd()
            b.close(wait=True)
            assert a.query().ca_guid == guid
            pa.dealloc(wait=True)
            pc.dealloc(wait=True)
        finally:
            other.close()

    @rules("al:8")
    def test_ca_handle_context_and_name(self, al: AccessLayer) -> None:
        """access-layer rule 8: the CA handle keeps the context given at open_ca."""
        guid = al.get_ca_guids()[0]
        token = object()
        ca = al.open_ca(guid, context=token)
        assert ca.context is token
        assert ca.guid == guid
        assert isinstance(ca.name, str) and ca.name

    # ------------------------------------------------------------ query
    @rules("ci:25")
    def test_query_ca_guid_matches_interface(self, fabric: Fabric, ca: Ca) -> None:
        """ci-contract rule 25: query_ca reports the CA GUID of the interface and its ports."""
        attr = ca.query()
        assert attr.ca_guid == ca.guid == fabric.registrar.raw[ca.guid].guid
        assert attr.num_ports >= 1
        assert [p.port_num for p in attr.ports] == list(range(1, attr.num_ports + 1))
        guids = [p.port_guid for p in attr.ports]
        assert len(set(guids)) == len(guids) and all(guids)

    @rules("ci:25")
    def test_query_ca_reports_usable_limits(self, ca: Ca) -> None:
        """ci-contract rule 25: the limits the suite relies on are reported and non-zero."""
        attr = ca.query()
        for name in ("max_pds", "max_qps", "max_wrs", "max_sges", "max_cqs", "max_cqes", "max_mrs"):
            assert getattr(attr, name) > 0, f"CaAttr.{name} is {getattr(attr, name)}"

    @rules("ci:25")
    def test_active_port_has_address(self, port: PortAttr) -> None:
        """ci-contract rule 25: an ACTIVE port has a LID (InfiniBand) or a GID (RoCE) and a
        P_Key."""
        if port.link_layer.name == "ETHERNET":
            assert port.gids, "RoCE port without GIDs"
        else:
            assert 0 < port.lid < 0xC000, f"unicast LID expected, got {port.lid:#x}"
        assert port.pkeys and port.pkeys[0] & 0x7FFF == 0x7FFF

    @rules("al:12")
    def test_query_ca_by_guid_matches_query(self, al: AccessLayer, ca: Ca) -> None:
        """access-layer rule 12: ib_query_ca_by_guid gives what ib_query_ca gives."""
        by_guid = al.query_ca_by_guid(ca.guid)
        direct = ca.query()
        assert by_guid.ca_guid == direct.ca_guid
        assert [p.port_guid for p in by_guid.ports] == [p.port_guid for p in direct.ports]

    @rules("al:12")
    def test_query_ca_by_unknown_guid_raises_invalid_guid(self, al: AccessLayer) -> None:
        """access-layer rule 12: an unknown CA GUID → IB_INVALID_GUID."""
        with pytest.raises(InvalidGuid):
            al.query_ca_by_guid(max(al.get_ca_guids()) + 0xABCDEF)

    @rules("al:16")
    def test_gid_lookups_find_owner(self, al: AccessLayer, ca: Ca, port: PortAttr) -> None:
        """access-layer rule 16: a local GID resolves to its CA GUID and port GUID."""
        if not port.gids:
            pytest.fail("ACTIVE port reports no GID")
        assert al.get_ca_by_gid(port.gids[0]) == ca.guid
        assert al.get_port_by_gid(port.gids[0]) == port.port_guid

    @rules("al:16")
    def test_gid_lookup_unknown_raises_not_found(self, al: AccessLayer) -> None:
        """access-layer rule 16: a GID on no local CA → IB_NOT_FOUND."""
        stranger = Gid("fec0::dead:beef:1234:5678")
        with pytest.raises(NotFound):
            al.get_ca_by_gid(stranger)
        with pytest.raises(NotFound):
            al.get_port_by_gid(stranger)

    @rules("al:17")
    def test_get_guid_by_index(self, al: AccessLayer) -> None:
        """access-layer rule 17: index i gives the i-th CA; IB_ANY_INDEX the first match."""
        guids = al.get_ca_guids()
        assert al.get_guid(0, "ca") == guids[0]
        assert al.get_guid(IB_ANY_INDEX, "ca") in guids
        with pytest.raises(InvalidIndex):
            al.get_guid(len(guids) + 5, "ca")

    @rules("al:17")
    def test_get_guid_invalid_device_type(self, al: AccessLayer) -> None:
        """access-layer rule 17: an invalid device type → IB_INVALID_SETTING."""
        with pytest.raises(InvalidSetting):
            al.get_guid(0, "switch")

    @rules("al:17")
    def test_get_guid_port_active_mask(self, al: AccessLayer) -> None:
        """access-layer rule 17: IB_DEV_PORT_ACTIVE matches only ports in the ACTIVE state."""
        active: list[int] = []
        idle: list[int] = []
        for guid in al.get_ca_guids():
            for p in al.query_ca_by_guid(guid).ports:
                (active if p.link_state is LinkState.ACTIVE else idle).append(p.port_guid)
        assert al.get_guid(IB_ANY_INDEX, "port", DEV_PORT_ACTIVE) in active
        for i in range(len(active) + len(idle)):
            try:
                got = al.get_guid(i, "port", DEV_PORT_ACTIVE)
            except NoMatch:
                continue
            assert got in active

    # ------------------------------------------------------------ close
    @rules("al:9")
    def test_close_ca_destroy_cb_once_with_context(self, al: AccessLayer) -> None:
        """access-layer rule 9: ib_close_ca's destroy callback runs exactly once with ca_context."""
        token = object()
        ca = al.open_ca(al.get_ca_guids()[0], context=token)
        ca.alloc_pd()
        log = CallbackLog()
        ca.close(log)
        log.wait(1)
        al.open_ca(ca.guid).close(wait=True)  # a later destroy: the first callback came before it
        assert log.snapshot() == [(token,)]

    @rules("al:10")
    def test_close_ca_invalidates_children(self, ca: Ca) -> None:
        """access-layer rule 10: closing a CA frees its PDs, CQs and their children."""
        pd = ca.alloc_pd()
        cq = ca.create_cq(8)
        ca.close(wait=True)
        with pytest.raises(InvalidCaHandle):
            ca.alloc_pd()
        with pytest.raises(InvalidPdHandle):
            pd.create_mw()
        with pytest.raises(InvalidHandle):
            cq.query()

    @rules("ci:17")
    def test_close_ca_twice_raises_invalid_ca_handle(self, ca: Ca) -> None:
        """ci-contract rule 17: closing a closed CA handle → IB_INVALID_CA_HANDLE."""
        ca.close(wait=True)
        with pytest.raises(InvalidCaHandle):
            ca.close()

    # ------------------------------------------------------------ modify
    @rules("ci:26", "al:13")
    def test_modify_ca_bad_port_raises_invalid_port(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 26 / access-layer rule 13: a port not on the CA → IB_INVALID_PORT."""
        require(caps, "modify_ca")
        bad = ca.query().num_ports + 1
        with pytest.raises(InvalidPort):
            ca.modify(bad, CaMod.IS_CM_SUPPORTED, PortAttrMod(cap=PortCap.IS_CM_SUPPORTED))

    @rules("ci:27")
    def test_modify_ca_unknown_bit_raises_invalid_parameter(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 27: an unknown command bit in ca_mod → IB_INVALID_PARAMETER."""
        require(caps, "modify_ca")
        with pytest.raises(InvalidParameter):
            ca.modify(port.port_num, CaMod(1 << 30), PortAttrMod())

    @rules("ci:29", "al:13")
    def test_modify_ca_capability_bit_visible(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 29 / access-layer rule 13: a set capability bit shows in query_ca;
        others keep."""
        require(caps, "modify_ca")
        before = ca.query().port(port.port_num).cap
        want = not (before & PortCap.IS_SNMP_SUPPORTED)
        ca.modify(
            port.port_num,
            CaMod.IS_SNMP_SUPPORTED,
            PortAttrMod(cap=PortCap.IS_SNMP_SUPPORTED if want else PortCap.NONE),
        )
        after = ca.query().port(port.port_num).cap
        assert bool(after & PortCap.IS_SNMP_SUPPORTED) == want
        assert after & ~PortCap.IS_SNMP_SUPPORTED == before & ~PortCap.IS_SNMP_SUPPORTED

    @rules("ci:28", "al:14")
    def test_modify_ca_violation_counters(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """ci-contract rule 28 / access-layer rule 14: counter reset works, or IB_UNSUPPORTED
        without them."""
        require(caps, "modify_ca")
        if not caps.violation_counters:
            with pytest.raises(Unsupported):
                ca.modify(port.port_num, CaMod.QKEY_CTR, PortAttrMod())
            return
        ca.modify(port.port_num, CaMod.QKEY_CTR | CaMod.PKEY_CTR, PortAttrMod())
        after = ca.query().port(port.port_num)
        assert after.qkey_violations == 0 and after.pkey_violations == 0

    @rules("ci:8")
    def test_modify_ca_without_capability_unsupported(
        self, ca: Ca, caps: Capabilities, port: PortAttr
    ) -> None:
        """ci-contract rule 8: a CA not declaring modify_ca refuses it with IB_UNSUPPORTED."""
        if caps.modify_ca:
            ca.modify(port.port_num, CaMod.NONE, PortAttrMod())  # an empty modify is accepted
            return
        with pytest.raises(Unsupported):
            ca.modify(port.port_num, CaMod.IS_CM_SUPPORTED, PortAttrMod())

    # ------------------------------------------------------------ ci_call / local MAD
    @rules("al:18")
    def test_ci_call_with_destroyed_handle_raises_invalid_handle(self, ca: Ca) -> None:
        """access-layer rule 18: every handle in ib_ci_call must be valid, else
        IB_INVALID_HANDLE."""
        pd = ca.alloc_pd()
        pd.dealloc(wait=True)
        with pytest.raises(InvalidHandle):
            ca.ci_call(CiOp(command=1), [pd])

    @rules("al:18")
    def test_ci_call_rejects_disallowed_handle_type(self, al: AccessLayer, ca: Ca) -> None:
        """access-layer rule 18: only PD, CQ, AV, QP, MR and MW handles may be passed."""
        with pytest.raises(InvalidHandle):
            ca.ci_call(CiOp(command=1), [al])

    @rules("ci:8", "ci:32", "al:18")
    def test_ci_call_vendor_failure_or_unsupported(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rules 8, 32 / access-layer rule 18: a command the vendor rejects →
        IB_ERROR with p_ci_op.status set; a CA without vendor calls → IB_UNSUPPORTED."""
        op = CiOp(command=0x7FFF_FFF0)
        if not caps.vendor_call:
            with pytest.raises(Unsupported):
                ca.ci_call(op, [])
            return
        with pytest.raises(Error):
            ca.ci_call(op, [])
        assert op.status != 0

    @rules("ci:100", "al:83")
    def test_local_mad_bad_port_raises_invalid_port(self, ca: Ca, caps: Capabilities) -> None:
        """ci-contract rule 100 / access-layer rule 83: local MAD on a bad port →
        IB_INVALID_PORT."""
        require(caps, "local_mad")
        with pytest.raises(InvalidPort):
            ca.local_mad(ca.query().num_ports + 1, bytes(256))

    @rules("ci:100")
    def test_local_mad_returns_a_mad(self, ca: Ca, caps: Capabilities, port: PortAttr) -> None:
        """ci-contract rule 100: a Get(NodeInfo) SMP is answered with a 256-byte response MAD."""
        require(caps, "local_mad")
        mad = bytearray(256)
        mad[0:4] = bytes([1, 0x01, 1, 0x01])  # base version, SMI LID-routed class, v1, Get
        mad[16:18] = (0x0011).to_bytes(2, "big")  # NodeInfo
        out = ca.local_mad(port.port_num, bytes(mad))
        assert len(out) == 256
        assert out[3] & 0x80, "response bit not set"
        assert out[16:18] == mad[16:18]

    @rules("ci:4", "ci:8")
    def test_interface_declares_contract_version(self, fabric: Fabric) -> None:
        """ci-contract rules 4, 8: every CA declares VERBS_VERSION and a non-zero GUID."""
        for guid, ci in fabric.registrar.raw.items():
            assert ci.version == VERBS_VERSION
            assert guid != 0 and 0 < ci.guid < 1 << 64
            assert ci.name
