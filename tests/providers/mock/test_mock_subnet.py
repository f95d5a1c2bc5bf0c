"""The mock subnet: SMAs on CA ports and switches, DR/LID SMP forwarding, the SM, the PMA."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from mockenv import UD_QKEY, Node, connect, open_node, special_ready, ud_ready

from ibal.ci import Handle
from ibal.providers.mock import MockFabric
from ibal.providers.mock.capture import ib_frame, ib_packets
from ibal.providers.mock.packets import Packet, PacketOp
from ibal.providers.mock.pma import wire_cost
from ibal.providers.mock.smi import send
from ibal.providers.mock.topology import Switch
from ibal.status import ResourceBusy, Timeout
from ibal.types import (
    QP1_WELL_KNOWN_QKEY,
    AvAttr,
    QpCaps,
    QpType,
    RecvWr,
    SendWr,
    UdDest,
    WrType,
)
from ibal.wire.mad import dump, header, perf, smp
from ibal.wire.mad.consts import MadStatus, Method, MgmtClass, PerfAttr, SmpAttr

# mock0, mock1 on sw0 ports 1, 2; sw0:3 - sw1:1; sw1:2 - sw2:1; sw2:2 - far
TO_FAR = [1, 3, 2, 2]


@pytest.fixture
def fabric() -> Iterator[MockFabric]:
    fab = MockFabric(seed=0)
    fab.add_ca()
    fab.add_ca()
    sw1, sw2 = fab.add_switch("sw1"), fab.add_switch("sw2")
    fab.link(fab.switch, sw1)
    fab.link(sw1, sw2)
    far = fab.add_ca("far", connect=False, description="far node")
    fab.link(far.ports[0], sw2)
    fab.manual_clock()
    yield fab
    fab.close()


@pytest.fixture
def a(fabric: MockFabric) -> Node:
    return open_node(fabric.cas[0])


def dr_get(attr: int, path: list[int], attr_mod: int = 0, data: bytes = b"") -> bytearray:
    return header.build(MgmtClass.SUBN_DR, Method.GET, attr, tid=0x42, attr_mod=attr_mod,
                        dr_path=path, data=data)  # fmt: skip


def smp_data(resp: bytes) -> bytes:
    return bytes(resp[header.SMP_DATA : header.SMP_DATA + header.SMP_DATA_SIZE])


def ask(n: Node, attr: int, path: list[int], attr_mod: int = 0, data: bytes = b"") -> bytes:
    """The data of ``n``'s DR SubnGet along ``path`` (checked: status 0)."""
    resp = n.ca.local_mad(n.h, 1, bytes(dr_get(attr, path, attr_mod, data)))
    assert header.DR_SMP.decode(resp)["status"] == 0
    return smp_data(resp)


def test_dr_smp_across_two_switches_reaches_the_remote_ca(fabric: MockFabric, a: Node) -> None:
    far = fabric.ca("far")
    resp = a.ca.local_mad(a.h, 1, bytes(dr_get(SmpAttr.NODE_INFO, TO_FAR)))
    d = header.DR_SMP.decode(resp)
    assert (d["method"], d["d"], d["status"], d["tid"]) == (Method.GET_RESP, 1, 0, 0x42)
    assert (d["hop_count"], d["hop_pointer"]) == (4, 0)  # back at the requester
    ni = smp.NODE_INFO.decode(d["data"])  # type: ignore[arg-type]
    assert ni == {
        "base_version": 1, "class_version": 1, "node_type": smp.NodeType.CA, "num_ports": 1,
        "system_image_guid": far.system_image_guid, "node_guid": far.guid,
        "port_guid": far.ports[0].guid, "partition_cap": 64,
        "device_id": far.attr_device_id & 0xFFFF, "revision": far.attr_revision,
        "local_port_num": 1, "vendor_id": far.attr_vendor_id,
    }  # fmt: skip
    # Each node wrote the port it was entered by: sw0 by 1, sw1 by 1, sw2 by 1, far by 1.
    ret = bytes(d["return_path"])  # type: ignore[arg-type]
    assert ret[1:5] == bytes([1, 1, 1, 1]) and ret[5:] == bytes(59)
    assert bytes(d["initial_path"])[:5] == bytes([0, *TO_FAR])  # type: ignore[arg-type]


