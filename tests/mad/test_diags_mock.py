"""The diagnostics in one process: ``ibal discover``'s sweep, ``smpquery`` and ``perfquery``
against the mock subnet (issue 9's "discovery runs in one process").

Each fabric's truth comes from the mock's own objects (CAs, switches, links,
LIDs, PMA counters); the tools only see what the SMA and PMA answer over the
AL's QP0/QP1 aliases.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from click.testing import CliRunner

from ibal import cli
from ibal.al import AlManager
from ibal.mad.discover import Topology, parse_ibnetdiscover, sweep
from ibal.mad.rpc import MadClient, MadError, PortId, pick_port
from ibal.providers.mock import Link, MockFabric, MockPort, MockProvider, Switch
from ibal.tools import diags

Ends = frozenset[tuple[int, int]]


@contextmanager
def client_on(fabric: MockFabric, ca: str = "mock0", via: str = "service",
              timeout_ms: int = 2000) -> Iterator[MadClient]:
    mgr = AlManager()
    mgr.add_provider(MockProvider({"fabric": fabric}))
    al = mgr.open_al()
    client = MadClient(pick_port(al, ca, via=via), timeout_ms=timeout_ms)
    try:
        yield client
    finally:
        client.close()
        al.close()
        mgr.close()


def _end(link: Link, end: MockPort | Switch) -> tuple[int, int]:
    if isinstance(end, Switch):
        return (end.guid, end.port_of(link))
    return (end.ca.guid, end.num)


def truth_links(fabric: MockFabric) -> set[Ends]:
    return {frozenset((_end(ln, ln.a), _end(ln, ln.b))) for ln in fabric.links if ln.up}


def check_topology(fabric: MockFabric, topo: Topology) -> None:
    """Exactly the fabric's nodes (reachable ones: all here), GUIDs, ports, LIDs and links."""
    cas = {c.guid: c for c in fabric.cas}
    sws = {s.guid: s for s in fabric.switches}
    assert set(topo.nodes) == set(cas) | set(sws)
    for guid, node in topo.nodes.items():
        if guid in sws:
            sw = sws[guid]
            assert node.is_switch and node.num_ports == sw.num_ports
            assert node.desc == sw.description and node.port_guid == sw.guid
            assert node.ports[0].lid == sw.lid
            for num in range(1, sw.num_ports + 1):
                ln = sw.port_links[num]
                assert (node.ports[num].state == 4) == (ln is not None and ln.up), (sw, num)
        else:
            ca = cas[guid]
            assert not node.is_switch and node.num_ports == len(ca.ports)
            cabled = {p.num: p for p in ca.ports if p.link is not None}
            assert set(node.ports) == set(cabled)
            for num, dp in node.ports.items():
                assert (dp.guid, dp.lid) == (cabled[num].guid, cabled[num].lid)
    assert topo.links() == truth_links(fabric)


def ring_fabric() -> MockFabric:
    """Four switches in a ring plus a chord and a doubled cable; dual-port CAs on two of them."""
    fabric = MockFabric(seed=11)
    fabric.add_ca()  # mock0 on sw0
    s1, s2, s3 = (fabric.add_switch(ports=8) for _ in range(3))
    s0 = fabric.switch
    for a, b in ((s0, s1), (s1, s2), (s2, s3), (s3, s0), (s0, s2), (s1, s2)):
        fabric.link(a, b)
    dual = fabric.add_ca("dual", ports=2, connect=False)
    fabric.link(dual.ports[0], s1)
    fabric.link(dual.ports[1], s3)
    same = fabric.add_ca("same", ports=2, connect=False)  # both ports on one switch
    fabric.link(same.ports[0], s2)
    fabric.link(same.ports[1], s2)
    half = fabric.add_ca("half", ports=2, connect=False)  # port 2 not cabled
    fabric.link(half.ports[0], s3)
    return fabric


def test_discover_ring_with_loops_and_dual_port_cas() -> None:
    fabric = ring_fabric()
    with client_on(fabric) as client:
        engine = sweep(client, window=16)
    assert engine.failed == []
    check_topology(fabric, engine.topology)
    assert engine.topology.root == fabric.cas[0].guid


def test_discover_from_a_dual_port_ca_and_through_bare_agents() -> None:
    fabric = ring_fabric()
    with client_on(fabric, "dual", via="agent") as client:
        engine = sweep(client, window=4)
    check_topology(fabric, engine.topology)
    assert engine.topology.root == fabric.ca("dual").guid


