"""The administrator's tools against infiniband-diags on the small ibsim + OpenSM fabric.

Each ``ibal`` tool and the C tool of the same name run as node ``Host`` with the
same arguments; the texts must be the same, and each ``--json`` output must
validate against its schema and say what the text says.  Skips naming the
missing Debian packages (fails with ``IBAL_LAB_REQUIRED=1``): the
``ibsim_module_fabric`` fixture.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ibal.testing.helpers import wait_until
from ibal.testing.ibsim import Fabric, fat_tree
from tests.tools.admin_ibsim import NODE, env, ibal, lids, tool, valid


@pytest.mark.timeout(600)
def test_node_lists_match_the_scripts(ibsim_module_fabric: Fabric, tmp_path: Path) -> None:
    fabric = ibsim_module_fabric
    topo = tmp_path / "fabric.topo"
    topo.write_text(tool(fabric, ["ibnetdiscover"]))
    names = ["ibhosts", "ibswitches", "ibrouters", "ibnodes"]
    cases = [[n] for n in names] + [[n, str(topo)] for n in names]
    ours = ibal(fabric, [*cases, *([n, "--json"] for n in names)])
    for args, res in zip(cases, ours, strict=False):
        assert res["stdout"] == tool(fabric, args), args
    hosts = ours[0]["stdout"]
    assert hosts.count("Ca\t: 0x") == 3 and '"Host"' in hosts and ours[2]["stdout"] == ""
    for name, res, text in zip(names, ours[len(cases):], ours[:4], strict=True):
        data = valid(name, res["stdout"])
        assert [int(n["NodeGUID"], 16) for n in data["nodes"]] == [
            int(line.split()[2], 16) for line in text["stdout"].splitlines()]  # fmt: skip
    (switch,) = valid("ibswitches", ours[len(cases) + 1]["stdout"])["nodes"]
    assert (switch["NodeDescription"], switch["NumPorts"], switch["LID"]) == ("Switch1", 8,
                                                                            lids(fabric)["switch"])
    # a file that is not there: a clear error, as the script's cat fails
    bad = ibal(fabric, [["ibhosts", str(tmp_path / "none")]], ok=False)[0]
    assert bad["code"] == 1 and "No such file" in bad["stderr"]


@pytest.mark.timeout(600)
def test_ibaddr_and_smpdump_match(ibsim_module_fabric: Fabric) -> None:
    fabric = ibsim_module_fabric
    sw, sm = (str(v) for v in (lids(fabric)["switch"], lids(fabric)["sm"]))
    addr = [[], [sw], ["-l"], ["-g"], ["-L", sm], ["-g", "-L", sw], ["-D", "0,1"]]
    dumps = [["-D", "0", "0x11"], [sw, "0x15", "1"], ["-D", "0,1", "0x12"], [sm, "0x10"],
             ["-s", sw, "0x10"], [sw, "0x11"]]  # fmt: skip
    cases = [["ibaddr", *a] for a in addr] + [["smpdump", *a] for a in dumps]
    ours = ibal(fabric, cases)
    for args, res in zip(cases, ours, strict=True):
        assert res["stdout"] == tool(fabric, args), args
    assert ours[-6]["stdout"].endswith("SMP status: 0x8000\n")  # DR: the D bit
    # the diagnostics' default is the bare agents; through the MAD service, the same
    svc = ibal(fabric, [["smpdump", "--via", "service", sw, "0x11"],
                        ["smpquery", "--via", "service", "nodeinfo", sw]])  # fmt: skip
    assert svc[0]["stdout"] == ours[-1]["stdout"]
    assert svc[1]["stdout"] == tool(fabric, ["smpquery", "nodeinfo", sw])
    js = ibal(fabric, [["ibaddr", "--json", sw], ["smpdump", "--json", sw, "0x11"]])
    info = valid("ibaddr", js[0]["stdout"])
    lid, end = info["LID"], info["LIDEnd"]
    assert ours[1]["stdout"] == f"GID {info['GID']} LID start 0x{lid:x} end 0x{end:x}\n"
    raw = valid("smpdump", js[1]["stdout"])
    assert (raw["AttributeID"], raw["Status"]) == (0x11, 0)
    assert bytes.fromhex(raw["Data"]).hex() == "".join(ours[-1]["stdout"].split())


_NOT_OURS = re.compile(r"^\s*(CA type|Hardware version|Link layer|link_layer):.*$", re.M)


def _masked(text: str) -> str:
    """What umad2sim's fake sysfs says and the CA's attributes do not: masked
    (docs/tools.md, ibstat: the CA type, hardware version, and a missing link_layer file)."""
    return _NOT_OURS.sub(lambda m: m.group(1), text)


@pytest.mark.timeout(600)
def test_ibstat_and_ibstatus_match(ibsim_module_fabric: Fabric, tmp_path: Path) -> None:
    fabric = ibsim_module_fabric
    cases = [[], ["-l"], ["-s"], ["-p"], ["ibsim0"], ["ibsim0", "1"]]
    ours = ibal(fabric, [["ibstat", *a] for a in cases] + [["ibstatus"], ["ibstatus", "ibsim0:1"],
                                                          ["ibstat", "--json"]])  # fmt: skip
    for args, res in zip(cases, ours, strict=False):
        theirs = tool(fabric, ["ibstat", *args])
        assert _masked(res["stdout"]) == _masked(theirs), args
    # ibstatus is a script over /sys/class/infiniband: run it over the fake sysfs umad2sim
    # gives its clients (what ibstat above read), that of a client that stays running
    (ca,) = valid("ibstat", ours[-1]["stdout"])["cas"]
    server = subprocess.Popen(["ibping", "-S"], env=fabric.env_for(NODE), cwd=fabric.workdir,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        state = fabric.workdir / f"sys-{server.pid}/sys/class/infiniband/ibsim0/ports/1/state"
        wait_until(lambda: state.exists() and state.read_text().strip() != "", "ibping's sysfs")
        sysfs = state.parents[3]
        script = tmp_path / "ibstatus"
        text = Path("/usr/sbin/ibstatus").read_text()
        script.write_text(re.sub(r"^infiniband_base=.*$", f'infiniband_base="{sysfs}"', text,
                                 flags=re.M))  # fmt: skip
        theirs_all = [subprocess.run(["sh", str(script), *a], capture_output=True, text=True,
                                     timeout=30, check=True).stdout
                      for a in ([], ["ibsim0:1"])]  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=30)
        # a killed client keeps its ibsim slot (no goodbye from umad2sim): free it
        for line in fabric.console("Attached").splitlines():
            m = re.match(rf"Client (\d+): pid {server.pid} ", line)
            if m:
                fabric.console(f"X {m.group(1)}")
    assert f"pid {server.pid} " not in fabric.console("Attached")
    for theirs, res in zip(theirs_all, ours[len(cases):], strict=False):
        assert "4: ACTIVE" in theirs and _masked(res["stdout"]) == _masked(theirs)
    (port,) = ca["ports"]
    assert (ca["CAName"], port["PortState"], port["LID"]) == ("ibsim0", "Active",
                                                            lids(fabric)["host"])


_LINK_OPTS = [[], ["-l"], ["-d"], ["-p"], ["--switches-only"], ["--cas-only"], ["-D", "0,1"],
              ["-D", "0"], ["-l", "-p", "--switches-only"]]  # fmt: skip


@pytest.mark.timeout(600)
def test_iblinkinfo_matches(ibsim_module_fabric: Fabric) -> None:
    fabric = ibsim_module_fabric
    ours = ibal(fabric, [["iblinkinfo", *a] for a in _LINK_OPTS] + [["iblinkinfo", "--json"]])
    for args, res in zip(_LINK_OPTS, ours, strict=False):
        assert res["stdout"] == tool(fabric, ["iblinkinfo", *args]), args
    assert ours[2]["stdout"].count("Down/ Polling") == 5  # Switch1's ports 4..8
    data = valid("iblinkinfo", ours[-1]["stdout"])
    links = {(n["NodeDescription"], p["PortNum"], p["remote"]["NodeDescription"])
             for n in data["nodes"] for p in n["ports"] if p["remote"]}  # fmt: skip
    assert ("Host", 1, "Switch1") in links and ("Switch1", 3, "Peer") in links
    assert len(links) == 6  # three links, each seen from both ends


@pytest.mark.timeout(600)
def test_ibqueryerrors_matches_and_clears(ibsim_fabric: Fabric, tmp_path: Path) -> None:
    """Counters set on ibsim's console: the same report, options included; ``-k`` clears
    them (ibqueryerrors then finds nothing); exit status 1 while a port is over."""
    fabric = ibsim_fabric
    clean = ibal(fabric, [["ibqueryerrors"]])[0]
    assert clean["stdout"] == tool(fabric, ["ibqueryerrors"])
    assert "0 ports have errors" in clean["stdout"]
    fabric.console('PerformanceSet "Switch1"[2] PortCounters.SymbolErrorCounter=5')
    fabric.console('PerformanceSet "Host"[1] PortCounters.LinkDownedCounter=3')
    thresholds = tmp_path / "thresholds"
    thresholds.write_text("# a comment\nSymbolErrorCounter=10\nLinkDownedCounter=1\n")
    host_guid = valid("ibaddr", ibal(fabric, [["ibaddr", "--json"]])[0]["stdout"])["PortGUID"]
    cases = [[], ["-r", "-s", "LinkDownedCounter"], ["--switch"], ["--ca"], ["-c"],
             ["-G", host_guid], ["-D", "0,1"], ["--threshold-file", str(thresholds)]]  # fmt: skip
    ours = ibal(fabric, [["ibqueryerrors", *a] for a in cases] + [["ibqueryerrors", "--json"]],
                ok=False)  # fmt: skip
    for args, res in zip(cases, ours, strict=False):
        assert res["code"] == 1, (args, res["stderr"])
        assert res["stdout"] == tool(fabric, ["ibqueryerrors", *args], ok=False), args
    assert "[SymbolErrorCounter == 5]" in ours[0]["stdout"]
    assert "[LinkDownedCounter == 3]" in ours[0]["stdout"]
    assert "Link info:" in ours[1]["stdout"] and "Host" not in ours[2]["stdout"]
    data = valid("ibqueryerrors", ours[-1]["stdout"])
    bad = {(n["NodeDescription"], p["PortNum"]): p["counters"] for n in data["nodes"]
           for p in n["ports"]}  # fmt: skip
    assert bad == {("Switch1", 2): {"SymbolErrorCounter": 5}, ("Host", 1): {"LinkDownedCounter": 3}}
    assert ibal(fabric, [["ibqueryerrors", "-k"]], ok=False)[0]["code"] == 1
    after = tool(fabric, ["ibqueryerrors"])  # exit 0: nothing left over
    assert "0 bad nodes found" in after and "0 ports have errors" in after


@pytest.mark.timeout(600)
def test_ibtracert_matches(ibsim_module_fabric: Fabric) -> None:
    fabric = ibsim_module_fabric
    ls = lids(fabric)
    host, sw, sm = (str(ls[k]) for k in ("host", "switch", "sm"))
    peer = next(str(v) for v in range(1, 6) if str(v) not in (host, sw, sm))
    cases = [[host, peer], [peer, sm], [sw, peer], ["-n", sm, peer], [host, host], [sm, sw],
             [sw, sw]]  # fmt: skip
    ours = ibal(fabric, [["ibtracert", *a] for a in cases] + [["ibtracert", "--json", host, peer]])
    for args, res in zip(cases, ours, strict=False):
        assert res["stdout"] == tool(fabric, ["ibtracert", *args]), args
    hops = valid("ibtracert", ours[-1]["stdout"])["hops"]
    assert [h["NodeType"] for h in hops] == ["CA", "Switch", "CA"]
    assert [h["OutPort"] for h in hops] == [None, 1, 3]  # Host's port 1, Switch1's port 3
    bad = ibal(fabric, [["ibtracert", host, "60"]], ok=False)[0]  # no such LID
    assert bad["code"] == 1 and "failed to find route" in bad["stderr"]


def _field(text: str, name: str) -> str:
    m = re.search(rf"^{name}:\.+(.*)$", text, re.M)
    assert m, text
    return m.group(1)


@pytest.mark.timeout(600)
def test_ibportstate_matches_and_changes_the_fabric(ibsim_fabric: Fabric) -> None:
    """Queries as ibportstate prints them (a switch port with its peer, a CA by LID and by
    DR path); a reset of an unlinked switch port by each tool, the same text; then
    disable, enable, speed and width on Switch1's port to Peer, each seen by smpquery,
    iblinkinfo and ibportstate."""
    fabric = ibsim_fabric
    host = str(lids(fabric)["host"])
    queries = [[host, "1"], ["-D", "0", "1"], ["-D", "0,1", "2"], ["-D", "0,1", "1"]]
    ours = ibal(fabric, [["ibportstate", *a] for a in queries])
    for args, res in zip(queries, ours, strict=True):
        assert res["stdout"] == tool(fabric, ["ibportstate", *args]), args
    assert "Peer PortInfo:" in ours[2]["stdout"]
    # each tool resets a port of its own (the first set changes what the second reads)
    reset = ibal(fabric, [["ibportstate", "-D", "0,1", "4", "reset"]])[0]["stdout"]
    theirs = tool(fabric, ["ibportstate", "-D", "0,1", "5", "reset"])
    assert reset == theirs.replace(" port 5\n", " port 4\n")
    after = reset.split("After PortInfo set:", 1)[1]
    assert _field(after, "Lid") == "4660" and _field(after, "PhysLinkState") == "Polling"
    # port 3 of Switch1 leads to Peer
    ibal(fabric, [["ibportstate", "-D", "0,1", "3", "disable"]])
    pi = tool(fabric, ["smpquery", "-D", "portinfo", "0,1", "3"])
    assert _field(pi, "PhysLinkState") == "Disabled"
    links = tool(fabric, ["iblinkinfo", "--switches-only"])
    assert '3[  ] ==( 4X           2.5 Gbps Active/Disabled)==>      "Port not available"' in links
    ibal(fabric, [["ibportstate", "-D", "0,1", "3", "enable"]])
    assert _field(tool(fabric, ["smpquery", "-D", "portinfo", "0,1", "3"]),
                  "PhysLinkState") == "Polling"  # fmt: skip
    got = ibal(fabric, [["ibportstate", "-D", "0,1", "3", "speed", "1", "width", "1"],
                        ["ibportstate", "--json", "-D", "0,1", "3", "width", "1"],
                        ["ibportstate", "-D", "0,1", "3"]], ok=False)  # fmt: skip
    assert [r["code"] for r in got] == [0, 0, 1]
    theirs = tool(fabric, ["ibportstate", "-D", "0,1", "3"], ok=False)  # the peer: unreachable
    # ibportstate prints its error on stdout, ibal on stderr
    assert theirs.endswith("ibportstate: iberror: failed: smp query nodeinfo failed\n")
    assert got[2]["stdout"] == theirs.rsplit("ibportstate: iberror", 1)[0]
    assert "nodeinfo failed" in got[2]["stderr"]
    assert _field(theirs, "LinkWidthEnabled") == "1X"
    assert _field(theirs, "LinkSpeedEnabled") == "2.5 Gbps"
    data = valid("ibportstate", got[1]["stdout"])
    assert (data["PortInfo"]["LinkWidthEnabled"], data["PortInfo"]["PhysLinkState"]) == (1, 2)
    bad = ibal(fabric, [["ibportstate", "-D", "0,1", "3", "speed", "16"],
                        ["ibportstate", "-D", "0,1", "3", "bogus"]], ok=False)  # fmt: skip
    assert [b["code"] for b in bad] == [1, 1]
    assert "invalid speed value 16" in bad[0]["stderr"] and "invalid operation" in bad[1]["stderr"]


@pytest.mark.timeout(600)
def test_dump_fts_matches(ibsim_module_fabric: Fabric) -> None:
    fabric = ibsim_module_fabric
    sw, host = str(lids(fabric)["switch"]), str(lids(fabric)["host"])
    cases = [["dump_fts"], ["dump_fts", "-M"], ["dump_fts", "-a"], ["dump_fts", "-n", sw, host],
             ["dump_lfts"], ["dump_lfts", "-n"], ["dump_mfts"]]  # fmt: skip
    ours = ibal(fabric, [*cases, ["dump_fts", "--json"], ["dump_mfts", "--json"]])
    for args, res in zip(cases, ours, strict=False):
        assert res["stdout"] == tool(fabric, args), args
    assert "4 valid lids dumped" in ours[0]["stdout"]
    assert ours[4]["stdout"].endswith("replaced by dump_fts\n\n\n")
    (table,) = valid("dump_fts", ours[-2]["stdout"])["switches"]
    assert {r["LID"]: r["Port"] for r in table["Table"]}[int(host)] == 2  # Host: Switch1 port 2
    assert valid("dump_mfts", ours[-1]["stdout"])["switches"][0]["Multicast"] is True


def _sorted_blocks(text: str, head: str) -> list[str]:
    """A multi-switch dump's per-switch blocks, sorted (the sweep's order is the answers')."""
    return sorted(head + b for b in text.split(head) if b)


