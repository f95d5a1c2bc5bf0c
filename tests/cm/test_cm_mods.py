"""ibal.cm.wire's QpMods: what a REQ and a REP make of the QPs at both ends.

Pure checks on RoCE and IB port records (every attribute the modifies carry,
accepted by the QP state machine's rules), then two QPs of the mock fabric
connected with nothing but the REQ/REP bytes and the derived modifies: data
lands, and each QP reports the attributes the other side asked for.
"""

from __future__ import annotations

from collections.abc import Iterator
from ipaddress import IPv6Address
from typing import Any

import pytest

import ibal
from ibal.al import AccessLayer, QpCreate
from ibal.cm import records as R
from ibal.cm import wire as W
from ibal.qp_fsm import check_modify
from ibal.status import InvalidParameter
from ibal.types import (
    AccessFlags,
    ApmState,
    GidEntry,
    GidType,
    LinkLayer,
    Mtu,
    PortAttr,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendWr,
    WcStatus,
    WrType,
)
from ibal.wire.mad.cm import CmAttr, RejReason

QP = object()
ACCESS = AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE | AccessFlags.RDMA_READ
IP_A, IP_B = "::ffff:10.0.0.1", "::ffff:10.0.0.2"


def _cb(*_: Any) -> None:
    return None


def roce_port(ip: str, *extra: str) -> PortAttr:
    gids = [GidEntry(0, IPv6Address("fe80::1"), GidType.ROCE_V1, "eth0"),
            GidEntry(1, IPv6Address("fe80::1"), GidType.ROCE_V2, "eth0"),
            GidEntry(2, IPv6Address(ip), GidType.ROCE_V1, "eth0"),
            GidEntry(3, IPv6Address(ip), GidType.ROCE_V2, "eth0")]  # fmt: skip
    gids += [GidEntry(4 + i, IPv6Address(g), GidType.ROCE_V2, "eth1") for i, g in enumerate(extra)]
    return PortAttr(port_num=1, port_guid=1, link_layer=LinkLayer.ETHERNET,
                    active_mtu=Mtu.MTU_4096, gid_table=tuple(gids))  # fmt: skip


def path(src: str = IP_A, dst: str = IP_B, **kw: Any) -> dict[str, Any]:
    p = {"sgid": IPv6Address(src), "dgid": IPv6Address(dst), "slid": 0, "dlid": 0,
         "flow_label": 0x3F00F, "hop_limit": 64, "tclass": 0x20, "p_key": 0xFFFF, "sl": 2,
         "mtu": 3, "rate": 16, "packet_life_time": 16}  # fmt: skip
    return {**p, **kw}


def exchange(req: R.CmReq, rep: R.CmRep, *, ack_delay_a: int = 15
             ) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """The REQ and REP as each side decodes them off the wire."""
    rq = W.build_req(req, local_comm_id=0x1111, local_ca_guid=0xA, local_qpn=0xA1,
                     starting_psn=0xAAAAAA, ca_ack_delay=ack_delay_a)  # fmt: skip
    req_f = W.parse(CmAttr.REQ, rq)
    rp = W.build_rep(rep, req=req_f, local_comm_id=0x2222, local_ca_guid=0xB, local_qpn=0xB2,
                     starting_psn=0xBBBBBB, resp_res=3)  # fmt: skip
    return req_f, W.parse(CmAttr.REP, rp)


def _check_fsm(qp_type: QpType, mods: W.ConnectMods) -> None:
    cur = QpState.RESET
    for m in mods:
        check_modify(qp_type, cur, m)  # raises if the QP state machine refuses it
        cur = m.state


REQ = R.CmReq(svc_id=0x0106_1C06, primary_path=path(), qp=QP, rep_cb=_cb, resp_res=6,
              init_depth=5, retry_cnt=6, rnr_retry_cnt=4, rnr_nak_timeout=9)  # fmt: skip
REP = R.CmRep(qp=QP, init_depth=2, target_ack_delay=18, rnr_retry_cnt=3, rnr_nak_timeout=14)