def test_dr_smp_to_each_switch_says_where_it_came_in(fabric: MockFabric, a: Node) -> None:
    sw0, sw1, sw2 = fabric.switches
    for path, sw, in_port in (([1], sw0, 1), ([1, 3], sw1, 1), ([1, 3, 2], sw2, 1)):
        ni = smp.NODE_INFO.decode(ask(a, SmpAttr.NODE_INFO, path))
        assert (ni["node_type"], ni["node_guid"], ni["local_port_num"]) == (
            smp.NodeType.SWITCH,
            sw.guid,
            in_port,
        )
        assert ni["num_ports"] == sw.num_ports
        # port 0 is the management port: the switch's LID; external ports have none.
        # LocalPortNum is the port the SMP came in by, whichever port is asked (ibnetdiscover
        # relies on it to tell the port it came by from the others)
        pi0 = smp.PORT_INFO.decode(ask(a, SmpAttr.PORT_INFO, path, 0))
        pi2 = smp.PORT_INFO.decode(ask(a, SmpAttr.PORT_INFO, path, 2))
        assert (pi0["lid"], pi0["local_port_num"], pi0["master_sm_lid"]) == (
            sw.lid, in_port, fabric.sm_lid,
        )  # fmt: skip
        assert (pi2["lid"], pi2["local_port_num"], pi2["port_state"]) == (
            0, in_port, smp.PortState.ACTIVE,
        )  # fmt: skip


def test_lid_routed_smp_reaches_every_node(fabric: MockFabric) -> None:
    src = fabric.cas[0].ports[0]
    targets: list[tuple[int, int]] = [(p.lid, p.guid) for p in fabric.ports()]
    targets += [(s.lid, s.guid) for s in fabric.switches]
    assert len({lid for lid, _ in targets}) == 6
    for lid, guid in targets:
        req = header.build(MgmtClass.SUBN_LID, Method.GET, SmpAttr.NODE_INFO, tid=lid)
        resp = send(fabric, src, bytes(req), dlid=lid)
        assert resp is not None, hex(lid)
        assert header.header(resp).status == 0
        assert smp.NODE_INFO.decode(smp_data(resp))["port_guid"] == guid
    # the LFTs the SM filled: sw1 reaches mock0 by port 1 (towards sw0), far by port 2
    sw1 = fabric.switches[1]
    lft = smp_data(
        send(
            fabric,
            src,
            bytes(header.build(MgmtClass.SUBN_LID, Method.GET, SmpAttr.LINEAR_FT, tid=1)),
            dlid=sw1.lid,
        )
        or b""
    )
    assert lft[src.lid] == 1 and lft[fabric.ca("far").ports[0].lid] == 2 and lft[0] == 0xFF
    # a LID nobody owns: no LFT entry, dropped and counted
    before = fabric.counters.smp_dropped
    req = header.build(MgmtClass.SUBN_LID, Method.GET, SmpAttr.NODE_INFO, tid=9)
    assert send(fabric, src, bytes(req), dlid=0x999) is None
    assert fabric.counters.smp_dropped == before + 1


def test_lids_and_sm_lid_stay_what_they_were(fabric: MockFabric) -> None:
    assert [p.lid for p in fabric.ports()] == [1, 2, 3]
    assert fabric.sm_lid == 1
    assert [s.lid for s in fabric.switches] == [0xBFFF, 0xBFFE, 0xBFFD]


def test_sm_info_hides_the_sm_key_from_who_does_not_know_it(fabric: MockFabric, a: Node) -> None:
    fabric.sm.sm_key = 0x1234_5678
    port = a.ca.ports[0]
    assert port.lid == fabric.sm_lid
    out = smp.SM_INFO.decode(ask(a, SmpAttr.SM_INFO, []))
    assert (out["guid"], out["sm_key"], out["priority"], out["sm_state"]) == (
        port.guid,
        0,
        0,
        smp.SmState.MASTER,
    )
    knows = smp.SM_INFO.encode(sm_key=0x1234_5678)
    out = smp.SM_INFO.decode(ask(a, SmpAttr.SM_INFO, [], data=knows))
    assert out["sm_key"] == 0x1234_5678
    # the SM's port says IsSM; another port has no SMInfo
    pi = smp.PORT_INFO.decode(ask(a, SmpAttr.PORT_INFO, []))
    assert pi["capability_mask"] & smp.CapabilityMask.IS_SM
    resp = a.ca.local_mad(a.h, 1, bytes(dr_get(SmpAttr.SM_INFO, TO_FAR)))
    assert header.DR_SMP.decode(resp)["status"] == MadStatus.METHOD_ATTR_UNSUPPORTED


def test_port_info_set_over_dr_moves_a_remote_lid(fabric: MockFabric, a: Node) -> None:
    far = fabric.ca("far")
    f = open_node(far)
    pi = smp.PORT_INFO.decode(ask(a, SmpAttr.PORT_INFO, TO_FAR))
    pi["lid"] = 0x40
    req = header.build(MgmtClass.SUBN_DR, Method.SET, SmpAttr.PORT_INFO, tid=7, dr_path=TO_FAR,
                       data=smp.PORT_INFO.encode(pi))  # fmt: skip
    resp = a.ca.local_mad(a.h, 1, bytes(req))
    assert header.DR_SMP.decode(resp)["status"] == 0
    assert smp.PORT_INFO.decode(smp_data(resp))["lid"] == 0x40 == far.ports[0].lid
    assert f.event_codes() == ["LID_CHANGE"]
    # LID-routed SMPs follow the new LID (the SM refilled the LFTs)
    got = send(
        fabric,
        a.ca.ports[0],
        bytes(header.build(MgmtClass.SUBN_LID, Method.GET, SmpAttr.NODE_INFO, tid=1)),
        dlid=0x40,
    )
    assert got is not None and smp.NODE_INFO.decode(smp_data(got))["node_guid"] == far.guid
    # a LID someone holds is refused
    pi["lid"] = a.ca.ports[0].lid
    req[header.SMP_DATA : header.SMP_DATA + 64] = smp.PORT_INFO.encode(pi)
    assert header.DR_SMP.decode(a.ca.local_mad(a.h, 1, bytes(req)))["status"] == (
        MadStatus.INVALID_FIELD
    )
    assert far.ports[0].lid == 0x40