@pytest.mark.timeout(900)
def test_tools_match_on_a_fat_tree(ibsim_factory: Any, tmp_path: Path) -> None:
    """Six switches, twelve hosts: dump_lfts, iblinkinfo (``-n``: partial scans, from here
    and from a host on another leaf), ibhosts/ibswitches, ibqueryerrors and ibtracert
    between hosts on different leaves (three switch hops), against the C tools.  Lines
    whose order depends on when answers arrived are compared sorted."""
    tree = fat_tree(tmp_path / "fat.net", spines=2, leaves=4, hosts_per_leaf=3)
    fabric = ibsim_factory(tree.path)
    node = tree.hosts[0]
    far = tree.hosts[-1]
    addr = tool(fabric, ["ibaddr", "-L"], far)
    far_lid = addr.split()[2]
    me = tool(fabric, ["ibaddr", "-L"], node).split()[2]
    cases = [["dump_lfts"], ["iblinkinfo"], ["ibhosts"], ["ibswitches"], ["ibqueryerrors"],
             ["ibtracert", me, far_lid], ["ibtracert", far_lid, me], ["iblinkinfo", "-l"],
             ["iblinkinfo", "-n", "2"], ["iblinkinfo", "-D", "0,1,4,2,1", "-a", "-n", "2"]]
    ours = ibal(fabric, cases, node)
    for args, res in zip(cases, ours, strict=True):
        theirs = tool(fabric, args, node)
        if args[0] == "dump_lfts":
            head = "Unicast lids"
            assert _sorted_blocks(res["stdout"], head) == _sorted_blocks(theirs, head)
        elif args == ["iblinkinfo"]:
            assert sorted(res["stdout"].splitlines()) == sorted(theirs.splitlines())
        elif args[0] in ("ibtracert", "ibqueryerrors") or "-n" in args:  # -n: in scan order
            assert res["stdout"] == theirs, args
        else:
            assert sorted(res["stdout"].splitlines()) == sorted(theirs.splitlines()), args
    assert ours[5]["stdout"].count(" -> switch port ") == 3  # leaf, spine, leaf
    assert ours[0]["stdout"].count("Unicast lids") == 6
    # two hops from a host: its leaf, the leaf's hosts and spines, and one path further
    assert ours[8]["stdout"].count("Switch: ") == 4 and ours[8]["stdout"].count("CA: ") == 3