def test_roce_rc_mods_on_both_sides() -> None:
    req_f, rep_f = exchange(REQ, REP)
    passive = W.passive_mods(req_f, rep_f, port=roce_port(IP_B), pkey_index=0, access=ACCESS,
                             rnr_nak_timeout=REP.rnr_nak_timeout)  # fmt: skip
    active = W.active_mods(req_f, rep_f, port=roce_port(IP_A), pkey_index=0, access=ACCESS,
                           rnr_nak_timeout=REQ.rnr_nak_timeout, packet_life=16)  # fmt: skip
    assert passive.init == active.init == QpMod(QpState.INIT, port_num=1, pkey_index=0,
                                                access=ACCESS)  # fmt: skip
    # RTR: the path back to the other side, its QPN, the MTU of the REQ, and the first
    # PSN to receive: the one this side put in its own message (Linux cm.c reads a
    # message's starting PSN as what its sender receives first)
    for mods, dgid, qpn, psn in ((passive, IP_A, 0xA1, 0xBBBBBB),
                                 (active, IP_B, 0xB2, 0xAAAAAA)):  # fmt: skip
        av = mods.rtr.primary_av
        assert av is not None and av.grh is not None
        assert (av.port_num, av.dlid, av.sl) == (1, 0, 2)  # RoCE: no LID
        assert (av.grh.dgid, av.grh.sgid_index) == (IPv6Address(dgid), 3)  # the RoCE v2 GID
        assert (av.grh.hop_limit, av.grh.traffic_class, av.grh.flow_label) == (64, 0x20, 0x3F00F)
        assert (mods.rtr.dest_qp, mods.rtr.rq_psn, mods.rtr.path_mtu) == (qpn, psn, Mtu.MTU_1024)
        assert mods.rtr.alternate_av is None and mods.rts.apm_state is None
    # resp_res / init_depth: the REP carries 3 / 2 for the passive side; the active swaps
    assert (passive.rtr.resp_res, passive.rts.init_depth) == (3, 2)
    assert (active.rtr.resp_res, active.rts.init_depth) == (2, 3)
    assert (passive.rts.sq_psn, active.rts.sq_psn) == (0xAAAAAA, 0xBBBBBB)
    # ACK timeout: the REQ's (cm_ack_timeout(15, 16) = 17) on the passive side,
    # cm_ack_timeout(target ACK delay 18, 16) = 19 on the active side
    assert (passive.rts.local_ack_timeout, active.rts.local_ack_timeout) == (17, 19)
    assert passive.rts.retry_cnt == active.rts.retry_cnt == 6
    assert (passive.rts.rnr_retry_cnt, active.rts.rnr_retry_cnt) == (4, 3)  # REQ's, REP's
    assert (passive.rtr.rnr_nak_timeout, active.rtr.rnr_nak_timeout) == (14, 9)
    _check_fsm(QpType.RC, passive)
    _check_fsm(QpType.RC, active)


def test_a_rep_cannot_raise_what_the_req_offered() -> None:
    req_f, rep_f = exchange(REQ, REP)  # REQ offers responder resources 6, initiator depth 5
    greedy = {**rep_f, "initiator_depth": 9, "responder_resources": 8}
    mods = W.active_mods(req_f, greedy, port=roce_port(IP_A), pkey_index=0, access=ACCESS)
    assert (mods.rtr.resp_res, mods.rts.init_depth) == (6, 5)


def test_for_state_picks_the_modify_the_machine_asks_for() -> None:
    req_f, rep_f = exchange(REQ, REP)
    mods = W.passive_mods(req_f, rep_f, port=roce_port(IP_B), pkey_index=0, access=ACCESS)
    assert [mods.for_state(s) for s in (QpState.INIT, QpState.RTR, QpState.RTS)] == list(mods)
    with pytest.raises(InvalidParameter, match="not ERROR"):
        mods.for_state(QpState.ERROR)


def test_active_life_defaults_to_the_reqs_ack_timeout() -> None:
    req_f, rep_f = exchange(REQ, REP)  # REQ ACK timeout 17 -> life 16
    mods = W.active_mods(req_f, rep_f, port=roce_port(IP_A), pkey_index=0, access=ACCESS)
    assert mods.rts.local_ack_timeout == W.cm_ack_timeout(18, 16)


def test_alternate_path_becomes_alternate_av_and_rearm() -> None:
    alt = path("::ffff:10.1.0.1", "::ffff:10.1.0.2", hop_limit=3, sl=5)
    req_f, rep_f = exchange(R.CmReq(**{**_fields(REQ), "alt_path": alt}), REP)
    passive = W.passive_mods(req_f, rep_f, port=roce_port(IP_B, "::ffff:10.1.0.2"),
                             pkey_index=0, access=ACCESS)  # fmt: skip
    active = W.active_mods(req_f, rep_f, port=roce_port(IP_A, "::ffff:10.1.0.1"),
                           pkey_index=0, access=ACCESS)  # fmt: skip
    for mods, dgid in ((passive, "::ffff:10.1.0.1"), (active, "::ffff:10.1.0.2")):
        alt_av = mods.rtr.alternate_av
        assert alt_av is not None and alt_av.grh is not None
        assert (alt_av.grh.dgid, alt_av.grh.sgid_index) == (IPv6Address(dgid), 4)
        assert (alt_av.sl, alt_av.grh.hop_limit) == (5, 3)
        assert mods.rts.apm_state is ApmState.REARM
        _check_fsm(QpType.RC, mods)


def _fields(r: Any) -> dict[str, Any]:
    return {n: getattr(r, n) for n in r.__dataclass_fields__}


