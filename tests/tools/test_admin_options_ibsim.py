"""The C tools' further options (issue 24's rest) against infiniband-diags on ibsim + OpenSM.

``--node-name-map`` on every tool that prints node names, ``ibtracert -f``,
``ibqueryerrors --data``/``--counters``/``--details``, ``iblinkinfo
--filterdownports`` and ``--diff``: each ibal command and the C tool with the
same arguments print the same text.  Skips naming the missing Debian packages
(fails with ``IBAL_LAB_REQUIRED=1``): the ibsim fixtures.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ibal.testing.ibsim import Fabric
from ibal.tools import nodemap
from ibal.tools.errors import human
from tests.tools.admin_ibsim import ibal, lids, tool, valid


def _guids(fabric: Fabric) -> dict[str, int]:
    """Node GUIDs by NodeDescription, from ``discover --json``."""
    topo = valid("discover", ibal(fabric, [["discover", "--json"]])[0]["stdout"])
    return {n["NodeDescription"]: int(n["NodeGUID"], 16) for n in topo["nodes"]}


@pytest.mark.timeout(600)
def test_node_name_map_names_nodes_as_the_c_tools_do(ibsim_module_fabric: Fabric,
                                                     tmp_path: Path) -> None:  # fmt: skip
    fabric = ibsim_module_fabric
    g = _guids(fabric)
    ls = lids(fabric)
    host, sw, sm = (str(ls[k]) for k in ("host", "switch", "sm"))
    peer = next(str(v) for v in range(1, 6) if str(v) not in (host, sw, sm))
    names = tmp_path / "names"
    # the forms the C parser takes: quoted, unquoted, a comment after, a repeated GUID
    names.write_text(f"# the fabric's names\n\n0x{g['Switch1']:016x} \"leaf-1\"\n"
                     f"  {g['Host']:#x}\tcompute-0 # the host\n"
                     f"0x{g['Host']:x} \"not this one\"\n{g['Peer']} \"peer node\"\n")  # fmt: skip
    nm = ["--node-name-map", str(names)]
    cases = [["iblinkinfo", *nm], ["iblinkinfo", "-l", *nm], ["ibtracert", *nm, host, peer],
             ["ibnetdiscover", *nm], ["ibnetdiscover", "-p", *nm], ["ibnetdiscover", "-l", *nm],
             ["dump_fts", *nm], ["ibroute", *nm, sw], ["smpquery", *nm, "nodedesc", sw],
             ["smpquery", *nm, "nodedesc", host], ["smpquery", *nm, "nodedesc", sm]]
    ours = ibal(fabric, [["discover", *c[1:]] if c[0] == "ibnetdiscover" else c for c in cases])
    date = "# Topology file: generated on "
    for args, res in zip(cases, ours, strict=True):
        mine, theirs = res["stdout"], tool(fabric, args)
        if args[0] == "ibnetdiscover":
            mine, theirs = ([ln for ln in t.splitlines() if not ln.startswith(date)]
                            for t in (mine, theirs))  # fmt: skip
        assert mine == theirs, args
    links, trace = ours[0]["stdout"], ours[2]["stdout"]
    # an unquoted name runs to the '#': its space before it is part of it, as in C
    assert '"leaf-1"' in links and "CA: compute-0 :" in links and "Switch1" not in links
    assert '"compute-0 "' in trace and '"peer node"' in trace and "not this one" not in trace
    assert ours[8]["stdout"].endswith("Node Description:..........................leaf-1\n")
    assert ours[10]["stdout"].endswith("....SmHca\n")  # not in the map: its own description
    # a line that is no GUID: both warn, neither uses the map
    bad = tmp_path / "bad"
    bad.write_text(f"0x{g['Switch1']:x} leaf\nswitch-2 \"x\"\n")
    mine = ibal(fabric, [["iblinkinfo", "--node-name-map", str(bad)]])[0]
    theirs = fabric.run(["iblinkinfo", "--node-name-map", str(bad)], "Host")
    assert mine["stdout"] == theirs.stdout and "Switch1" in mine["stdout"]
    assert 'WARNING failed line: "switch-2 "x""' in mine["stderr"]
    assert 'WARNING failed line: "switch-2 "x""' in theirs.stderr


def test_node_name_map_parser_reads_what_the_c_parser_reads() -> None:
    m = nodemap.parse('# c\n0x10 "a b"\n  020 c#d\n16 "dup"\n0x11\n0x12 ""\n0x13 e#f\n')
    # octal 020 and decimal 16 are 0x10, already named "a b"; 0x11 and 0x12 name nothing
    assert m == {0x10: "a b", 0x13: "e"}
    with pytest.raises(ValueError, match=r"^0x1x name$"):
        nodemap.parse("0x1x name\n")
    # fgets reads 255 characters a time: the rest of a longer line is a line of its own
    with pytest.raises(ValueError, match=r"^n+$"):
        nodemap.parse(f"0x13 {'n' * 300}\n")
    assert nodemap.remap(m, 0x10, "ignored") == "a b"
    assert nodemap.remap(m, 0x99, "tab\there\x7f") == "tab here "
    assert nodemap.remap(None, 0x10, "own") == "own"


@pytest.mark.timeout(600)
def test_ibtracert_force_matches(ibsim_module_fabric: Fabric) -> None:
    fabric = ibsim_module_fabric
    ls = lids(fabric)
    host, sw = str(ls["host"]), str(ls["switch"])
    cases = [["-f", host, sw], ["-f", "-n", sw, host]]
    ours = ibal(fabric, [["ibtracert", *a] for a in cases])
    for args, res in zip(cases, ours, strict=True):
        assert res["stdout"] == tool(fabric, ["ibtracert", *args]), args
    # a LID nobody has: -f goes on past the missing node, and both find no route
    bad = ibal(fabric, [["ibtracert", "-f", host, "60"]], ok=False)[0]
    theirs = fabric.run(["ibtracert", "-f", host, "60"], "Host")
    assert bad["code"] == 1 and theirs.returncode != 0
    # the C tool prints the route's start as it goes, then its error on stdout
    start, err = theirs.stdout.rsplit("ibtracert: iberror: ", 1)
    assert bad["stdout"] == start and start.startswith("From ca {0x")
    assert "failed to find route" in bad["stderr"] and "route information" in err
    assert "force: look for lid 60" in bad["stderr"] and "Force: look for lid 60" in theirs.stderr


_COUNT = re.compile(r"\[(\w+) == (\d+) \(([\d.]+[A-Z]*)\)\]")


def _masked(text: str) -> str:
    """Data counters masked: the fabric's own MADs move them between two runs."""
    return _COUNT.sub(lambda m: f"[{m.group(1)} == N]", text)