@pytest.mark.timeout(600)
def test_json_of_the_older_diagnostics_validates_and_says_what_the_text_says(
    ibsim_module_fabric: Fabric,
) -> None:
    """smpquery, perfquery, sminfo, ibroute and discover with --json (and discover
    --format json/dot) against their schemas and against what the C tools print."""
    from ibal.mad.discover import parse_ibnetdiscover

    fabric = ibsim_module_fabric
    ls = lids(fabric)
    sw, host, sm = str(ls["switch"]), str(ls["host"]), str(ls["sm"])
    cmds = [["smpquery", "--json", "nodeinfo", sw], ["smpquery", "--json", "portinfo", host, "1"],
            ["smpquery", "--json", "switchinfo", sw], ["smpquery", "--json", "nodedesc", sm],
            ["smpquery", "--json", "pkeys", sw], ["smpquery", "--json", "guids", "-D", "0"],
            ["perfquery", "--json", sw, "2"], ["perfquery", "--json", "-x", host, "1"],
            ["sminfo", "--json"], ["ibroute", "--json", sw], ["discover", "--json"],
            ["discover", "--format", "json"], ["discover", "--format", "dot"]]  # fmt: skip
    ours = ibal(fabric, cmds)
    data = [valid(c[0], r["stdout"]) for c, r in zip(cmds, ours, strict=True) if "dot" not in c]
    ni, pi, si, nd, pk, gi, pc, px, smi, route, topo, topo2 = data
    text = tool(fabric, ["smpquery", "nodeinfo", sw])
    assert ni["fields"]["NodeGUID"] == _field(text, "Guid") and ni["fields"]["NumPorts"] == 8
    assert pi["fields"]["LID"] == int(host) and pi["fields"]["MasterSMLID"] == int(sm)
    assert si["fields"]["LinearFDBTop"] == int(_field(tool(fabric, ["smpquery", "switchinfo",
                                                                    sw]), "LinearFdbTop"))
    assert nd["fields"]["NodeString"] == "SmHca" and pk["fields"]["P_Keys"][0] == 0xFFFF
    assert gi["fields"]["GUIDs"][0] == valid("ibaddr", ibal(fabric, [["ibaddr", "--json"]])[0][
        "stdout"])["PortGUID"]  # fmt: skip
    assert (pc["Attribute"], px["Attribute"]) == ("PortCounters", "PortCountersExtended")
    assert pc["fields"]["SymbolErrorCounter"] == int(_field(tool(fabric, ["perfquery", sw, "2"]),
                                                            "SymbolErrorCounter"))
    assert smi["SMStateName"] == "MASTER" and smi["LID"] == int(sm)
    lft = tool(fabric, ["ibroute", sw])
    assert {r["LID"]: r["Port"] for r in route["Table"]} == {
        int(ln[:6], 16): int(ln[7:10]) for ln in lft.splitlines() if ln.startswith("0x")}
    want = parse_ibnetdiscover(tool(fabric, ["ibnetdiscover"]))
    assert topo == topo2
    assert {int(n["NodeGUID"], 16) for n in topo["nodes"]} == set(want["nodes"])
    links = {frozenset(((int(x["from"]["NodeGUID"], 16), x["from"]["PortNum"]),
                        (int(x["to"]["NodeGUID"], 16), x["to"]["PortNum"])))
             for x in topo["links"]}  # fmt: skip
    assert links == want["links"]
    dot = ours[-1]["stdout"]
    assert dot.startswith("graph fabric {\n") and dot.endswith("}\n")
    assert dot.count(" -- ") == len(want["links"]) and dot.count("shape=box") == 1
    assert dot.count("shape=ellipse") == 3 and 'label="4x SDR"' in dot