def test_discover_lists_ports_and_show_follow_the_fabric() -> None:
    """-l/-p/-s of the ring: every node listed once with its port count, one -p line per
    port the sweep read (a linked one naming the far end's GUID and port), one -s line
    per node with the path it was found by."""
    import re

    from ibal.mad.discover import ibnetdiscover_list, ibnetdiscover_ports, ibnetdiscover_show

    fabric = ring_fabric()
    with client_on(fabric) as client:
        topo = sweep(client, window=16).topology
    truth = {c.guid: len(c.ports) for c in fabric.cas}
    truth.update({s.guid: s.num_ports for s in fabric.switches})
    listed = re.findall(r"^(Ca|Switch)\t : 0x([0-9a-f]{16}) ports (\d+) ",
                        ibnetdiscover_list(topo, (1, 2, 3)), re.M)  # fmt: skip
    assert sorted((int(g, 16), int(n)) for _k, g, n in listed) == sorted(truth.items())
    assert [k for k, _g, _n in listed] == ["Ca"] * len(fabric.cas) + ["Switch"] * 4
    ports = ibnetdiscover_ports(topo).splitlines()
    assert len(ports) == sum(1 for n in topo.nodes.values() for p in n.ports if p)
    linked = [ln for ln in ports if " - " in ln]
    assert len(linked) == 2 * len(truth_links(fabric))
    by_port_guid = {p.guid: n for n in topo.nodes.values() for p in n.ports.values()}
    for ln in linked:
        m = re.match(r"^(CA|SW) +\d+ +(\d+) 0x(\w+) 4x \w+ - (CA|SW) +\d+ +(\d+) 0x(\w+) ", ln)
        assert m, ln
        near, far = by_port_guid[int(m.group(3), 16)], by_port_guid[int(m.group(6), 16)]
        assert near.ports[int(m.group(2))].remote == (far.guid, int(m.group(5)))
    show = ibnetdiscover_show(topo).splitlines()
    assert len(show) == len(topo.nodes) and show[0].startswith("DR path slid 0; dlid 0; 0 ->")
    for ln, n in zip(show, topo.nodes.values(), strict=True):
        assert f"{{{n.guid:016x}}}" in ln and ln.startswith(
            "DR path slid 0; dlid 0; " + ",".join(["0", *map(str, n.path)]) + " -> new ")


def generated_fabric(leaves: int = 16, spines: int = 4, per_leaf: int = 12) -> MockFabric:
    """A two-level fat tree: every leaf cabled to every spine, ``per_leaf`` CAs on each."""
    fabric = MockFabric(seed=5)
    fabric.add_ca()  # mock0 on sw0, which is one more spine
    spine = [fabric.switch, *(fabric.add_switch() for _ in range(spines - 1))]
    for _ in range(leaves):
        leaf = fabric.add_switch()
        for s in spine:
            fabric.link(leaf, s)
        for _ in range(per_leaf):
            fabric.link(fabric.add_ca(connect=False).ports[0], leaf)
    return fabric


def test_discover_a_generated_fabric_of_200_nodes() -> None:
    fabric = generated_fabric()
    assert len(fabric.cas) + len(fabric.switches) >= 200
    with client_on(fabric) as client:
        text = diags.discover(client, window=64, progress=False)
    parsed = parse_ibnetdiscover(text)
    assert parsed["links"] == truth_links(fabric)
    assert {g: n["lid"] for g, n in parsed["nodes"].items() if n["type"] == "Switch"} == {
        s.guid: s.lid for s in fabric.switches
    }
    cas = {c.guid: c for c in fabric.cas}
    assert {g: n["desc"] for g, n in parsed["nodes"].items() if n["type"] == "Ca"} == {
        g: c.description for g, c in cas.items()
    }
    for (guid, num), port in parsed["ports"].items():
        if guid in cas:
            assert port["lid"] == cas[guid].ports[num - 1].lid
    with client_on(fabric) as client:
        engine = sweep(client, window=64)
    check_topology(fabric, engine.topology)


def test_discover_after_a_link_goes_down() -> None:
    fabric = ring_fabric()
    s1 = fabric.switches[1]
    chord = next(ln for ln in fabric.links if s1 in (ln.a, ln.b) and ln.a is not ln.b
                 and isinstance(ln.a, Switch) and isinstance(ln.b, Switch))  # fmt: skip
    fabric.set_link(chord, up=False)
    with client_on(fabric) as client:
        engine = sweep(client)
    check_topology(fabric, engine.topology)


# ---------------------------------------------------------------- smpquery / perfquery