def _values(text: str) -> dict[tuple[str, str, str], int]:
    """(node line, port line's GUID and port, counter): value, from ibqueryerrors' text."""
    out, head = {}, ""
    for line in text.splitlines():
        if not line.startswith("   "):
            head = line
            continue
        where = line.split(":", 1)[0].strip()
        for m in _COUNT.finditer(line):
            out[(head, where, m.group(1))] = int(m.group(2))
    return out


@pytest.mark.timeout(600)
def test_ibqueryerrors_data_counters_and_details_match(ibsim_fabric: Fabric) -> None:
    """--data, --counters and --details against the C tool: the same lines, counters
    and units; the data counters' values only grow from the C run to ibal's (nothing
    clears them), and each value's human-readable form is the C tool's digits."""
    fabric = ibsim_fabric
    fabric.console('PerformanceSet "Switch1"[2] PortCounters.SymbolErrorCounter=5')
    fabric.console('PerformanceSet "Host"[1] PortCounters.PortRcvErrors=3')
    fabric.console('PerformanceSet "Host"[1] PortCounters.PortXmitDiscards=2')
    cases = [["--data"], ["--counters"], ["--details"], ["--data", "--details", "-r"],
             ["--counters", "--switch"], ["--counters", "-r", "--ca"]]
    theirs = [fabric.run(["ibqueryerrors", *a], "Host") for a in cases]
    ours = ibal(fabric, [["ibqueryerrors", *a] for a in cases] + [
        ["ibqueryerrors", "--json", "--data"], ["ibqueryerrors", "--json", "--counters"]],
        ok=False)  # fmt: skip
    for args, mine, c in zip(cases, ours, theirs, strict=False):
        assert mine["code"] == c.returncode == (0 if "--counters" in args else 1), args
        assert _masked(mine["stdout"]) == _masked(c.stdout), args
        before, after = _values(c.stdout), _values(mine["stdout"])
        assert before.keys() == after.keys(), args
        assert bool(before) == (args != ["--details"]), args
        assert all(after[k] >= before[k] for k in before), args
        for m in _COUNT.finditer(c.stdout):
            name, value, shown = m.group(1), int(m.group(2)), m.group(3)
            assert human(value, name in ("PortXmitData", "PortRcvData")) == shown, m.group(0)
    data = ours[0]["stdout"]
    assert "port ALL: [SymbolErrorCounter == 5] [PortXmitData == " in data
    assert "port 1: [PortRcvErrors == 3] [PortXmitDiscards == 2] [PortXmitData == " in data
    # ibsim's PMA has the full PortCountersExtended: eight counters a port, zeros too
    counters = ours[1]["stdout"]
    assert counters.count("[PortMulticastRcvPkts == 0 (0.000)]") == 11
    assert 'Data Counters for 0x200000 "Switch1"' in counters and "Errors for" not in counters
    js = valid("ibqueryerrors", ours[-2]["stdout"])
    host = next(n for n in js["nodes"] if n["NodeDescription"] == "Host")
    (port,) = host["ports"]
    assert port["counters"] == {"PortRcvErrors": 3, "PortXmitDiscards": 2}
    assert port["data"]["PortXmitPkts"] > 0 and "PortUnicastXmitPkts" not in port["data"]
    jc = valid("ibqueryerrors", ours[-1]["stdout"])
    assert jc["BadPorts"] == 0 and sum(len(n["ports"]) for n in jc["nodes"]) == 11
    # -k with --details clears the detail counters too: the PMA takes the Sets
    cleared = ibal(fabric, [["ibqueryerrors", "-k", "--details"]], ok=False)[0]
    assert cleared["code"] == 1 and "PMA query failures" not in cleared["stdout"]
    assert "0 ports have errors" in tool(fabric, ["ibqueryerrors"])