@pytest.mark.parametrize(
    ("why", "hop_cnt", "hop_ptr", "path"),
    [
        ("hop count over 63", 64, 0, TO_FAR),
        ("hop pointer not 0 when sent", 4, 2, TO_FAR),
        ("a port with no cable", 2, 0, [1, 30]),
        ("a port the switch does not have", 2, 0, [1, 200]),
        ("the CA's port is not the first hop", 1, 0, [2]),
        ("a CA in the middle of the path", 3, 0, [1, 2, 1]),
    ],
)
def test_malformed_dr_smps_are_dropped_and_counted(
    fabric: MockFabric, a: Node, why: str, hop_cnt: int, hop_ptr: int, path: list[int]
) -> None:
    req = dr_get(SmpAttr.NODE_INFO, path)
    req[6], req[7] = hop_ptr, hop_cnt
    before = fabric.counters.smp_dropped
    with pytest.raises(Timeout):
        a.ca.local_mad(a.h, 1, bytes(req))
    assert fabric.counters.smp_dropped == before + 1, why


def test_dr_request_with_the_d_bit_or_a_lid_routed_tail_from_a_ca_is_dropped(
    fabric: MockFabric, a: Node
) -> None:
    # D bit set; DrDLID 0x00FF after a path ending at a CA (only a switch LID-routes on)
    for patch in ((4, 0x80), (34, 0x00)):
        req = dr_get(SmpAttr.NODE_INFO, TO_FAR)
        req[patch[0]] = patch[1]
        with pytest.raises(Timeout):
            a.ca.local_mad(a.h, 1, bytes(req))
    assert fabric.counters.smp_dropped == 2


def test_unsupported_method_and_attribute_get_their_status(a: Node) -> None:
    for method, attr, status in (
        (0x05, SmpAttr.NODE_INFO, MadStatus.METHOD_UNSUPPORTED),
        (Method.SET, SmpAttr.NODE_INFO, MadStatus.METHOD_ATTR_UNSUPPORTED),
        (Method.GET, SmpAttr.VL_ARB_TABLE, MadStatus.METHOD_ATTR_UNSUPPORTED),
        (Method.GET, SmpAttr.SWITCH_INFO, MadStatus.METHOD_ATTR_UNSUPPORTED),  # a CA
    ):
        req = header.build(MgmtClass.SUBN_DR, method, attr, tid=1, dr_path=TO_FAR)
        assert header.DR_SMP.decode(a.ca.local_mad(a.h, 1, bytes(req)))["status"] == status


def test_the_mock_answers_dump_like_a_real_subnet(fabric: MockFabric, a: Node) -> None:
    sw2 = fabric.switches[2]
    path = [1, 3, 2]
    target = dump.portid_str(dr_path=path)
    ni = ask(a, SmpAttr.NODE_INFO, path)
    text = dump.smpquery_nodeinfo(ni, target)
    assert text.splitlines()[0] == "# Node info: DR path slid 65535; dlid 65535; 0,1,3,2"
    assert "NodeType:........................Switch" in text
    assert f"Guid:............................0x{sw2.guid:016x}" in text
    assert "LocalPort:.......................1" in text
    si = ask(a, SmpAttr.SWITCH_INFO, path)
    text = dump.smpquery_switchinfo(si, target)
    assert f"LinearFdbTop:....................{max(sw2.lft)}" in text
    pi = ask(a, SmpAttr.PORT_INFO, TO_FAR)
    text = dump.smpquery_portinfo(pi, dump.portid_str(dr_path=TO_FAR), 1)
    assert "LinkState:.......................Active" in text
    assert "PhysLinkState:...................LinkUp" in text
    assert f"Lid:.............................{fabric.ca('far').ports[0].lid}" in text
    assert f"SMLid:...........................{fabric.sm_lid}" in text
    assert "LinkWidthActive:.................4X" in text


