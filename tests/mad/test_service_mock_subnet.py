"""MAD services of the AL against the mock subnet's agents: SMPs over QP0 (DR through two
switches, LID-routed to a switch), PerfMgt over QP1, and a PortInfo Set the AL sees."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from ibal.al import AlManager, Ca
from ibal.mad import MadElement, MadService, MadSvc, put_mad, reg_mad_svc, transact
from ibal.providers.mock import MockFabric, MockProvider
from ibal.types import QP1_WELL_KNOWN_QKEY, AsyncEvent, MadAddr, QpType
from ibal.wire.mad import header, perf, smp
from ibal.wire.mad.consts import Method, MgmtClass, PerfAttr, SmpAttr

WAIT = 10.0
TO_FAR = [1, 2, 2, 2]  # mock0 port 1, sw0 port 2, sw1 port 2, sw2 port 2


@dataclass
class Subnet:
    fabric: MockFabric
    mgr: AlManager
    ca: Ca
    smi: MadService
    smi_lid: MadService
    gsi: MadService


@pytest.fixture
def net() -> Iterator[Subnet]:
    fabric = MockFabric(seed=3)
    fabric.add_ca()
    sw1, sw2 = fabric.add_switch(), fabric.add_switch()
    fabric.link(fabric.switch, sw1)
    fabric.link(sw1, sw2)
    far = fabric.add_ca("far", connect=False)
    fabric.link(far.ports[0], sw2)
    mgr = AlManager()
    try:
        mgr.add_provider(MockProvider({"fabric": fabric}))
        al = mgr.open_al()
        ca = al.open_ca(fabric.cas[0].guid)
        pd = ca.alloc_pd()
        guid = fabric.cas[0].ports[0].guid
        qp0 = pd.get_spl_qp(guid, QpType.QP0_ALIAS)
        qp1 = pd.get_spl_qp(guid, QpType.QP1_ALIAS)
        drop: queue.Queue[MadElement] = queue.Queue()
        smi = reg_mad_svc(qp0, MadSvc(int(MgmtClass.SUBN_DR), 1, recv_cb=drop.put))
        smi_lid = reg_mad_svc(qp0, MadSvc(int(MgmtClass.SUBN_LID), 1, recv_cb=drop.put))
        gsi = reg_mad_svc(qp1, MadSvc(int(MgmtClass.PERF), 1, recv_cb=drop.put))
        yield Subnet(fabric, mgr, ca, smi, smi_lid, gsi)
    finally:
        mgr.close(timeout=WAIT)
        fabric.close()


def ask(svc: MadService, mad: bytearray, addr: MadAddr) -> bytes:
    e = svc.pool_key.get_mad()
    e.mad[:] = mad
    e.addr, e.resp_expected, e.timeout_ms, e.retry_cnt = addr, True, 1000, 0
    resp = transact(svc, e, timeout=WAIT)
    out = bytes(resp.mad)
    put_mad(resp)
    return out


DR_ADDR = MadAddr(remote_qp=0, remote_qkey=0, dlid=0xFFFF)


def test_dr_subnget_over_qp0_through_two_switches(net: Subnet) -> None:
    req = header.build(MgmtClass.SUBN_DR, Method.GET, SmpAttr.NODE_INFO, tid=1, dr_path=TO_FAR)
    resp = ask(net.smi, req, DR_ADDR)
    d = header.DR_SMP.decode(resp)
    assert (d["d"], d["status"], d["hop_pointer"], d["hop_count"]) == (1, 0, 0, 4)
    ni = smp.NODE_INFO.decode(d["data"])  # type: ignore[arg-type]
    assert ni["node_guid"] == net.fabric.ca("far").guid


def test_lid_routed_subnget_to_a_switch(net: Subnet) -> None:
    sw2 = net.fabric.switches[2]
    req = header.build(MgmtClass.SUBN_LID, Method.GET, SmpAttr.SWITCH_INFO, tid=2)
    resp = ask(net.smi_lid, req, MadAddr(remote_qp=0, remote_qkey=0, dlid=sw2.lid))
    assert header.header(resp).status == 0
    si = smp.SWITCH_INFO.decode(resp[header.SMP_DATA : header.SMP_DATA + 64])
    assert si["linear_fdb_top"] == max(sw2.lft)


def test_perfmgt_get_over_qp1(net: Subnet) -> None:
    far = net.fabric.ca("far").ports[0]
    addr = MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY, dlid=far.lid)
    data = perf.PORT_COUNTERS.encode(port_select=1)
    req = header.build(MgmtClass.PERF, Method.GET, PerfAttr.PORT_COUNTERS, tid=3, data=data)
    first = perf.PORT_COUNTERS.decode(ask(net.gsi, req, addr)[header.PERF_DATA :])
    second = perf.PORT_COUNTERS.decode(ask(net.gsi, req, addr)[header.PERF_DATA :])
    # between the two reads the port received the second request and sent the first reply
    assert second["port_rcv_pkts"] == first["port_rcv_pkts"] + 1  # type: ignore[operator]
    assert second["port_xmit_pkts"] == first["port_xmit_pkts"] + 1  # type: ignore[operator]


def test_port_info_set_over_qp0_raises_lid_change_in_the_al(net: Subnet) -> None:
    fabric = net.fabric
    far = fabric.ca("far")
    events: queue.Queue[object] = queue.Queue()
    al = net.mgr.open_al()
    al.open_ca(far.guid, event_cb=events.put)
    path = TO_FAR
    get = header.build(MgmtClass.SUBN_DR, Method.GET, SmpAttr.PORT_INFO, tid=4, dr_path=path)
    pi = smp.PORT_INFO.decode(ask(net.smi, get, DR_ADDR)[header.SMP_DATA : header.SMP_DATA + 64])
    pi["lid"] = 0x123
    put = header.build(MgmtClass.SUBN_DR, Method.SET, SmpAttr.PORT_INFO, tid=5, dr_path=path,
                       data=smp.PORT_INFO.encode(pi))  # fmt: skip
    resp = ask(net.smi, put, DR_ADDR)
    assert header.DR_SMP.decode(resp)["status"] == 0
    assert far.ports[0].lid == 0x123
    rec = events.get(timeout=WAIT)
    assert rec.code is AsyncEvent.LID_CHANGE and rec.port_num == 1  # type: ignore[attr-defined]
    assert net.ca.query().ports[0].lid == fabric.cas[0].ports[0].lid
    assert al.query_ca_by_guid(far.guid).ports[0].lid == 0x123