@pytest.mark.timeout(600)
def test_iblinkinfo_diff_and_filterdownports_match(ibsim_fabric: Fabric,
                                                   tmp_path: Path) -> None:  # fmt: skip
    """Caches written by each tool while Switch1's ports 4-8 are down; then the link to
    Peer is disabled: ``--diff`` shows that port in the cache and now, ``--filterdownports``
    leaves out ports 4-8 (down then and now) but not port 3, for both tools and either
    cache."""
    fabric = ibsim_fabric
    ours, theirs = tmp_path / "ours.cache", tmp_path / "theirs.cache"
    ibal(fabric, [["discover", "--cache", str(ours)]])
    tool(fabric, ["ibnetdiscover", "--cache", str(theirs)])
    ibal(fabric, [["ibportstate", "-D", "0,1", "3", "disable"]])
    cases = []
    for c in (ours, theirs):
        cases += [["--diff", str(c)], ["--diff", str(c), "-l"],
                  ["--diff", str(c), "--diffcheck", "port"],
                  ["--diff", str(c), "--diffcheck", "state,lid,nodedesc"],
                  ["--diff", str(c), "--switches-only", "-p"],
                  ["--diff", str(c), "--cas-only"],
                  ["--filterdownports", str(c)], ["--filterdownports", str(c), "-l", "-d"],
                  ["--filterdownports", str(c), "--diff", str(c)]]
    mine = ibal(fabric, [["iblinkinfo", *a] for a in cases])
    for args, res in zip(cases, mine, strict=True):
        assert res["stdout"] == tool(fabric, ["iblinkinfo", *args]), args
    diff = mine[0]["stdout"]
    # Peer is gone (its whole node from the cache), Switch1's port 3 lost its far end
    assert diff.startswith("< CA: Peer:\n<       0x")
    assert "Switch: 0x0000000000200000 Switch1:\n<            2    3[  ] " in diff
    assert diff.endswith('Active/Disabled)==>      "Port not available"\n')
    # ibsim leaves the disabled port's PortState Active: the state check alone sees
    # only the node that went
    assert "Switch1:" not in mine[3]["stdout"] and "< CA: Peer:" in mine[3]["stdout"]
    filtered = mine[6]["stdout"]
    assert "Active/Disabled" in filtered and "Down/ Polling" not in filtered
    assert "Down/ Polling" in tool(fabric, ["iblinkinfo"])
    bad = ibal(fabric, [["iblinkinfo", "--diffcheck", "ports", "--diff", str(ours)],
                        ["iblinkinfo", "--diff", str(tmp_path / "none")]], ok=False)
    assert [b["code"] for b in bad] == [1, 1]
    assert "invalid diff check key: ports" in bad[0]["stderr"]
    assert "loading cached fabric for diff failed" in bad[1]["stderr"]


def _field(text: str, name: str) -> str:
    m = re.search(rf"^{name}:\.+(.*)$", text, re.M)
    assert m, text
    return m.group(1)


