"""The mock fabric's SA agent, driven with raw MAD services over the AL's QP1 alias.

Each test asks the SA on the SM port (mock0's port, LID 1) as a client would:
SubnAdm MADs from a QP1 alias to QP1 at the SM LID, GetTable answers
reassembled by the service's RMPP sessions, Reports received unsolicited.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from ibal.al import AlManager, Ca
from ibal.mad import MadElement, MadService, MadSvc, enable_rmpp, put_mad, reg_mad_svc, transact
from ibal.providers.mock import MockFabric, MockProvider
from ibal.testing.helpers import GRH_BYTES, UD_QKEY, make_side, wait_wc
from ibal.types import (
    QP1_WELL_KNOWN_QKEY,
    AvAttr,
    DgrmInfo,
    Gid,
    Grh,
    MadAddr,
    QpType,
    SendWr,
    UdDest,
    WcStatus,
)
from ibal.wire.fields import Table
from ibal.wire.mad import sa
from ibal.wire.mad.consts import MadStatus, Method, MgmtClass, SaAttr
from ibal.wire.mad.header import SA_DATA, build, header
from ibal.wire.mad.rmpp import RMPP_DATA

WAIT = 10.0
SA_HEADER_SIZE = 20


@dataclass
class Client:
    """An SA client on one mock port: its MAD service and the Reports it received."""

    svc: MadService
    sm_lid: int
    reports: queue.Queue[bytes] = field(default_factory=queue.Queue)
    tid: int = 0

    def ask(self, method: int, attr: int, data: bytes = b"", comp_mask: int = 0, *,
            sm_key: int = 0, rmpp: bool = False) -> bytes:  # fmt: skip
        """The whole answer (a reassembled GetTableResp: header + RMPP area + SA header +
        records)."""
        self.tid += 1
        mad = build(MgmtClass.SUBN_ADM, method, attr, tid=self.tid, data=data,
                    comp_mask=comp_mask, sm_key=sm_key)  # fmt: skip
        e = self.svc.pool_key.get_mad()
        e.mad[:] = mad
        e.addr = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=self.sm_lid)
        e.resp_expected, e.timeout_ms, e.retry_cnt = True, 1000, 1
        resp = transact(self.svc, e, timeout=WAIT)
        out = bytes(resp.mad)
        put_mad(resp)
        return out


@dataclass
class Net:
    fabric: MockFabric
    mgr: AlManager
    cas: list[Ca]
    clients: list[Client]

    def client(self, i: int = 0) -> Client:
        return self.clients[i]


def open_client(net_fabric: MockFabric, mgr: AlManager, index: int) -> tuple[Ca, Client]:
    al = mgr.open_al()
    mock = net_fabric.cas[index]
    ca = al.open_ca(mock.guid)
    pd = ca.alloc_pd()
    qp1 = pd.get_spl_qp(mock.ports[0].guid, QpType.QP1_ALIAS)
    reports: queue.Queue[bytes] = queue.Queue()

    def recv(e: MadElement) -> None:
        reports.put(bytes(e.mad))
        put_mad(e)

    svc = reg_mad_svc(qp1, MadSvc(int(MgmtClass.SUBN_ADM), 2, recv_cb=recv, support_unsol=True,
                                  methods=[int(Method.REPORT)]))  # fmt: skip
    enable_rmpp(svc, al.timers, SA_HEADER_SIZE)
    return ca, Client(svc, net_fabric.sm_lid, reports)


@pytest.fixture
def net() -> Iterator[Net]:
    fabric = MockFabric(seed=11)
    for _ in range(3):
        fabric.add_ca()
    mgr = AlManager()
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        cas, clients = [], []
        for i in range(3):
            ca, c = open_client(fabric, mgr, i)
            cas.append(ca)
            clients.append(c)
        yield Net(fabric, mgr, cas, clients)
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()


def status(mad: bytes) -> int:
    return header(mad).status


def table_records(mad: bytes, table: Table) -> list[dict[str, object]]:
    """The records of a reassembled GetTableResp (RMPP area and SA header skipped)."""
    attr_offset = int.from_bytes(mad[44:46], "big")
    data = mad[RMPP_DATA + SA_HEADER_SIZE :]
    return [table.decode(r) for r in sa.records(data, attr_offset, table)]


def one_record(mad: bytes, table: Table) -> dict[str, object]:
    assert status(mad) == 0, hex(status(mad))
    return table.decode(mad[SA_DATA : SA_DATA + table.size])


# ================================================================ node and port records
def test_node_record_get_by_lid(net: Net) -> None:
    target = net.fabric.cas[2].ports[0]
    mask = sa.component_mask(sa.NODE_RECORD, ["lid"])
    resp = net.client(1).ask(Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=target.lid),
                             mask)  # fmt: skip
    assert header(resp).method == Method.GET_RESP
    r = one_record(resp, sa.NODE_RECORD)
    assert (r["lid"], r["port_guid"], r["node_guid"]) == (target.lid, target.guid,
                                                           net.fabric.cas[2].guid)
    assert r["node_string"].rstrip(b"\0") == net.fabric.cas[2].description.encode()  # type: ignore[union-attr]


def test_get_table_of_all_node_records_comes_by_rmpp(net: Net) -> None:
    resp = net.client(1).ask(Method.GET_TABLE, SaAttr.NODE_RECORD)
    assert (header(resp).method, status(resp)) == (Method.GET_TABLE_RESP, 0)
    recs = table_records(resp, sa.NODE_RECORD)
    lids = sorted(int(r["lid"]) for r in recs)  # type: ignore[call-overload]
    expect = sorted([p.lid for p in net.fabric.ports()] + [net.fabric.switch.lid])
    assert lids == expect
    assert net.fabric.sa.stats["tables_acked"] == 1


def test_get_with_no_record_and_with_many(net: Net) -> None:
    c = net.client()
    mask = sa.component_mask(sa.NODE_RECORD, ["lid"])
    resp = c.ask(Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=77), mask)
    assert (header(resp).method, status(resp)) == (Method.GET_RESP, MadStatus.SA_NO_RECORDS)
    resp = c.ask(Method.GET, SaAttr.NODE_RECORD)
    assert status(resp) == MadStatus.SA_TOO_MANY_RECORDS
    # GetTable with nothing matching: success, no record (OpenSM)
    resp = c.ask(Method.GET_TABLE, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=77), mask)
    assert (status(resp), table_records(resp, sa.NODE_RECORD)) == (0, [])


def test_bad_component_mask_is_req_invalid(net: Net) -> None:
    resp = net.client().ask(Method.GET_TABLE, SaAttr.NODE_RECORD, comp_mask=1 << 40)
    assert (header(resp).method, status(resp)) == (Method.GET_TABLE_RESP, MadStatus.SA_REQ_INVALID)
    assert int.from_bytes(resp[44:46], "big") == 0  # AttributeOffset 0 on an error


def test_port_info_record_of_a_ca_port(net: Net) -> None:
    port = net.fabric.cas[1].ports[0]
    mask = sa.component_mask(sa.PORT_INFO_RECORD, ["endport_lid"])
    resp = net.client().ask(Method.GET, SaAttr.PORT_INFO_RECORD,
                            sa.PORT_INFO_RECORD.encode(endport_lid=port.lid), mask)  # fmt: skip
    r = one_record(resp, sa.PORT_INFO_RECORD)
    assert (r["endport_lid"], r["port_num"], r["lid"], r["master_sm_lid"]) == (
        port.lid, 1, port.lid, net.fabric.sm_lid)


# ================================================================ paths
def test_path_record_between_lids(net: Net) -> None:
    a, b = net.fabric.cas[1].ports[0], net.fabric.cas[2].ports[0]
    mask = sa.component_mask(sa.PATH_RECORD, ["slid", "dlid"])
    resp = net.client(1).ask(Method.GET, SaAttr.PATH_RECORD,
                             sa.PATH_RECORD.encode(slid=a.lid, dlid=b.lid), mask)  # fmt: skip
    r = one_record(resp, sa.PATH_RECORD)
    assert (r["slid"], r["dlid"]) == (a.lid, b.lid)
    assert (r["sgid"], r["dgid"]) == (a.gid.packed, b.gid.packed)
    # as OpenSM answers: reversible, NumbPath 0, selectors "exactly", the subnet timeout as life
    assert (r["reversible"], r["numb_path"], r["p_key"], r["sl"], r["hop_limit"]) == (
        1, 0, 0xFFFF, 0, 0)
    assert (r["mtu_selector"], r["mtu"], r["rate_selector"], r["rate"]) == (2, 5, 2, 7)
    assert (r["packet_life_time_selector"], r["packet_life_time"]) == (2, 18)


def test_path_selectors(net: Net) -> None:
    a, b = net.fabric.cas[1].ports[0], net.fabric.cas[2].ports[0]
    c = net.client(1)
    base = {"slid": a.lid, "dlid": b.lid}

    def path(**q: int) -> tuple[int, dict[str, object] | None]:
        mask = sa.component_mask(sa.PATH_RECORD, [*base, *q])
        resp = c.ask(Method.GET, SaAttr.PATH_RECORD, sa.PATH_RECORD.encode(**base, **q), mask)
        return status(resp), (one_record(resp, sa.PATH_RECORD) if status(resp) == 0 else None)

    st, r = path(mtu_selector=1, mtu=4)  # less than 2048: 1024
    assert st == 0 and r is not None and r["mtu"] == 3
    st, r = path(mtu_selector=0, mtu=5)  # more than 4096: none
    assert st == MadStatus.SA_NO_RECORDS
    st, r = path(mtu_selector=2, mtu=4)  # exactly 2048
    assert r is not None and r["mtu"] == 4
    st, r = path(rate_selector=1, rate=7)  # less than 40 Gb/s: 30 Gb/s (code 4)
    assert r is not None and r["rate"] == 4
    st, r = path(rate_selector=0, rate=3)  # more than 10 Gb/s: the link's 40
    assert r is not None and r["rate"] == 7
    st, r = path(packet_life_time_selector=2, packet_life_time=20)
    assert r is not None and r["packet_life_time"] == 20
    st, r = path(packet_life_time_selector=2, packet_life_time=3)  # shorter than possible
    assert st == MadStatus.SA_NO_RECORDS
    st, r = path(p_key=0x1234)  # a partition neither port holds
    assert st == MadStatus.SA_NO_RECORDS


def test_path_table_from_one_source_to_all(net: Net) -> None:
    a = net.fabric.cas[0].ports[0]
    mask = sa.component_mask(sa.PATH_RECORD, ["sgid"])
    resp = net.client().ask(Method.GET_TABLE, SaAttr.PATH_RECORD,
                            sa.PATH_RECORD.encode(sgid=a.gid.packed), mask)  # fmt: skip
    recs = table_records(resp, sa.PATH_RECORD)
    dlids = sorted(int(r["dlid"]) for r in recs)  # type: ignore[call-overload]
    assert dlids == sorted([p.lid for p in net.fabric.ports()] + [net.fabric.switch.lid])
    assert {r["slid"] for r in recs} == {a.lid}


def test_unknown_sgid_is_invalid_gid(net: Net) -> None:
    mask = sa.component_mask(sa.PATH_RECORD, ["sgid", "dlid"])
    data = sa.PATH_RECORD.encode(sgid=bytes.fromhex("fe80" + "00" * 13 + "99"), dlid=1)
    resp = net.client().ask(Method.GET, SaAttr.PATH_RECORD, data, mask)
    assert status(resp) == MadStatus.SA_INVALID_GID


# ================================================================ service records
def _service(name: bytes, lease: int, sid: int, gid: bytes) -> bytes:
    return sa.SERVICE_RECORD.encode(service_id=sid, service_gid=gid, service_lease=lease,
                                    service_name=name.ljust(64, b"\0"))  # fmt: skip


SR_RID = sa.component_mask(sa.SERVICE_RECORD, ["service_id", "service_gid"])
SR_ALL = sa.component_mask(sa.SERVICE_RECORD, ["service_id", "service_gid", "service_lease",
                                               "service_name"])  # fmt: skip
SR_NAME = sa.component_mask(sa.SERVICE_RECORD, ["service_name"])


def test_service_registered_on_one_port_is_found_from_another_until_its_lease_ends(
    net: Net,
) -> None:
    net.fabric.manual_clock()
    gid = net.fabric.cas[1].ports[0].gid.packed
    resp = net.client(1).ask(Method.SET, SaAttr.SERVICE_RECORD,
                             _service(b"ibal.demo", 60, 0x1234, gid), SR_ALL)  # fmt: skip
    assert header(resp).method == Method.GET_RESP
    assert one_record(resp, sa.SERVICE_RECORD)["service_p_key"] == 0xFFFF  # the default

    def lookup() -> bytes:
        return net.client(2).ask(Method.GET, SaAttr.SERVICE_RECORD,
                                 sa.SERVICE_RECORD.encode(service_name=b"ibal.demo".ljust(64,
                                                                                         b"\0")),
                                 SR_NAME)  # fmt: skip

    found = one_record(lookup(), sa.SERVICE_RECORD)
    assert (found["service_id"], found["service_gid"], found["service_lease"]) == (0x1234, gid, 60)
    net.fabric.advance(45.5)
    assert one_record(lookup(), sa.SERVICE_RECORD)["service_lease"] == 14  # what is left
    net.fabric.advance(15)
    assert status(lookup()) == MadStatus.SA_NO_RECORDS
    assert len(net.fabric.sa.services) == 0


def test_service_delete_and_table(net: Net) -> None:
    c = net.client(1)
    gid = net.fabric.cas[1].ports[0].gid.packed
    for sid in (1, 2):
        assert status(c.ask(Method.SET, SaAttr.SERVICE_RECORD,
                            _service(b"s%d" % sid, 0xFFFFFFFF, sid, gid), SR_ALL)) == 0  # fmt: skip
    # a second Set of the same (ID, GID, P_Key) replaces the first
    assert status(c.ask(Method.SET, SaAttr.SERVICE_RECORD,
                        _service(b"renamed", 0xFFFFFFFF, 2, gid), SR_ALL)) == 0  # fmt: skip
    recs = table_records(net.client(2).ask(Method.GET_TABLE, SaAttr.SERVICE_RECORD),
                         sa.SERVICE_RECORD)  # fmt: skip
    names = sorted(bytes(r["service_name"]).rstrip(b"\0") for r in recs)  # type: ignore[call-overload]
    assert names == [b"renamed", b"s1"]
    resp = c.ask(Method.DELETE, SaAttr.SERVICE_RECORD, _service(b"", 0, 1, gid), SR_RID)
    assert (header(resp).method, status(resp)) == (Method.DELETE_RESP, 0)
    assert one_record(resp, sa.SERVICE_RECORD)["service_name"] == b"s1".ljust(64, b"\0")
    resp = c.ask(Method.DELETE, SaAttr.SERVICE_RECORD, _service(b"", 0, 1, gid), SR_RID)
    assert status(resp) == MadStatus.SA_NO_RECORDS
    # Set without the ServiceGID component
    only_id = sa.component_mask(sa.SERVICE_RECORD, ["service_id"])
    resp = c.ask(Method.SET, SaAttr.SERVICE_RECORD, _service(b"x", 5, 9, gid), only_id)
    assert status(resp) == MadStatus.SA_REQ_INVALID


# ================================================================ multicast
MC = sa.MCMEMBER_RECORD
MC_CREATE = sa.component_mask(MC, ["mgid", "port_gid", "q_key", "p_key", "sl", "flow_label",
                                   "tclass", "join_state"])  # fmt: skip
MC_JOIN = sa.component_mask(MC, ["mgid", "port_gid", "join_state"])
FULL, NON, SEND_ONLY = 1, 2, 4


def _mc(mgid: bytes, port_gid: bytes, join_state: int) -> bytes:
    return MC.encode(mgid=mgid, port_gid=port_gid, q_key=0x1111, p_key=0xFFFF,
                     join_state=join_state)  # fmt: skip


def test_join_creates_a_group_others_join_and_a_datagram_reaches_the_members(net: Net) -> None:
    fab = net.fabric
    gids = [p.gid.packed for p in fab.ports()]
    resp = net.client(1).ask(Method.SET, SaAttr.MCMEMBER_RECORD, _mc(bytes(16), gids[1], FULL),
                             MC_CREATE)  # fmt: skip
    created = one_record(resp, MC)
    mgid, mlid = bytes(created["mgid"]), int(created["mlid"])  # type: ignore[call-overload]
    assert mgid[:4] == bytes.fromhex("ff12a01b") and mlid == 0xC001  # 0xC000: IPoIB's group
    assert (created["q_key"], created["join_state"], created["mtu_selector"]) == (0x1111, FULL, 2)
    # the next joins name the MGID only
    resp = net.client(2).ask(Method.SET, SaAttr.MCMEMBER_RECORD, _mc(mgid, gids[2], NON), MC_JOIN)
    assert one_record(resp, MC)["mlid"] == mlid
    resp = net.client(2).ask(Method.SET, SaAttr.MCMEMBER_RECORD, _mc(mgid, gids[2], SEND_ONLY),
                             MC_JOIN)  # fmt: skip
    assert one_record(resp, MC)["join_state"] == NON | SEND_ONLY  # ORed per port
    # a join that disagrees with the group (another Q_Key)
    bad = sa.component_mask(MC, ["mgid", "port_gid", "join_state", "q_key"])
    resp = net.client(0).ask(Method.SET, SaAttr.MCMEMBER_RECORD,
                             MC.encode(mgid=mgid, port_gid=gids[0], q_key=7, join_state=FULL),
                             bad)  # fmt: skip
    assert status(resp) == MadStatus.SA_REQ_INVALID

    # the members' UD QPs attach with the answer's MGID/MLID; a datagram to the MLID lands
    sides = []
    for ca in net.cas:
        port = ca.query().ports[0]
        side = make_side(ca, port, QpType.UD)
        side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        sides.append(side)
    for side in sides[1:]:
        side.qp.attach_mcast(Gid(mgid), mlid)
        side.recv(5, 0, GRH_BYTES + 64)
    av = sides[0].pd.create_av(AvAttr(port_num=1, dlid=mlid, grh=Grh(dgid=Gid(mgid), sgid_index=0)))
    sides[0].put(0, b"to the group")
    sides[0].qp.post_send(SendWr(wr_id=1, sg_list=[sides[0].sge(0, 12)],
                                 ud=UdDest(av=av, remote_qp=0xFFFFFF, remote_qkey=UD_QKEY)))
    assert wait_wc(sides[0].cq).status is WcStatus.SUCCESS
    for side in sides[1:]:
        assert wait_wc(side.cq).status is WcStatus.SUCCESS
        assert side.get(GRH_BYTES, 12) == b"to the group"


def test_leave_of_the_last_full_member_removes_the_group(net: Net) -> None:
    gids = [p.gid.packed for p in net.fabric.ports()]
    resp = net.client(1).ask(Method.SET, SaAttr.MCMEMBER_RECORD, _mc(bytes(16), gids[1], FULL),
                             MC_CREATE)  # fmt: skip
    created = one_record(resp, MC)
    mgid = bytes(created["mgid"])  # type: ignore[call-overload]
    assert status(net.client(2).ask(Method.SET, SaAttr.MCMEMBER_RECORD, _mc(mgid, gids[2], NON),
                                    MC_JOIN)) == 0  # fmt: skip

    def groups() -> dict[bytes, list[tuple[bytes, int]]]:
        recs = table_records(net.client(0).ask(Method.GET_TABLE, SaAttr.MCMEMBER_RECORD), MC)
        out: dict[bytes, list[tuple[bytes, int]]] = {}
        for r in recs:
            out.setdefault(bytes(r["mgid"]), []).append(  # type: ignore[call-overload]
                (bytes(r["port_gid"]), int(r["join_state"])))  # type: ignore[call-overload]
        return out

    assert sorted(groups()[mgid]) == sorted([(gids[1], FULL), (gids[2], NON)])
    # leaving a state the port does not hold
    resp = net.client(1).ask(Method.DELETE, SaAttr.MCMEMBER_RECORD, _mc(mgid, gids[1], NON),
                             MC_JOIN)  # fmt: skip
    assert status(resp) == MadStatus.SA_REQ_INVALID
    resp = net.client(1).ask(Method.DELETE, SaAttr.MCMEMBER_RECORD, _mc(mgid, gids[1], FULL),
                             MC_JOIN)  # fmt: skip
    assert (header(resp).method, status(resp)) == (Method.DELETE_RESP, 0)
    assert mgid not in groups()  # the non-member alone does not keep it
    ipoib = bytes.fromhex("ff12401bffff000000000000ffffffff")
    assert groups()[ipoib] == [(bytes(16), 0)]  # OpenSM's broadcast group, nobody joined


def test_join_without_create_components_or_as_non_member_fails(net: Net) -> None:
    gid = net.fabric.cas[1].ports[0].gid.packed
    c = net.client(1)
    resp = c.ask(Method.SET, SaAttr.MCMEMBER_RECORD, _mc(bytes(16), gid, FULL), MC_JOIN)
    assert status(resp) == MadStatus.SA_INSUFFICIENT_COMPONENTS
    resp = c.ask(Method.SET, SaAttr.MCMEMBER_RECORD, _mc(bytes(16), gid, NON), MC_CREATE)
    assert status(resp) == MadStatus.SA_REQ_INVALID
    no_port = sa.component_mask(MC, ["mgid", "join_state"])
    resp = c.ask(Method.SET, SaAttr.MCMEMBER_RECORD, _mc(bytes(16), gid, FULL), no_port)
    assert status(resp) == MadStatus.SA_INSUFFICIENT_COMPONENTS


# ================================================================ subscriptions and reports
def _inform(trap: int, subscribe: int = 1) -> bytes:
    return sa.INFORM_INFO.encode(lid_range_begin=0xFFFF, is_generic=1, subscribe=subscribe,
                                 type=0xFFFF, trap_number=trap, qpn=1,
                                 producer_type=0xFFFFFF)  # fmt: skip


def _next_report(c: Client) -> dict[str, object]:
    mad = c.reports.get(timeout=WAIT)
    h = header(mad)
    assert (h.mgmt_class, h.method, h.attr_id) == (MgmtClass.SUBN_ADM, Method.REPORT,
                                                   SaAttr.NOTICE)  # fmt: skip
    return {"tid": h.tid, "mad": mad, **sa.NOTICE.decode(mad[SA_DATA : SA_DATA + sa.NOTICE.size])}


def test_report_to_a_subscriber_when_a_port_goes_down_retried_until_report_resp(
    net: Net,
) -> None:
    fab = net.fabric
    fab.manual_clock()
    c = net.client(2)
    resp = c.ask(Method.SET, SaAttr.INFORM_INFO, _inform(65))
    assert header(resp).method == Method.GET_RESP and status(resp) == 0
    assert sa.INFORM_INFO.decode(resp[SA_DATA:])["trap_number"] == 65
    down = fab.cas[1].ports[0]
    fab.set_link(down, up=False)
    first = _next_report(c)
    assert (first["trap_number"], first["issuer_lid"], first["type"]) == (65, fab.sm_lid, 3)
    details = sa.TRAP_64_65_DETAILS.decode(first["data_details"])  # type: ignore[arg-type]
    assert details["gid"] == down.gid.packed
    assert c.reports.empty()  # trap 128 went to nobody
    # no ReportResp: the SA sends it again after its timeout, then gives up
    for _ in range(fab.sa.report_retries):
        fab.advance(fab.sa.report_timeout)
        assert _next_report(c)["tid"] == first["tid"]
    fab.advance(fab.sa.report_timeout)
    assert c.reports.empty() and fab.sa.stats["reports_failed"] == 1
    # the next one is answered: no resend
    fab.set_link(down, up=True)  # trap 64: not subscribed
    fab.set_link(down, up=False)
    report = _next_report(c)
    e = c.svc.pool_key.get_mad()
    e.mad[:] = bytes(report["mad"])  # type: ignore[call-overload]
    e.mad[3] = Method.REPORT_RESP
    e.addr = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=fab.sm_lid)
    c.svc.send(e)
    fab.advance(fab.sa.report_timeout * 5)
    assert c.reports.empty() and fab.sa.stats["reports_acked"] == 1
    # unsubscribe: nothing more; unsubscribing twice is an error
    assert status(c.ask(Method.SET, SaAttr.INFORM_INFO, _inform(65, 0))) == 0
    assert status(c.ask(Method.SET, SaAttr.INFORM_INFO, _inform(65, 0))) == MadStatus.SA_REQ_INVALID
    fab.set_link(down, up=True)
    fab.set_link(down, up=False)
    assert c.reports.empty()


def test_link_state_change_trap_128_from_the_switch(net: Net) -> None:
    fab = net.fabric
    c = net.client(2)
    assert status(c.ask(Method.SET, SaAttr.INFORM_INFO, _inform(128))) == 0
    fab.set_link(fab.cas[1].ports[0], up=False)
    r = _next_report(c)
    assert (r["trap_number"], r["issuer_lid"], r["producer_type"]) == (128, fab.switch.lid, 2)
    assert sa.TRAP_128_DETAILS.decode(r["data_details"])["lid"] == fab.switch.lid  # type: ignore[arg-type]


# ================================================================ links, GUIDs, big tables
def test_link_and_guid_info_records(net: Net) -> None:
    fab = net.fabric
    recs = table_records(net.client().ask(Method.GET_TABLE, SaAttr.LINK_RECORD), sa.LINK_RECORD)
    got = {(r["from_lid"], r["from_port"], r["to_port"], r["to_lid"]) for r in recs}
    sw = fab.switch
    expect = set()
    for p in fab.ports():
        n = sw.port_of(p.link) if p.link else 0
        expect |= {(p.lid, 1, n, sw.lid), (sw.lid, n, 1, p.lid)}
    assert got == expect
    port = fab.cas[2].ports[0]
    mask = sa.component_mask(sa.GUID_INFO_RECORD, ["lid"])
    resp = net.client().ask(Method.GET, SaAttr.GUID_INFO_RECORD,
                            sa.GUID_INFO_RECORD.encode(lid=port.lid), mask)  # fmt: skip
    r = one_record(resp, sa.GUID_INFO_RECORD)
    assert (r["block_num"], r["guid0"], r["guid1"]) == (0, port.guid, 0)


def test_all_node_records_of_a_40_node_fabric_in_one_rmpp_transfer() -> None:
    fabric = MockFabric(seed=12)
    for _ in range(33):
        fabric.add_ca()
    prev = fabric.switch
    for _ in range(6):  # 33 CAs + 7 switches in a chain: 40 nodes
        sw = fabric.add_switch()
        fabric.link(prev, sw)
        prev = sw
    mgr = AlManager()
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        _, c = open_client(fabric, mgr, 5)
        resp = c.ask(Method.GET_TABLE, SaAttr.NODE_RECORD)
        recs = table_records(resp, sa.NODE_RECORD)
        assert len(recs) == 40
        assert {r["node_guid"] for r in recs} == (
            {ca.guid for ca in fabric.cas} | {sw.guid for sw in fabric.switches})
        # 40 records of 112 bytes in segments of 200: 23 DATA segments, all ACKed
        assert -(-40 * 112 // 200) == 23
        assert fabric.sa.rmpp.totals.sent >= 23 and fabric.sa.stats["tables_acked"] == 1
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()


# ================================================================ bad MADs
def test_malformed_and_forged_sa_mads_are_dropped_and_counted(net: Net) -> None:
    c = net.client(1)
    stats = net.fabric.sa.stats
    base = build(MgmtClass.SUBN_ADM, Method.GET, SaAttr.NODE_RECORD, tid=99)
    forged = [
        bytes([2]) + bytes(base[1:]),  # base version 2: malformed
        # the rest are well formed but answer nothing of the SA's: unexpected
        bytes(base[:3]) + bytes([Method.GET_TABLE_RESP]) + bytes(base[4:]),  # unasked response
        bytes(base[:3]) + bytes([Method.REPORT_RESP]) + bytes(base[4:]),  # no such Report
        # an RMPP ACK of a transfer that does not exist
        bytes(base[:3]) + bytes([Method.GET_TABLE]) + bytes(base[4:24])
        + bytes([1, 2, 0x01]) + bytes(base[27:]),
        # RMPP DATA as a request
        bytes(base[:24]) + bytes([1, 1, 0x07]) + bytes(base[27:]),
    ]
    for mad in forged:
        e = c.svc.pool_key.get_mad()
        e.mad[:] = mad
        e.addr = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=net.fabric.sm_lid)
        c.svc.send(e)
    net.fabric.run_until_idle()
    assert (stats["received"], stats["dropped_malformed"], stats["dropped_unexpected"]) == (5, 1, 4)
    assert stats["answered"] == 0
    # the SA still answers
    assert status(c.ask(Method.GET_TABLE, SaAttr.NODE_RECORD)) == 0


def test_bad_class_version_and_unknown_attribute(net: Net) -> None:
    c = net.client()
    resp = c.ask(Method.GET, 0x00FE)
    assert status(resp) == MadStatus.METHOD_ATTR_UNSUPPORTED
    resp = c.ask(Method.SET, SaAttr.NODE_RECORD)
    assert status(resp) == MadStatus.METHOD_ATTR_UNSUPPORTED
    resp = c.ask(Method.GET, SaAttr.CLASS_PORT_INFO)
    from ibal.wire.mad.header import CLASS_PORT_INFO
    cpi = CLASS_PORT_INFO.decode(resp[SA_DATA:])
    assert (cpi["class_version"], cpi["resp_time_value"]) == (2, 0x10)


# ================================================================ through ibal.sa's SaPort
def test_sa_port_queries_the_mock_sa(net: Net) -> None:
    from ibal.sa import SaPort
    from ibal.status import Status

    al = net.mgr.open_al()
    me = net.fabric.cas[1].ports[0]
    port = SaPort.open(al, me.guid)
    answer = port.request(Method.GET_TABLE, SaAttr.NODE_RECORD).wait(WAIT)
    assert answer.status is Status.SUCCESS and answer.method == Method.GET_TABLE_RESP
    lids = sorted(int(sa.NODE_RECORD.decode(r)["lid"]) for r in answer.records)  # type: ignore[call-overload]
    assert lids == sorted([p.lid for p in net.fabric.ports()] + [net.fabric.switch.lid])
    other = net.fabric.cas[2].ports[0]
    mask = sa.component_mask(sa.PATH_RECORD, ["sgid", "dgid"])
    answer = port.request(Method.GET, SaAttr.PATH_RECORD, sa.PATH_RECORD.encode(
        sgid=me.gid.packed, dgid=other.gid.packed), mask).wait(WAIT)  # fmt: skip
    (pr,) = answer.records
    assert sa.PATH_RECORD.decode(pr)["dlid"] == other.lid
    mask = sa.component_mask(sa.NODE_RECORD, ["lid"])
    answer = port.request(Method.GET, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=999),
                          mask).wait(WAIT)  # fmt: skip
    assert (answer.status, answer.mad_status) == (Status.REMOTE_ERROR, MadStatus.SA_NO_RECORDS)
    answer = port.request(Method.GET_TABLE, SaAttr.NODE_RECORD, sa.NODE_RECORD.encode(lid=999),
                          mask).wait(WAIT)  # fmt: skip
    assert (answer.status, answer.records) == (Status.SUCCESS, ())


def test_sa_port_gets_the_report_and_answers_it(net: Net) -> None:
    import threading

    from ibal.sa import SaPort
    from ibal.status import Status

    net.client(0).svc.deregister()  # the raw client would take the port's Reports
    al = net.mgr.open_al()
    port = SaPort.open(al, net.fabric.cas[0].ports[0].guid)  # the SM's own port subscribes
    got: list[bytes] = []
    seen = threading.Event()
    port.add_report_listener(lambda notice, sender: (got.append(notice), seen.set()))
    answer = port.request(Method.SET, SaAttr.INFORM_INFO, _inform(65)).wait(WAIT)
    assert answer.status is Status.SUCCESS
    down = net.fabric.cas[2].ports[0]
    net.fabric.set_link(down, up=False)
    assert seen.wait(WAIT)
    assert net.mgr.queues.flush(WAIT)  # the SaPort's ReportResp went out after the listener
    notice = sa.NOTICE.decode(got[0])
    assert notice["trap_number"] == 65
    assert sa.TRAP_64_65_DETAILS.decode(notice["data_details"])["gid"] == down.gid.packed  # type: ignore[arg-type]
    stats = net.fabric.sa.stats
    assert (stats["reports_sent"], stats["reports_acked"], net.fabric.sa.pending_reports) == (
        1, 1, 0)


def test_the_docs_example_runs() -> None:
    """docs/sa.md "The in-process SA": its example, run as written."""
    from pathlib import Path

    from ibal.sa import SaPort
    from ibal.status import Status

    text = (Path(__file__).parents[3] / "docs" / "sa.md").read_text()
    section = text.split("## The in-process SA (mock fabric)", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    scope = {"MockFabric": MockFabric, "AlManager": AlManager, "MockProvider": MockProvider,
             "SaPort": SaPort, "Method": Method, "SaAttr": SaAttr}  # fmt: skip
    exec(code, scope)
    try:
        nodes = scope["nodes"]
        assert nodes.status is Status.SUCCESS and len(nodes.records) == 3  # type: ignore[attr-defined]
    finally:
        scope["mgr"].close(timeout=WAIT)  # type: ignore[attr-defined]
        scope["fabric"].close()  # type: ignore[attr-defined]


def test_a_group_the_sa_runs_reaches_its_receiving_members_only(net: Net) -> None:
    """As the switches' multicast tables would: a QP attached on a port that did not join,
    or joined send-only, gets nothing; once the port joins as a non-member it does."""
    gids = [p.gid.packed for p in net.fabric.ports()]
    resp = net.client(0).ask(Method.SET, SaAttr.MCMEMBER_RECORD, _mc(bytes(16), gids[0], FULL),
                             MC_CREATE)  # fmt: skip
    g = one_record(resp, MC)
    mgid, mlid = bytes(g["mgid"]), int(g["mlid"])  # type: ignore[call-overload]
    assert status(net.client(1).ask(Method.SET, SaAttr.MCMEMBER_RECORD,
                                    _mc(mgid, gids[1], SEND_ONLY), MC_JOIN)) == 0  # fmt: skip
    sides = []
    for ca in net.cas:
        port = ca.query().ports[0]
        side = make_side(ca, port, QpType.UD)
        side.qp.init_dgrm_svc(DgrmInfo(port_guid=port.port_guid, qkey=UD_QKEY))
        sides.append(side)
    for side in sides[1:]:  # mock1 joined send-only, mock2 not at all
        side.qp.attach_mcast(Gid(mgid), mlid)
        side.recv(5, 0, GRH_BYTES + 64)
    av = sides[1].pd.create_av(AvAttr(port_num=1, dlid=mlid, grh=Grh(dgid=Gid(mgid), sgid_index=0)))

    def send(wr_id: int) -> None:
        sides[1].put(0, b"hello")
        sides[1].qp.post_send(SendWr(wr_id=wr_id, sg_list=[sides[1].sge(0, 5)],
                                     ud=UdDest(av=av, remote_qp=0xFFFFFF, remote_qkey=UD_QKEY)))
        assert wait_wc(sides[1].cq).status is WcStatus.SUCCESS  # a send-only member sends

    dropped = net.fabric.counters.dropped_no_dest
    send(1)
    assert net.fabric.counters.dropped_no_dest == dropped + 1  # no receiving member attached
    assert status(net.client(2).ask(Method.SET, SaAttr.MCMEMBER_RECORD, _mc(mgid, gids[2], NON),
                                    MC_JOIN)) == 0  # fmt: skip
    send(2)
    wc = wait_wc(sides[2].cq)
    assert (wc.wr_id, wc.status) == (5, WcStatus.SUCCESS)
    assert sides[2].get(GRH_BYTES, 5) == b"hello"