def test_a_gid_not_on_the_port_is_a_path_mismatch_naming_the_reject_reason() -> None:
    req_f, rep_f = exchange(REQ, REP)
    with pytest.raises(W.PathMismatch) as e:
        W.passive_mods(req_f, rep_f, port=roce_port("::ffff:10.0.0.9"), pkey_index=0,
                       access=ACCESS)  # fmt: skip
    assert e.value.reason is RejReason.INVALID_GID and "::ffff:10.0.0.2" in str(e.value)
    alt = path("::ffff:10.1.0.1", "::ffff:10.1.0.2")
    req_f, rep_f = exchange(R.CmReq(**{**_fields(REQ), "alt_path": alt}), REP)
    with pytest.raises(W.PathMismatch) as e:
        W.passive_mods(req_f, rep_f, port=roce_port(IP_B), pkey_index=0, access=ACCESS)
    assert e.value.reason is RejReason.INVALID_ALT_GID


def test_uc_mods_carry_no_rdma_read_attributes() -> None:
    req_f, rep_f = exchange(R.CmReq(**{**_fields(REQ), "qp_type": QpType.UC}), REP)
    mods = W.passive_mods(req_f, rep_f, port=roce_port(IP_B), pkey_index=0, access=ACCESS)
    assert mods.init.access == AccessFlags.LOCAL_WRITE | AccessFlags.RDMA_WRITE
    assert mods.rtr.resp_res is None and mods.rtr.rnr_nak_timeout is None
    assert mods.rts.given() == {"sq_psn"} and mods.rts.sq_psn == 0xAAAAAA
    _check_fsm(QpType.UC, mods)


def ib_port(lid: int, gid: str) -> PortAttr:
    return PortAttr(port_num=2, port_guid=9, lid=lid, gids=(IPv6Address(gid),),
                    active_mtu=Mtu.MTU_2048)  # fmt: skip


def test_ib_subnet_local_path_uses_lids_and_no_grh() -> None:
    p = path("fe80::a", "fe80::b", slid=0x10, dlid=0x20, hop_limit=0, mtu=4, p_key=0x8001)
    req_f, rep_f = exchange(R.CmReq(**{**_fields(REQ), "primary_path": p}), REP)
    assert (req_f["primary_local_lid"], req_f["primary_remote_lid"]) == (0x10, 0x20)
    assert req_f["primary_subnet_local"] and req_f["pkey"] == 0x8001
    passive = W.passive_mods(req_f, rep_f, port=ib_port(0x20, "fe80::b"), pkey_index=1,
                             access=ACCESS)  # fmt: skip
    active = W.active_mods(req_f, rep_f, port=ib_port(0x10, "fe80::a"), pkey_index=1,
                           access=ACCESS)  # fmt: skip
    assert passive.rtr.primary_av is not None and active.rtr.primary_av is not None
    assert (passive.rtr.primary_av.dlid, passive.rtr.primary_av.grh) == (0x10, None)
    assert (active.rtr.primary_av.dlid, active.rtr.primary_av.grh) == (0x20, None)
    assert passive.rtr.path_mtu is Mtu.MTU_2048 and passive.init.pkey_index == 1


def test_lap_alternate_path_mod_on_both_sides() -> None:
    alt = path("::ffff:10.1.0.1", "::ffff:10.1.0.2")
    lap = R.CmLap(qp=QP, alt_path=alt, apr_cb=_cb)
    f = W.parse(CmAttr.LAP, W.build_lap(lap, local_comm_id=1, remote_comm_id=2, remote_qpn=3,
                                        ca_ack_delay=15))  # fmt: skip
    rec = W.lap_rec(f, pkey=0xFFFF, mtu=3)
    recv_mod = W.alt_path_mod(rec.alt_path, roce_port(IP_B, "::ffff:10.1.0.2"))
    send_mod = W.alt_path_mod(alt, roce_port(IP_A, "::ffff:10.1.0.1"))
    for m, dgid in ((recv_mod, "::ffff:10.1.0.1"), (send_mod, "::ffff:10.1.0.2")):
        assert m.state is QpState.RTS and m.apm_state is ApmState.REARM
        assert m.alternate_av is not None and m.alternate_av.grh is not None
        assert m.alternate_av.grh.dgid == IPv6Address(dgid)
        check_modify(QpType.RC, QpState.RTS, m)


# ------------------------------------------------------------------ on the mock fabric

pytest.importorskip("ibal.providers.mock", reason="the mock provider is not installed")


@pytest.fixture
def al() -> Iterator[AccessLayer]:
    with ibal.open_al(providers={"mock": {"cas": 2}}) as al:
        yield al