@pytest.mark.timeout(600)
def test_ibportstate_espeed_fdr10_and_mkey_match(ibsim_fabric: Fabric) -> None:
    """espeed and fdr10 on two unlinked ports of Switch1, one each (a set changes what the
    next reads): the same text; the extended speed set on a linked port seen by
    smpquery; the M_Key ops
    on Host's port (ibsim keeps no M_Key, so each tool sees the same port), ``-K``, and
    the C tool's refusals in its words."""
    fabric = ibsim_fabric
    pairs = [(["-D", "0,1", "4", "espeed", "1"], ["-D", "0,1", "5", "espeed", "1"]),
             (["-D", "0,1", "6", "fdr10", "1"], ["-D", "0,1", "7", "fdr10", "1"])]
    for mine_args, their_args in pairs:
        mine = ibal(fabric, [["ibportstate", *mine_args]])[0]["stdout"]
        theirs = tool(fabric, ["ibportstate", *their_args])
        assert mine == theirs.replace(f" port {their_args[2]}\n", f" port {mine_args[2]}\n")
    # on the linked port to Peer, ibsim takes the extended speed: smpquery sees it
    assert _field(tool(fabric, ["smpquery", "-D", "portinfo", "0,1", "3"]),
                  "LinkSpeedExtEnabled") == "0"  # fmt: skip
    ibal(fabric, [["ibportstate", "-D", "0,1", "3", "espeed", "1"]])
    espeed = tool(fabric, ["smpquery", "-D", "portinfo", "0,1", "3"])
    assert _field(espeed, "LinkSpeedExtEnabled") == "14.0625 Gbps"
    fdr = ibal(fabric, [["ibportstate", "-D", "0,1", "6", "fdr10", "1"]])[0]["stdout"]
    after = fdr.split("After MLNXExtendedPortInfo set:\n", 1)[1]
    assert _field(after, "StateChangeEnable") == "0x01" and _field(after, "LinkSpeedEnabled") \
        == "0x01"  # fmt: skip
    cases = [["-D", "0", "1", "mkey", "0x1234", "mkeylease", "7", "mkeyprot", "1"],
             ["-K", "-D", "0", "1"], ["-K", "-D", "0,1", "0"], ["-D", "0,1", "0", "mkey", "9"]]
    ours = ibal(fabric, [["ibportstate", *a] for a in cases])
    for args, res in zip(cases, ours, strict=True):
        assert res["stdout"] == tool(fabric, ["ibportstate", *args]), args
    assert _field(ours[1]["stdout"], "Mkey") == "0x0000000000000000"
    assert _field(ours[0]["stdout"], "Mkey") == "<not displayed>"
    js = valid("ibportstate", ibal(fabric, [["ibportstate", "--json", "-D", "0", "1", "mkey",
                                             "0x1234"]])[0]["stdout"])  # fmt: skip
    assert js["Set"] == {"mkey": "0x0000000000001234"}
    refused = [["-D", "0,1", "3", "mkey", "5"], ["-D", "0,1", "4", "espeed", "32"],
               ["-D", "0,1", "4", "fdr10", "2"], ["-D", "0", "1", "mkeylease", "65536"],
               ["-D", "0", "1", "mkeyprot", "4"]]
    bad = ibal(fabric, [["ibportstate", *a] for a in refused], ok=False)
    for args, res in zip(refused, bad, strict=True):
        theirs = tool(fabric, ["ibportstate", *args], ok=False)
        assert res["code"] == 1 and res["stdout"] == "", args
        # ibportstate prints its error on stdout, ibal on stderr
        assert theirs.startswith("ibportstate: iberror: failed: "), args
        assert theirs.split("failed: ", 1)[1].strip() in res["stderr"], args


_LOADED = ("import sys; from ibal.cli import main\n"
           "try: main(sys.argv[1:])\n"
           "except SystemExit as e: assert not e.code, e.code\n"
           "print(sorted(m for m in sys.modules\n"
           "             if m in ('ibal.al', 'ibal.tools.leanport', 'click')))\n")