def fields(text: str) -> dict[str, str]:
    """``Name:....value`` lines of smpquery/perfquery output."""
    out = {}
    for line in text.splitlines():
        key, dots, value = line.partition(":.")
        if dots:
            out[key] = value.lstrip(".")
    return out


def test_smpquery_prints_the_fabric_state() -> None:
    fabric = ring_fabric()
    dual = fabric.ca("dual")
    s1, s2 = fabric.switches[1], fabric.switches[2]
    with client_on(fabric) as client:
        ni = fields(diags.smpquery(client, "nodeinfo", PortId(lid=dual.ports[1].lid)))
        # sw0 port 2 -> sw1, sw1 port 3 -> sw2 (the doubled cable)
        pi = fields(diags.smpquery(client, "pi", PortId(dr_path=(1, 2, 3)), 0))
        pi5 = fields(diags.smpquery(client, "portinfo", PortId(dr_path=(1, 2, 3)), 5))
        si = fields(diags.smpquery(client, "si", PortId(lid=s1.lid)))
        nd = diags.smpquery(client, "nd", PortId(lid=s2.lid))
    assert ni["NodeType"] == "Channel Adapter" and ni["NumPorts"] == "2"
    assert int(ni["Guid"], 16) == dual.guid
    assert int(ni["PortGuid"], 16) == dual.ports[1].guid and ni["LocalPort"] == "2"
    assert int(pi["Lid"]) == s2.lid and int(pi["SMLid"]) == fabric.sm_lid
    entered = s2.port_of(s1.port_links[3])  # LocalPortNum: the port the SMP came in by
    assert pi5["LinkState"] == "Active" and int(pi5["LocalPort"]) == entered
    assert s2.port_links[5] is fabric.ca("same").ports[0].link
    assert int(si["LinearFdbTop"]) == max(s1.lft)
    assert nd.strip().endswith(s2.description)


def pm_now(port: MockPort, ext: bool = False) -> list[int]:
    from ibal.providers.mock import pma

    base = pma.PCE_BASE if ext else pma.PC_BASE
    return [port.pm[i] - port.pm[base + i] for i in range(4)]


PC_NAMES = ("PortXmitData", "PortRcvData", "PortXmitPkts", "PortRcvPkts")
MAD_WORDS = (8 + 12 + 8 + 256 + 4 + 2) // 4  # a MAD's UD packet, LRH to VCRC


@pytest.mark.parametrize("extended", [False, True])
def test_perfquery_prints_the_counters_and_resets_them(extended: bool) -> None:
    fabric = ring_fabric()
    port = fabric.ca("dual").ports[1]
    with client_on(fabric) as client:
        for _ in range(3):  # traffic to count
            diags.smpquery(client, "nodeinfo", PortId(lid=port.lid))
        got = fields(diags.perfquery(client, port.lid, 2, extended=extended))
        after = pm_now(port, extended)
        # what the PMA saw when it answered: everything but its own response
        assert [int(got[n]) for n in PC_NAMES] == [after[0] - MAD_WORDS, after[1],
                                                   after[2] - 1, after[3]]  # fmt: skip
        assert after[3] >= 5  # 3 NodeInfo + ClassPortInfo + the counters' Get
        diags.perfquery(client, port.lid, 2, extended=extended, reset=True)
        assert pm_now(port, extended) == [MAD_WORDS, 0, 1, 0]  # the Set's response only
        again = fields(diags.perfquery(client, port.lid, 2, extended=extended))
    # since the reset: the Set's and ClassPortInfo's responses out, ClassPortInfo and this in
    assert [int(again[n]) for n in PC_NAMES] == [2 * MAD_WORDS, 2 * MAD_WORDS, 2, 2]