@pytest.mark.timeout(600)
def test_saquery_json_validates_and_holds_the_records_saquery_prints(
    ibsim_module_fabric: Fabric,
) -> None:
    fabric = ibsim_module_fabric
    ls = lids(fabric)
    host, sm = str(ls["host"]), str(ls["sm"])
    cases = [["PIR", host], ["-p", "--src-to-dst", f"{host}:{sm}"], ["CPI"], ["NR", sm]]
    ours = ibal(fabric, [["saquery", "--json", *a] for a in cases])
    data = [valid("saquery", r["stdout"]) for r in ours]
    (pir,) = data[0]["queries"][0]["records"]
    text = tool(fabric, ["saquery", "PIR", host])
    assert pir["EndportLID"] == int(host) and pir["CapabilityMask"] == int(
        re.search(r"CapMask:\.+(0x[0-9a-f]+)", text).group(1), 16)  # type: ignore[union-attr]
    (path,) = data[1]["queries"][-1]["records"]
    assert (path["SLID"], path["DLID"]) == (int(host), int(sm))
    assert data[2]["queries"][0]["Attribute"] == "ClassPortInfo"
    (node,) = data[3]["queries"][0]["records"]
    assert node["LID"] == int(sm) and node["NodeType"] == 1


_RTT = re.compile(r"time [\d.]+ ms|= [\d.]+/[\d.]+/[\d.]+ ms")