@pytest.mark.timeout(600)
def test_a_diagnostic_on_the_lean_path_loads_no_access_layer(ibsim_module_fabric: Fabric) -> None:
    """With the defaults, ``smpquery`` and ``discover`` go straight to libibumad: the same
    text as the C tools, and ``ibal.al`` never imported; ``--provider rdma_core`` (or
    ``--via service``) takes the AL, with the same answer."""
    import subprocess
    import sys

    from tests.tools.admin_ibsim import env

    fabric = ibsim_module_fabric
    sw = str(lids(fabric)["switch"])
    e = env(fabric)
    e.pop("IBAL_PROVIDERS", None)

    def run(*args: str) -> tuple[str, str]:
        r = subprocess.run([sys.executable, "-c", _LOADED, *args], env=e, cwd=fabric.workdir,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        out, loaded = r.stdout.rsplit("[", 1)
        return out, "[" + loaded.strip()

    text, loaded = run("smpquery", "nodeinfo", sw)
    assert text == tool(fabric, ["smpquery", "nodeinfo", sw])
    assert loaded == "['click', 'ibal.tools.leanport']"
    al_text, al_loaded = run("smpquery", "--provider", "rdma_core", "nodeinfo", sw)
    assert al_text == text and "ibal.al" in al_loaded and "leanport" not in al_loaded
    topo, loaded = run("discover")
    theirs = tool(fabric, ["ibnetdiscover"])
    date = re.compile(r"^# Topology file: generated on .*$", re.M)
    assert date.sub("", topo) == date.sub("", theirs)
    assert loaded == "['click', 'ibal.tools.leanport']"


@pytest.mark.timeout(600)
def test_m_key_option_is_taken_as_the_c_tools_take_it(ibsim_module_fabric: Fabric) -> None:
    """``-y KEY`` on the SMP tools: the same text as the C tools with the same key (ibsim
    checks no M_Key; the key on the wire is ``tests/tools/test_mkey.py``'s)."""
    fabric = ibsim_module_fabric
    sw = str(lids(fabric)["switch"])
    cases = [["smpquery", "-y", "0x1234", "nodeinfo", sw], ["ibaddr", "-y", "4660", sw],
             ["iblinkinfo", "-y", "0x1234"], ["ibroute", "-y", "0x1234", sw]]
    ours = ibal(fabric, cases)
    for args, res in zip(cases, ours, strict=True):
        assert res["stdout"] == tool(fabric, args), args


@pytest.mark.timeout(600)
def test_ibtracert_multicast_matches(ibsim_fabric: Fabric) -> None:
    """Host and Peer join the IPoIB broadcast group (MLID 0xC000), so Switch1's MFT has
    their ports; ``ibtracert -m`` both ways, from the switch, ``-n``: the C tool's text;
    to SmHca (no member): no route for either."""
    import json
    import subprocess
    import sys

    from ibal.testing.helpers import wait_until
    from tests.tools.admin_ibsim import env

    fabric = ibsim_fabric
    ls = lids(fabric)
    host, sw, sm = (str(ls[k]) for k in ("host", "switch", "sm"))
    peer = next(str(v) for v in range(1, 6) if str(v) not in (host, sw, sm))
    probe = Path(__file__).with_name("mcast_join_probe.py")
    members = [subprocess.Popen([sys.executable, str(probe)], env=env(fabric, node),
                                cwd=fabric.workdir, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
               for node in ("Host", "Peer")]  # fmt: skip
    try:
        for m in members:
            assert m.stdout is not None
            assert json.loads(m.stdout.readline()) == {"status": "SUCCESS", "mlid": 0xC000}
        wait_until(lambda: "0xc000 " in tool(fabric, ["ibroute", "-M", sw]), "the MFT")
        cases = [["-m", "0xc000", host, peer], ["-m", "0xc000", "-n", host, peer],
                 ["-m", "49152", peer, host], ["-m", "0xc000", sw, peer]]
        ours = ibal(fabric, [["ibtracert", *a] for a in cases])
        for args, res in zip(cases, ours, strict=True):
            assert res["stdout"] == tool(fabric, ["ibtracert", *args]), args
        assert ours[0]["stdout"].count("\n") == 4 and '"Switch1"' in ours[0]["stdout"]
        js = valid("ibtracert", ibal(fabric, [["ibtracert", "--json", "-m", "0xc000", host,
                                               peer]])[0]["stdout"])  # fmt: skip
        assert [(h["NodeType"], h["OutPort"]) for h in js["hops"]] == [("CA", None),
                                                                      ("Switch", 1), ("CA", 3)]
        bad = ibal(fabric, [["ibtracert", "-m", "0xc000", host, sm]], ok=False)[0]
        theirs = fabric.run(["ibtracert", "-m", "0xc000", host, sm], "Host")
        assert bad["code"] == 1 and theirs.returncode != 0 and bad["stdout"] == ""
        assert "can't find a multicast route" in bad["stderr"]
        assert "can't find a multicast route" in theirs.stderr
    finally:
        for m in members:
            assert m.stdin is not None
            m.stdin.close()
            m.wait(60)
