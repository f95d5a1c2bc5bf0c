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
from ibal.mad import (
    MadElement,
    MadService,
    MadSvc,
    enable_rmpp,
    put_mad,
    reg_mad_svc,
    sa,
    transact,
)
from ibal.mad.consts import MadStatus, Method, MgmtClass, SaAttr
from ibal.mad.header import SA_DATA, build, header
from ibal.mad.rmpp import RMPP_DATA
from ibal.providers.mock import MockFabric, MockProvider
from ibal.types import QP1_WELL_KNOWN_QKEY, MadAddr, QpType
from ibal.wire.fields import Table

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