def test_qps_connected_by_req_and_rep_move_data(al: AccessLayer) -> None:
    sides = []
    for guid in al.get_ca_guids()[:2]:
        ca = al.open_ca(guid)
        pd = ca.alloc_pd()
        cq = ca.create_cq(64)
        buf = bytearray(4096)
        qp = pd.create_qp(QpCreate(QpType.RC, cq, cq))
        port = ca.query().port(1)
        sides.append((ca, pd, cq, buf, pd.reg_mem(buf, ACCESS), qp, port))
    (ca_a, _, cq_a, buf_a, mr_a, qp_a, port_a), (ca_b, _, cq_b, buf_b, mr_b, qp_b, port_b) = sides
    # The PathRecord an SA would answer between the two mock ports (same subnet)
    p = {"sgid": port_a.gids[0], "dgid": port_b.gids[0], "slid": port_a.lid,
         "dlid": port_b.lid, "flow_label": 0, "hop_limit": 0, "tclass": 0, "p_key": 0xFFFF,
         "sl": 0, "mtu": int(min(port_a.active_mtu, port_b.active_mtu)), "rate": 3,
         "packet_life_time": 14}  # fmt: skip
    req = R.CmReq(svc_id=0x42, primary_path=p, qp=qp_a, rep_cb=_cb, resp_res=4, init_depth=4)
    req_bytes = W.build_req(req, local_comm_id=1, local_ca_guid=ca_a.guid, local_qpn=qp_a.num,
                            starting_psn=0x000100, ca_ack_delay=15)  # fmt: skip
    req_f = W.parse(CmAttr.REQ, req_bytes)  # what B's CM decodes
    rep = R.CmRep(qp=qp_b, init_depth=2, target_ack_delay=15)
    rep_bytes = W.build_rep(rep, req=req_f, local_comm_id=2, local_ca_guid=ca_b.guid,
                            local_qpn=qp_b.num, starting_psn=0xFFFFF0, resp_res=1)  # fmt: skip
    rep_f = W.parse(CmAttr.REP, rep_bytes)  # what A's CM decodes
    for m in W.passive_mods(req_f, rep_f, port=port_b, pkey_index=0, access=ACCESS):
        qp_b.modify(m)
    for m in W.active_mods(req_f, rep_f, port=port_a, pkey_index=0, access=ACCESS,
                           packet_life=14):  # fmt: skip
        qp_a.modify(m)
    assert qp_a.state is QpState.RTS and qp_b.state is QpState.RTS
    qa, qb = qp_a.query(), qp_b.query()
    # each side receives from the PSN it sent and sends from the peer's (as Linux does)
    assert (qa.dest_qp, qa.sq_psn, qa.rq_psn) == (qp_b.num, 0xFFFFF0, 0x000100)
    assert (qb.dest_qp, qb.sq_psn, qb.rq_psn) == (qp_a.num, 0x000100, 0xFFFFF0)
    assert (qa.init_depth, qa.resp_res, qb.init_depth, qb.resp_res) == (1, 2, 2, 1)

    qp_b.post_recv([RecvWr(1, [mr_b.sge(1000, 64)])])
    buf_a[0:9] = b"via REQ!!"
    qp_a.post_send([SendWr(2, WrType.SEND, [mr_a.sge(0, 9)])])
    buf_a[100:105] = b"write"
    qp_a.post_send([SendWr(3, WrType.RDMA_WRITE, [mr_a.sge(100, 5)],
                           remote_addr=mr_b.vaddr + 2000, rkey=mr_b.rkey)])  # fmt: skip
    sent = cq_a.wait(10.0, min_entries=2)
    got = cq_b.wait(10.0)
    assert [(w.wr_id, w.status) for w in sent] == [(2, WcStatus.SUCCESS), (3, WcStatus.SUCCESS)]
    assert [(w.wr_id, w.status, w.length) for w in got] == [(1, WcStatus.SUCCESS, 9)]
    assert bytes(buf_b[1000:1009]) == b"via REQ!!" and bytes(buf_b[2000:2005]) == b"write"


def test_check_req_names_the_reject_reason() -> None:
    req_f, _ = exchange(REQ, REP)
    W.check_req(req_f, roce_port(IP_B))
    for change, port, reason in (
        ({"transport_type": 2}, roce_port(IP_B), RejReason.INVALID_TRANSPORT_TYPE),
        ({"path_mtu": 6}, roce_port(IP_B), RejReason.INVALID_MTU),
        ({}, roce_port("::ffff:10.0.0.7"), RejReason.INVALID_GID),
        ({"alternate_local_lid": 1, "alternate_remote_gid": IPv6Address("::ffff:9.9.9.9").packed},
         roce_port(IP_B), RejReason.INVALID_ALT_GID),
    ):  # fmt: skip
        with pytest.raises(W.PathMismatch) as e:
            W.check_req({**req_f, **change}, port)
        assert e.value.reason is reason