@pytest.mark.timeout(600)
def test_ibping_and_ibsysstat_clients_and_servers(ibsim_fabric: Fabric) -> None:
    """An ibal ping server on Peer (holding ibsim's SM flag, without which ibsim hands a
    QP1 request to nobody: even two C ibpings lose every packet there) answers the C
    ibping and ibal's; both clients print the same lines, times aside."""
    fabric = ibsim_fabric
    peer = next(str(v) for v in range(1, 6)
                if v not in lids(fabric).values())  # fmt: skip
    probe = Path(__file__).with_name("ping_server_probe.py")
    server = subprocess.Popen([sys.executable, str(probe), "peer.example"], env=env(fabric, "Peer"),
                              cwd=fabric.workdir, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert server.stdout is not None and server.stdout.readline() == "ready\n"
        theirs = tool(fabric, ["ibping", "-c", "2", peer])
        ours = ibal(fabric, [["ibping", "-c", "2", peer], ["ibping", "--json", "-f", "-c", "3",
                                                            peer]])  # fmt: skip
        ops = [[], ["host"], ["cpu"]]
        sys_ours = ibal(fabric, [["ibsysstat", peer, *o] for o in ops] + [
            ["ibsysstat", "--json", peer, "cpu"]])  # fmt: skip
        sys_theirs = [tool(fabric, ["ibsysstat", peer, *o]) for o in ops]
        out, err = server.communicate("", timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, err[-3000:]
    assert out.strip().endswith("answered 7 7")  # pings 2 + 2 + 3; sysstats 3 + 1 + 3
    assert theirs.count("Pong from peer.example (Lid ") == 2
    # times masked: the C tool's clock mixes units (docs/tools.md), ibal's is the real one
    assert _RTT.sub("T", ours[0]["stdout"]) == _RTT.sub("T", theirs)
    assert "2 packets transmitted, 2 received, 0% packet loss" in theirs
    data = valid("ibping", ours[1]["stdout"])
    assert (data["Host"], data["Transmitted"], data["Received"]) == ("peer.example", 3, 3)
    # ibsysstat against the same server: the C client and ibal's print the same
    for o, mine, theirs_text in zip(ops, sys_ours, sys_theirs, strict=False):
        assert mine["stdout"] == theirs_text, o
    assert sys_theirs[0] == "sysstat ping succeeded\n"
    assert sys_theirs[2].startswith("cpu 0: model ") and " MHZ " in sys_theirs[2]
    assert valid("ibsysstat", sys_ours[-1]["stdout"])["Answer"] == sys_theirs[2][:-1]


_DATE = re.compile(r"^# Topology file: generated on .*$", re.M)


def _cache_content(path: Path) -> tuple[Any, ...]:
    """A cache file's content, order aside (the C writer lists ports by hash bucket)."""
    from ibal.tools.cache import load

    c = load(path)
    nodes = {n.guid: (n.node_type, n.num_ports, n.info, n.desc, n.switch_info, n.sma_lid,
                      n.sma_lmc, n.enhanced_port0, sorted((p.guid, p.num) for p in n.ports))
             for n in c.nodes}  # fmt: skip
    ports = {(p.node.guid, p.num): (p.guid, p.base_lid, p.lmc, p.info, p.ext_num,
                                    (p.remote.guid, p.remote.num) if p.remote else None)
             for n in c.nodes for p in n.ports}  # fmt: skip
    return c.from_guid, c.max_hops, nodes, ports


@pytest.mark.timeout(600)
def test_discover_cache_written_read_back_and_edited(ibsim_module_fabric: Fabric,
                                                     tmp_path: Path) -> None:  # fmt: skip
    """``discover --cache`` writes a file ibnetdiscover loads as the live fabric (and the
    same content as ibnetdiscover's own cache); ``--load-cache`` prints what ibnetdiscover
    prints of a cache; ``ibcacheedit``'s edits read back alike by ibnetdiscover."""
    fabric = ibsim_module_fabric
    ours, theirs = tmp_path / "ours.cache", tmp_path / "theirs.cache"
    res = ibal(fabric, [["discover", "--cache", str(ours)]])[0]
    live = tool(fabric, ["ibnetdiscover", "--cache", str(theirs)])
    assert _DATE.sub("", res["stdout"]) == _DATE.sub("", live)
    assert _cache_content(ours) == _cache_content(theirs)
    assert _DATE.sub("", tool(fabric, ["ibnetdiscover", "--load-cache", str(ours)])) == _DATE.sub(
        "", live)  # fmt: skip
    for args in ([], ["-p"], ["-l"], ["-S"]):
        mine = ibal(fabric, [["discover", "--load-cache", str(theirs), *args]])[0]["stdout"]
        assert _DATE.sub("", mine) == _DATE.sub(
            "", tool(fabric, ["ibnetdiscover", "--load-cache", str(theirs), *args])), args
    for args in ([], ["-l"], ["--switches-only", "-p"]):  # iblinkinfo reads caches too
        mine = ibal(fabric, [["iblinkinfo", "--load-cache", str(ours), *args]])[0]["stdout"]
        assert mine == tool(fabric, ["iblinkinfo", "--load-cache", str(ours), *args]), args
    edits = [["--switchguid", "0x200000:0x300000"], ["--caguid", "0x100004:0x100444"],
             ["--sysimgguid", "0x100000:0x1000aa"],
             ["--portguid", "0x100002:0x100003:0x100333"]]  # fmt: skip
    for i, e in enumerate(edits):
        mine, c = tmp_path / f"mine{i}.cache", tmp_path / f"c{i}.cache"
        ibal(fabric, [["ibcacheedit", *e, str(theirs), str(mine)]])
        tool(fabric, ["ibcacheedit", *e, str(theirs), str(c)])
        assert _cache_content(mine) == _cache_content(c), e
        text = tool(fabric, ["ibnetdiscover", "--load-cache", str(mine)])
        assert e[1].split(":")[-1][2:] in text, e
    bad = ibal(fabric, [["ibcacheedit", "--caguid", "0x1:0x2", str(theirs), str(tmp_path / "x")],
                        ["discover", "--load-cache", str(tmp_path / "none")]], ok=False)
    assert [b["code"] for b in bad] == [1, 1]
    assert "caguid = 1 not found" in bad[0]["stderr"] and not (tmp_path / "x").exists()
    (tmp_path / "junk").write_bytes(b"\0" * 40)
    junk = ibal(fabric, [["discover", "--load-cache", str(tmp_path / "junk")]], ok=False)[0]
    assert junk["code"] == 1 and "invalid fabric cache file" in junk["stderr"]