# ===================================================================== PMA
def pma(node: Node, method: int, attr: int, select: int = 0, port: int = 1) -> bytes:
    table = perf.PORT_COUNTERS_EXT if attr == PerfAttr.PORT_COUNTERS_EXT else perf.PORT_COUNTERS
    data = table.encode(port_select=port, counter_select=select)
    req = header.build(MgmtClass.PERF, method, attr, tid=3, data=data)
    resp = node.ca.local_mad(node.h, 1, bytes(req))
    assert header.header(resp).status == 0
    return bytes(resp[header.PERF_DATA : header.PERF_DATA + table.size])


def counters(node: Node, ext: bool = False) -> dict[str, int]:
    attr = PerfAttr.PORT_COUNTERS_EXT if ext else PerfAttr.PORT_COUNTERS
    table = perf.PORT_COUNTERS_EXT if ext else perf.PORT_COUNTERS
    d = table.decode(pma(node, Method.GET, attr))
    return {k: int(v) for k, v in d.items() if k.startswith("port_") and "cast" not in k}


def test_port_counters_move_by_exactly_an_rdma_write(fabric: MockFabric, a: Node) -> None:
    b = open_node(fabric.cas[1])
    qa, _ = connect(a, b)
    pma(a, Method.SET, PerfAttr.PORT_COUNTERS, select=0xF000)
    pma(b, Method.SET, PerfAttr.PORT_COUNTERS, select=0xF000)
    seen: list[Packet] = []
    fabric.capture = lambda p: seen.append(p.clone())
    length = 5 * 1024 + 3  # several MTU-sized packets and a padded last one
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, length)],
                               remote_addr=b.addr(0), rkey=b.mr.rkey)])  # fmt: skip
    fabric.run_until_idle()
    assert [w.status.name for w in a.poll()] == ["SUCCESS"]
    fabric.capture = None
    # what the wire carried, frame by frame (LRH to VCRC), from the pcap encoder
    out = [len(ib_frame(m, p)) for m in seen if m.src_port is a.ca.ports[0] for p in ib_packets(m)]
    back = [len(ib_frame(m, p)) for m in seen if m.src_port is b.ca.ports[0] for p in ib_packets(m)]
    assert len(out) > 1 and len(back) == 1  # the write's packets; one ACK
    ca, cb = counters(a), counters(b)
    assert (ca["port_xmit_pkts"], ca["port_xmit_data"]) == (len(out), sum(out) // 4)
    assert (cb["port_rcv_pkts"], cb["port_rcv_data"]) == (len(out), sum(out) // 4)
    assert (cb["port_xmit_pkts"], cb["port_xmit_data"]) == (1, sum(back) // 4)
    assert (ca["port_rcv_pkts"], ca["port_rcv_data"]) == (1, sum(back) // 4)
    assert counters(a, ext=True)["port_xmit_data"] >= ca["port_xmit_data"]
    # a Set clears what CounterSelect names, nothing else
    pma(a, Method.SET, PerfAttr.PORT_COUNTERS, select=1 << 12)  # PortXmitData
    after = counters(a)
    assert after["port_xmit_data"] == 0 and after["port_xmit_pkts"] == len(out)
    assert counters(a, ext=True)["port_xmit_data"] > 0  # the extended one keeps its own


def test_32_bit_counters_saturate_64_bit_ones_do_not(a: Node) -> None:
    pma(a, Method.SET, PerfAttr.PORT_COUNTERS_EXT, select=0xF)
    pma(a, Method.SET, PerfAttr.PORT_COUNTERS, select=0xF000)
    a.ca.ports[0].pm[0] += 5 << 32  # as if 80 GiB had left the port
    assert counters(a)["port_xmit_data"] == 0xFFFF_FFFF
    assert counters(a, ext=True)["port_xmit_data"] == 5 << 32


def test_pma_class_port_info_and_bad_requests(a: Node) -> None:
    req = header.build(MgmtClass.PERF, Method.GET, PerfAttr.CLASS_PORT_INFO, tid=1)
    resp = a.ca.local_mad(a.h, 1, bytes(req))
    cpi = header.CLASS_PORT_INFO.decode(resp[header.PERF_DATA :])
    # AllPortSelect (0x100) and PortCountersExtended without the IETF counters (0x400)
    assert (cpi["base_version"], cpi["class_version"], cpi["capability_mask"]) == (1, 1, 0x500)
    for method, attr, port, status in (
        (Method.GET, PerfAttr.PORT_SAMPLES_CONTROL, 1, MadStatus.METHOD_ATTR_UNSUPPORTED),
        (0x05, PerfAttr.PORT_COUNTERS, 1, MadStatus.METHOD_UNSUPPORTED),
        (Method.GET, PerfAttr.PORT_COUNTERS, 7, MadStatus.INVALID_FIELD),
    ):
        data = perf.PORT_COUNTERS.encode(port_select=port)
        req = header.build(MgmtClass.PERF, method, attr, tid=1, data=data)
        assert header.header(a.ca.local_mad(a.h, 1, bytes(req))).status == status


def test_switches_are_numbered_and_stay_out_of_ca_routes(fabric: MockFabric) -> None:
    sw0 = fabric.switch
    assert isinstance(sw0, Switch) and sw0.port_links[3] is not None
    assert [sw0.port_of(ln) for ln in sw0.links] == [1, 2, 3]


# ============================================================ QP0 and QP1
def special(node: Node, qp_type: QpType) -> Handle:
    qp = node.ca.create_spl_qp(node.pd, 1, qp_type, QpCaps(8, 8, 1, 1, 0), node.cq, node.cq, "m")
    special_ready(node, qp.handle, QP1_WELL_KNOWN_QKEY if qp_type is QpType.QP1 else 0)
    node.ca.post_recv(qp.handle, [RecvWr(7, [node.sge(4096, 40 + 256)])])
    return qp.handle


def over_qp(node: Node, qp: Handle, mad: bytes, dlid: int, qpn: int) -> bytes:
    node.buf[0:256] = mad
    av = node.ca.create_av(node.pd, AvAttr(1, dlid=dlid))
    qkey = QP1_WELL_KNOWN_QKEY if qpn == 1 else 0
    node.ca.post_send(qp, [SendWr(1, WrType.SEND, [node.sge(0, 256)],
                                  ud=UdDest(av=av, remote_qp=qpn, remote_qkey=qkey))])  # fmt: skip
    wcs = node.poll()
    assert sorted(w.status.name for w in wcs) == ["SUCCESS", "SUCCESS"]
    (recv,) = [w for w in wcs if w.wr_id == 7]
    assert recv.length == 40 + 256 and recv.src_qp == qpn
    return bytes(node.buf[4096 + 40 : 4096 + 296])


def test_dr_smp_over_qp0_through_two_switches(fabric: MockFabric, a: Node) -> None:
    qp0 = special(a, QpType.QP0)
    resp = over_qp(a, qp0, bytes(dr_get(SmpAttr.NODE_INFO, TO_FAR)), 0xFFFF, 0)
    d = header.DR_SMP.decode(resp)
    assert (d["method"], d["d"], d["status"], d["hop_pointer"]) == (Method.GET_RESP, 1, 0, 0)
    ni = smp.NODE_INFO.decode(d["data"])  # type: ignore[arg-type]
    assert ni["node_guid"] == fabric.ca("far").guid


def test_lid_routed_smp_over_qp0_to_a_switch(fabric: MockFabric, a: Node) -> None:
    qp0 = special(a, QpType.QP0)
    sw2 = fabric.switches[2]
    req = header.build(MgmtClass.SUBN_LID, Method.GET, SmpAttr.NODE_INFO, tid=5)
    resp = over_qp(a, qp0, bytes(req), sw2.lid, 0)
    assert smp.NODE_INFO.decode(smp_data(resp))["node_guid"] == sw2.guid
    assert a.poll() == []


def test_perfmgt_over_qp1_reads_the_remote_ports_counters(fabric: MockFabric, a: Node) -> None:
    qp1 = special(a, QpType.QP1)
    far = fabric.ca("far").ports[0]
    far.pm[2] += 12345  # packets it sent
    data = perf.PORT_COUNTERS.encode(port_select=1)
    req = header.build(MgmtClass.PERF, Method.GET, PerfAttr.PORT_COUNTERS, tid=9, data=data)
    resp = over_qp(a, qp1, bytes(req), far.lid, 1)
    assert header.header(resp).status == 0 and header.header(resp).tid == 9
    pc = perf.PORT_COUNTERS.decode(resp[header.PERF_DATA :])
    assert pc["port_xmit_pkts"] == 12345
    assert pc["port_rcv_pkts"] == 1  # the request itself; its reply is counted after


def test_wire_cost_matches_the_captured_frames_of_every_operation(
    fabric: MockFabric, a: Node
) -> None:
    b = open_node(fabric.cas[1])
    qa, _ = connect(a, b)
    ua, ub = a.qp(QpType.UD), b.qp(QpType.UD)
    ud_ready(a, ua)
    ud_ready(b, ub)
    b.ca.post_recv(ub, [RecvWr(1, [b.sge(8192, 4096)])])
    seen: list[Packet] = []
    fabric.capture = lambda p: seen.append(p.clone())
    rkey, far = b.mr.rkey, b.addr(0)
    av = a.ca.create_av(a.pd, AvAttr(1, dlid=b.lid))
    a.ca.post_send(qa, [
        SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 3000)], remote_addr=far, rkey=rkey),
        SendWr(2, WrType.RDMA_READ, [a.sge(4096, 9000)], remote_addr=far, rkey=rkey),
        SendWr(3, WrType.COMPARE_SWAP, [a.sge(16000, 8)], remote_addr=far, rkey=rkey,
               compare_add=0, swap=1),
        SendWr(4, WrType.FETCH_ADD, [a.sge(16008, 8)], remote_addr=far + 8, rkey=rkey,
               compare_add=1),
    ])  # fmt: skip
    ud = UdDest(av=av, remote_qp=ub.num, remote_qkey=UD_QKEY)
    a.ca.post_send(ua, [SendWr(5, WrType.SEND, [a.sge(0, 777)], ud=ud)])
    fabric.run_until_idle()
    assert sorted(w.status.name for w in a.poll()) == ["SUCCESS"] * 5
    fabric.capture = None
    ops = {m.op.name for m in seen}
    assert {"RDMA_WRITE", "RDMA_READ_REQ", "READ_RESP", "COMPARE_SWAP", "FETCH_ADD",
            "ATOMIC_ACK", "ACK", "SEND"} <= ops  # fmt: skip
    for m in seen:
        frames = [len(ib_frame(m, p)) for p in ib_packets(m)]
        assert wire_cost(m) == (len(frames), sum(frames) // 4), m


def test_a_full_switch_refuses_another_cable(fabric: MockFabric) -> None:
    small = fabric.add_switch("small", ports=1)
    fabric.link(small, fabric.switches[2])
    ca = fabric.add_ca("spare", connect=False)
    with pytest.raises(ResourceBusy):
        fabric.link(ca.ports[0], small)
    assert ca.ports[0].link is None and small.port_links == [None, small.links[0]]


# ============================================================ DR SMPs with LID-routed parts
def dr_lid(attr: int, path: list[int], slid: int = 0xFFFF, dlid: int = 0xFFFF) -> bytes:
    return bytes(header.build(MgmtClass.SUBN_DR, Method.GET, attr, tid=0x43, dr_path=path,
                              dr_slid=slid, dr_dlid=dlid))  # fmt: skip


def test_dr_smp_with_a_lid_routed_head(fabric: MockFabric, a: Node) -> None:
    """LID-routed to sw1, directed from there (sw1:2 -> sw2, sw2:2 -> far), back to DrSLID."""
    qp0 = special(a, QpType.QP0)
    sw1, sw2, far = fabric.switches[1], fabric.switches[2], fabric.ca("far")
    me = a.ca.ports[0].lid
    for n, (path, guid, entered) in enumerate(
        (([], sw1.guid, 1), ([2], sw2.guid, 1), ([2, 2], far.guid, 1))
    ):
        if n:  # special() posted one receive
            a.ca.post_recv(qp0, [RecvWr(7, [a.sge(4096, 40 + 256)])])
        resp = over_qp(a, qp0, dr_lid(SmpAttr.NODE_INFO, path, slid=me), sw1.lid, 0)
        d = header.DR_SMP.decode(resp)
        assert (d["method"], d["d"], d["status"], d["hop_pointer"]) == (Method.GET_RESP, 1, 0, 0)
        assert (d["dr_slid"], d["dr_dlid"], d["hop_count"]) == (me, 0xFFFF, len(path))
        ni = smp.NODE_INFO.decode(d["data"])  # type: ignore[arg-type]
        assert (ni["node_guid"], ni["local_port_num"]) == (guid, entered)
        assert list(bytes(d["return_path"])[1 : len(path) + 1]) == [1] * len(path)  # type: ignore[arg-type]
    assert fabric.counters.smp_dropped == 0


def test_dr_smp_with_a_lid_routed_tail(fabric: MockFabric, a: Node) -> None:
    """Directed to sw1 (a:1, sw0:3), then LID-routed to DrDLID, and back the same way."""
    sw1, far, b = fabric.switches[1], fabric.ca("far"), fabric.cas[1]
    for dlid, guid in ((far.ports[0].lid, far.guid), (b.ports[0].lid, b.guid),
                       (fabric.switches[2].lid, fabric.switches[2].guid)):  # fmt: skip
        resp = a.ca.local_mad(a.h, 1, dr_lid(SmpAttr.NODE_INFO, [1, 3], dlid=dlid))
        d = header.DR_SMP.decode(resp)
        assert (d["status"], d["hop_pointer"], d["dr_dlid"]) == (0, 0, dlid)
        assert smp.NODE_INFO.decode(d["data"])["node_guid"] == guid  # type: ignore[arg-type]
        assert list(bytes(d["return_path"])[1:3]) == [1, 1]  # type: ignore[arg-type]
    assert sw1.lft  # the SM's tables carried the tail


def test_dr_smp_with_both_lid_routed_ends(fabric: MockFabric, a: Node) -> None:
    qp0 = special(a, QpType.QP0)
    sw1, far = fabric.switches[1], fabric.ca("far")
    me = a.ca.ports[0].lid
    req = dr_lid(SmpAttr.NODE_DESC, [2], slid=me, dlid=far.ports[0].lid)
    resp = over_qp(a, qp0, req, sw1.lid, 0)
    d = header.DR_SMP.decode(resp)
    assert (d["status"], d["dr_slid"], d["dr_dlid"]) == (0, me, far.ports[0].lid)
    assert bytes(d["data"]).rstrip(b"\0") == b"far node"  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("why", "path", "slid_of", "dlid_of"),
    [
        ("DrSLID is not the requester's LID", [2], "b", "sw1"),
        ("the LID-routed head ends at a CA", [], "a", "b"),
        ("the head's LRH DLID is the permissive LID", [2], "a", None),
        ("the tail's DrDLID has no route", [2], "a", "nowhere"),
    ],
)
def test_dr_smps_with_bad_lid_routed_parts_are_dropped(
    fabric: MockFabric, a: Node, why: str, path: list[int], slid_of: str, dlid_of: str | None
) -> None:
    lids = {"a": a.ca.ports[0].lid, "b": fabric.cas[1].ports[0].lid,
            "sw1": fabric.switches[1].lid, None: 0xFFFF, "nowhere": 0x3000}  # fmt: skip
    tail = 0x3000 if dlid_of == "nowhere" else 0xFFFF
    lrh = fabric.switches[1].lid if dlid_of in ("nowhere", None) else lids[dlid_of]
    if dlid_of is None:
        lrh = 0xFFFF
    req = dr_lid(SmpAttr.NODE_INFO, path, slid=lids[slid_of], dlid=tail)
    before = fabric.counters.smp_dropped
    assert send(fabric, a.ca.ports[0], req, lrh) is None, why
    assert fabric.counters.smp_dropped == before + 1, why


# ============================================================ SM_CHANGE
def test_a_new_sm_lid_is_an_sm_change_on_every_port(fabric: MockFabric, a: Node) -> None:
    dual = fabric.add_ca("dual", ports=2)
    nodes = [open_node(c) for c in fabric.cas[1:]]  # mock1, far, dual
    b_lid = fabric.cas[1].ports[0].lid
    pi = smp.PORT_INFO.decode(ask(a, SmpAttr.PORT_INFO, TO_FAR))
    pi["master_sm_lid"] = b_lid  # an SM on mock1 took over
    req = header.build(MgmtClass.SUBN_DR, Method.SET, SmpAttr.PORT_INFO, tid=8, dr_path=TO_FAR,
                       data=smp.PORT_INFO.encode(pi))  # fmt: skip
    assert header.DR_SMP.decode(a.ca.local_mad(a.h, 1, bytes(req)))["status"] == 0
    fabric.drive()
    assert fabric.sm_lid == b_lid
    got = {n.ca.name: sorted((e.code.name, e.port_num) for e in n.events) for n in nodes}
    assert got == {"mock1": [("SM_CHANGE", 1)], "far": [("SM_CHANGE", 1)],
                   "dual": [("SM_CHANGE", 1), ("SM_CHANGE", 2)]}  # fmt: skip
    assert [e.code.name for e in a.events] == ["SM_CHANGE"]
    for n in nodes:
        assert all(p.sm_lid == b_lid for p in n.ca.query_ca(n.h).ports)
        n.events.clear()
    # the SM's port moving is a LID_CHANGE there and an SM_CHANGE everywhere
    fabric.set_lid(fabric.cas[1].ports[0], 0x77)
    assert fabric.sm_lid == 0x77
    assert nodes[0].event_codes() == ["LID_CHANGE", "SM_CHANGE"]
    assert [n.event_codes() for n in nodes[1:]] == [["SM_CHANGE"], ["SM_CHANGE"] * 2]
    assert dual.ports[1].lid != 0x77
    # back to the old SM LID: one SM_CHANGE per port again; the same SM LID once more: none
    for n in nodes:
        n.events.clear()
    for _ in range(2):
        assert header.DR_SMP.decode(a.ca.local_mad(a.h, 1, bytes(req)))["status"] == 0
    assert fabric.sm_lid == b_lid
    assert [n.event_codes() for n in nodes] == [["SM_CHANGE"], ["SM_CHANGE"], ["SM_CHANGE"] * 2]


# ============================================================ switch PMA, error counters
def sw_pma(sw: Switch, method: int, port: int, select: int = 0) -> dict[str, int]:
    from ibal.providers.mock.pma import answer_switch

    data = perf.PORT_COUNTERS.encode(port_select=port, counter_select=select)
    req = header.build(MgmtClass.PERF, method, PerfAttr.PORT_COUNTERS, tid=4, data=data)
    resp = answer_switch(sw, bytes(req))
    assert header.header(resp).status == 0
    size = perf.PORT_COUNTERS.size
    return {k: int(v) for k, v in perf.PORT_COUNTERS.decode(
        resp[header.PERF_DATA : header.PERF_DATA + size]).items()}  # fmt: skip


DATA = ("port_xmit_data", "port_rcv_data", "port_xmit_pkts", "port_rcv_pkts")


def test_switch_ports_count_the_traffic_crossing_them(fabric: MockFabric, a: Node) -> None:
    """a -> sw0:1, sw0:3 -> sw1:1, sw1:2 -> sw2:1, sw2:2 -> far: every switch port on the path
    sends and receives exactly what the two CA ports do; the other ports see nothing."""
    f = open_node(fabric.ca("far"))
    qa, _ = connect(a, f)
    sws = fabric.switches
    for sw in sws:
        sw_pma(sw, Method.SET, 0xFF, select=0xFFFF)
    pma(a, Method.SET, PerfAttr.PORT_COUNTERS, select=0xF000)
    pma(f, Method.SET, PerfAttr.PORT_COUNTERS, select=0xF000)
    for n in range(3):
        a.ca.post_send(qa, [SendWr(n, WrType.RDMA_WRITE, [a.sge(0, 3000 + n)],
                                   remote_addr=f.addr(0), rkey=f.mr.rkey)])  # fmt: skip
    fabric.run_until_idle()
    assert [w.status.name for w in a.poll()] == ["SUCCESS"] * 3
    ca, cf = counters(a), counters(f)
    out = [ca["port_xmit_data"], ca["port_xmit_pkts"]]
    back = [cf["port_xmit_data"], cf["port_xmit_pkts"]]
    assert out[1] >= 6 and back[1] >= 1
    for sw, (near, far) in zip(sws, ((1, 3), (1, 2), (1, 2)), strict=True):
        toward = sw_pma(sw, Method.GET, near)  # the port facing a
        away = sw_pma(sw, Method.GET, far)  # the port facing far
        assert [toward["port_rcv_data"], toward["port_rcv_pkts"]] == out, sw
        assert [away["port_xmit_data"], away["port_xmit_pkts"]] == out, sw
        assert [away["port_rcv_data"], away["port_rcv_pkts"]] == back, sw
        assert [toward["port_xmit_data"], toward["port_xmit_pkts"]] == back, sw
        # AllPortSelect: the sum over the switch's ports
        total = sw_pma(sw, Method.GET, 0xFF)
        assert [total[k] for k in DATA] == [toward[k] + away[k] for k in DATA]
    assert all(sw_pma(sws[0], Method.GET, 2)[k] == 0 for k in DATA)  # mock1's port
    # a Set with PortSelect 0xFF clears every port
    sw_pma(sws[1], Method.SET, 0xFF, select=0xF000)
    assert [sw_pma(sws[1], Method.GET, 0xFF)[k] for k in DATA] == [0, 0, 0, 0]


def test_error_counters_follow_the_faults(fabric: MockFabric, a: Node) -> None:
    b = open_node(fabric.cas[1])
    qa, _ = connect(a, b, ack_timeout=8, retry_cnt=7)
    # a corrupted packet: the receiver's ICRC check drops it, PortRcvErrors
    rule = fabric.faults.corrupt(op=PacketOp.RDMA_WRITE, count=2)
    a.ca.post_send(qa, [SendWr(1, WrType.RDMA_WRITE, [a.sge(0, 64)], remote_addr=b.addr(0),
                               rkey=b.mr.rkey)])  # fmt: skip
    fabric.settle()
    assert [w.status.name for w in a.poll()] == ["SUCCESS"]  # retried past the two
    assert rule.fired == 2 and fabric.counters.corrupted == 2
    assert counters(b)["port_rcv_errors"] == 2 and counters(a)["port_rcv_errors"] == 0
    # the link going down: LinkDownedCounter at both ends (b's port and sw0's port 2)
    link = b.ca.ports[0].link
    assert link is not None
    fabric.set_link(link, up=False)
    fabric.set_link(link, up=True)
    fabric.set_link(link, up=False)
    sw_port = sw_pma(fabric.switch, Method.GET, 2)
    assert pc_of(b)["link_downed_counter"] == 2 == sw_port["link_downed_counter"]
    assert pc_of(a)["link_downed_counter"] == 0
    # what a cannot send any more: PortXmitDiscards, one per attempt
    a.ca.post_send(qa, [SendWr(2, WrType.RDMA_WRITE, [a.sge(0, 64)], remote_addr=b.addr(0),
                               rkey=b.mr.rkey)])  # fmt: skip
    fabric.settle()
    assert [w.status.name for w in a.poll()] == ["TIMEOUT_RETRY_ERR"]
    assert counters(a)["port_xmit_discards"] == fabric.counters.dropped_link == 8  # 1 + 7 retries
    # CounterSelect bits 2, 3 and 6 clear them
    pma(b, Method.SET, PerfAttr.PORT_COUNTERS, select=(1 << 2) | (1 << 3))
    pma(a, Method.SET, PerfAttr.PORT_COUNTERS, select=1 << 6)
    assert pc_of(b)["link_downed_counter"] == counters(b)["port_rcv_errors"] == 0
    assert counters(a)["port_xmit_discards"] == 0


def pc_of(node: Node) -> dict[str, int]:
    return {k: int(v) for k, v in perf.PORT_COUNTERS.decode(
        pma(node, Method.GET, PerfAttr.PORT_COUNTERS)).items()}  # fmt: skip