def test_perfquery_counts_the_smps_and_mads_a_port_dropped() -> None:
    from ibal.mad.rpc import Request
    from ibal.wire.mad.consts import Method, MgmtClass, SmpAttr

    fabric = ring_fabric()
    s0, s1 = fabric.switch, fabric.switches[1]
    dual = fabric.ca("dual").ports[0]  # no AL opened its CA: no QP0/QP1 there
    to_s1 = next(n for n, ln in enumerate(s0.port_links) if ln is not None and s1 in (ln.a, ln.b))
    to_dual = s1.port_of(dual.link)
    # A directed route on through dual's port: a CA does not forward, its port drops it.
    through = PortId(dr_path=(1, to_s1, to_dual, 1))
    # A MAD for QP1 of a port where nobody opened QP1 (the PMA only takes PerfMgt).
    vendor = Request(0x09, Method.GET, 0x10, PortId(lid=dual.lid))
    with client_on(fabric) as client:
        client.retries = 0
        before = fields(diags.perfquery(client, dual.lid, dual.num))
        assert (before["VL15Dropped"], before["QP1Dropped"]) == ("0", "0")
        # Only the requests that are dropped wait briefly; the PMA's answers keep the
        # default time-out (a 50 ms one failed under load).
        client.timeout_ms = 50
        for req in (Request(MgmtClass.SUBN_DR, Method.GET, SmpAttr.NODE_INFO, through),
                    vendor, vendor):  # fmt: skip
            assert client.call(req).mad is None  # dropped: no answer
        client.timeout_ms = 2000
        got = fields(diags.perfquery(client, dual.lid, dual.num))
        assert (got["VL15Dropped"], got["QP1Dropped"]) == ("1", "2")
        diags.perfquery(client, dual.lid, dual.num, reset=True)  # CounterSelect(2) all set
        again = fields(diags.perfquery(client, dual.lid, dual.num))
    assert (again["VL15Dropped"], again["QP1Dropped"]) == ("0", "0")
    fabric.close()


# ---------------------------------------------------------------- the CLI on the mock provider


def run_cli(*args: str) -> str:
    result = CliRunner().invoke(cli.main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def test_cli_diags_select_the_mock_provider() -> None:
    truth = MockFabric.from_options({"cas": 3, "ports": 2})  # what -o builds, deterministically
    opts = ("--provider", "mock", "-o", "cas=3", "-o", "ports=2")
    target = truth.cas[2].ports[1]
    ni = fields(run_cli("smpquery", *opts, "nodeinfo", str(target.lid)))
    assert int(ni["PortGuid"], 16) == target.guid and ni["LocalPort"] == "2"
    pi = fields(run_cli("smpquery", *opts, "-D", "portinfo", "0,1", str(target.num + 4)))
    assert pi["LinkState"] == "Active"
    text = run_cli("discover", *opts, "--no-progress")
    assert parse_ibnetdiscover(text)["links"] == truth_links(truth)
    pc = fields(run_cli("perfquery", *opts, "-r", str(target.lid), "2"))
    assert int(pc["PortRcvPkts"]) == 2 and int(pc["PortXmitPkts"]) == 1  # ClassPortInfo, this
    truth.close()


def test_mad_layer_takes_intenum_classes_and_refuses_bools() -> None:
    from ibal.status import InvalidParameter
    from ibal.types import QpType
    from ibal.wire.mad.consts import MgmtClass

    fabric = MockFabric(seed=2)
    fabric.add_ca()
    mgr = AlManager()
    mgr.add_provider(MockProvider({"fabric": fabric}))
    al = mgr.open_al()
    try:
        ca = al.open_ca(fabric.cas[0].guid)
        qp1 = ca.alloc_pd().get_spl_qp(fabric.cas[0].ports[0].guid, QpType.QP1_ALIAS)
        agent = qp1.register_agent(MgmtClass.PERF, 1, recv_cb=print, methods={1})
        assert agent is not None
        with pytest.raises(InvalidParameter):
            qp1.register_agent(MgmtClass.SUBN_ADM, True, recv_cb=print)
        with pytest.raises(InvalidParameter):
            qp1.register_agent(0x0A, 1, recv_cb=print, methods={True})
    finally:
        al.close()
        mgr.close()


def test_smpquery_over_a_dr_path_with_lid_routed_ends() -> None:
    """libibmad's DR portid with DrSLID/DrDLID: LID-routed to s1, directed, LID-routed on."""
    fabric = ring_fabric()
    s1 = fabric.switches[1]
    half = fabric.ca("half").ports[0]
    me = fabric.cas[0].ports[0].lid
    out = next(n for n, ln in enumerate(s1.port_links) if ln is not None
               and ln.other(s1) is fabric.switches[2])  # fmt: skip
    with client_on(fabric) as client:
        head = PortId(lid=s1.lid, dr_path=(out,), dr_slid=me)
        ni = fields(diags.smpquery(client, "nodeinfo", head))
        both = PortId(lid=s1.lid, dr_path=(out,), dr_slid=me, dr_dlid=half.lid)
        ni2 = fields(diags.smpquery(client, "nodeinfo", both))
    assert int(ni["Guid"], 16) == fabric.switches[2].guid
    assert int(ni2["PortGuid"], 16) == half.guid
    assert fabric.counters.smp_dropped == 0


def test_perfquery_on_a_switch_port_prints_the_traffic_crossing_it() -> None:
    from ibal.providers.mock import pma

    fabric = ring_fabric()
    s1 = fabric.switches[1]
    dual = fabric.ca("dual").ports[0]  # on s1
    s1_port = s1.port_of(dual.link)  # type: ignore[arg-type]
    pm = s1.pm[s1_port]
    pm[pma.XMIT_DATA] += 1000  # as if traffic had crossed: the switch PMA reports it
    pm[pma.RCV_PKTS] += 7
    with client_on(fabric) as client:
        got = fields(diags.perfquery(client, s1.lid, s1_port))
        text = diags.perfquery(client, s1.lid, s1_port, reset=True)
        again = fields(diags.perfquery(client, s1.lid, s1_port))
        cap = fields(text)
    assert (int(got["PortXmitData"]), int(got["PortRcvPkts"])) == (1000, 7)
    assert int(got["PortSelect"]) == s1_port and "CapMask: 0x500" in text
    assert cap["PortXmitData"] == "1000"
    assert (int(again["PortXmitData"]), int(again["PortRcvPkts"])) == (0, 0)


def test_ibroute_prints_each_switch_lft_with_its_destinations() -> None:
    """``ibal ibroute`` of every switch of the ring: the LFT the mock's SM filled, each LID
    named by the node that owns it (from the mock's objects, not from the SMA's answers);
    a port with LMC 1 owns two LIDs, the second printed as ibroute's "path #2 out of 2"."""
    fabric = ring_fabric()
    half = fabric.ca("half").ports[0]
    half.lid, half.lmc = 0x10, 1  # its LIDs: 0x10 and 0x11 (no other port's)
    assert all(p.lid < 0x10 for ca in fabric.cas for p in ca.ports if p is not half)
    with client_on(fabric) as client:
        texts = [diags.ibroute(client, PortId(sw.lid)) for sw in fabric.switches]
        brief = diags.ibroute(client, PortId(dr_path=(1,)), 2, 0x20, no_dests=True)
    owners = {sw.lid: ("Switch", sw.guid, sw.description) for sw in fabric.switches}
    owners |= {p.lid: ("Channel Adapter", p.guid, ca.description)
               for ca in fabric.cas for p in ca.ports if p.link is not None}  # fmt: skip
    for sw, text in zip(fabric.switches, texts, strict=True):
        assert set(sw.lft) == set(owners) | {half.lid + 1}  # every LID routed
        top = max(sw.lft)  # the mock's switch LIDs are the top ones: 0xBFFF down
        want = [f"Unicast lids [0x0-0x{top:x}] of switch Lid {sw.lid} guid 0x{sw.guid:016x} "
                f"({sw.description}):", "  Lid  Out   Destination", "       Port     Info "]
        for lid in sorted(sw.lft):
            row = f"0x{lid:04x} {sw.lft[lid]:03d} : "
            if lid == half.lid + 1:
                want.append(row + f"(path #2 out of 2: portguid 0x{half.guid:016x})")
                continue
            kind, guid, desc = owners[lid]
            want.append(row + f"({kind} portguid 0x{guid:016x}: '{desc}')")
        want.append(f"{len(sw.lft)} valid lids dumped ")
        assert text.splitlines() == want
    s0 = fabric.switches[0]
    rows = [f"0x{lid:04x} {s0.lft[lid]:03d} " for lid in sorted(s0.lft) if 2 <= lid <= 0x20]
    assert brief.splitlines()[0].startswith("Unicast lids [0x2-0x20] of switch DR path")
    assert brief.splitlines()[3:] == [*rows, f"{len(rows)} valid lids dumped "]


def test_ibroute_refuses_a_ca_and_the_cli_prints_the_table() -> None:
    fabric = ring_fabric()
    with client_on(fabric) as client, pytest.raises(MadError, match="dump tables: not a switch"):
        diags.ibroute(client, PortId(fabric.cas[0].ports[0].lid))
    truth = MockFabric.from_options({"cas": 3})  # what -o builds, deterministically
    truth.sm.refresh()  # its SM fills the LFTs when the first SMP needs them
    sw, far = truth.switch, truth.cas[2].ports[0]
    text = run_cli("ibroute", "--provider", "mock", "-o", "cas=3", "-D", "0,1")
    head = f"Unicast lids [0x0-0x{max(sw.lft):x}] of switch DR path slid 65535; dlid 65535; 0,1"
    assert text.startswith(head) and text.endswith(f"{len(sw.lft)} valid lids dumped \n")
    assert f"0x{far.lid:04x} {sw.lft[far.lid]:03d} : (Channel Adapter portguid " in text
    truth.close()
