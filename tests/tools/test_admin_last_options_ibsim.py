"""Issue 24's last options against infiniband-diags on ibsim + OpenSM.

``ibqueryerrors --load-cache`` (the fabric from an ibnetdiscover cache, the
counters from the live PMAs) and ``ibtracert --ports-file`` (each pair of a
file): each ibal command and the C tool with the same arguments print the
same text.  Skips naming the missing Debian packages (fails with
``IBAL_LAB_REQUIRED=1``): the module's one ibsim fabric.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ibal.testing.ibsim import Fabric
from ibal.tools.paths import port_pairs
from tests.tools.admin_ibsim import ibal, lids, tool, valid


def _host(fabric: Fabric) -> tuple[int, int]:
    """Host's node GUID and port GUID."""
    topo = valid("discover", ibal(fabric, [["discover", "--json"]])[0]["stdout"])
    node = next(int(n["NodeGUID"], 16) for n in topo["nodes"] if n["NodeDescription"] == "Host")
    port = valid("ibaddr", ibal(fabric, [["ibaddr", "--json"]])[0]["stdout"])["PortGUID"]
    return node, int(port, 16)


@pytest.mark.timeout(600)
def test_ibqueryerrors_load_cache_matches(ibsim_module_fabric: Fabric, tmp_path: Path) -> None:
    """Caches written by each tool, then errors set: both tools report them from either
    cache; a cache whose Host port GUID was edited makes both print the edited GUID (the
    nodes are the cache's, the counters the PMAs')."""
    fabric = ibsim_module_fabric
    ours, theirs = tmp_path / "ours.cache", tmp_path / "theirs.cache"
    ibal(fabric, [["discover", "--cache", str(ours)]])
    tool(fabric, ["ibnetdiscover", "--cache", str(theirs)])
    node, port = _host(fabric)
    edited = tmp_path / "edited.cache"
    tool(fabric, ["ibcacheedit", "--portguid", f"{node:#x}:{port:#x}:0x1234abcd", str(theirs),
                  str(edited)])  # fmt: skip
    fabric.console('PerformanceSet "Switch1"[2] PortCounters.SymbolErrorCounter=5')
    fabric.console('PerformanceSet "Host"[1] PortCounters.LinkDownedCounter=3')
    try:
        cases = []
        for c in (ours, theirs):
            cases += [["--load-cache", str(c)], ["--load-cache", str(c), "-r"],
                      ["--load-cache", str(c), "--switch", "--data"],
                      ["--load-cache", str(c), "-G", f"{port:#x}"]]
        cases.append(["--load-cache", str(edited)])
        mine = ibal(fabric, [["ibqueryerrors", *a] for a in cases], ok=False)
        for args, res in zip(cases, mine, strict=True):
            theirs_text = tool(fabric, ["ibqueryerrors", *args], ok=False)
            assert res["code"] == 1, (args, res["stderr"])
            if "--data" in args:  # data counters move between two runs: the lines only
                theirs_text, res["stdout"] = (t.split(" [PortXmitData", 1)[0]
                                              for t in (theirs_text, res["stdout"]))
            assert res["stdout"] == theirs_text, args
        assert "[SymbolErrorCounter == 5]" in mine[0]["stdout"]
        assert "[LinkDownedCounter == 3]" in mine[0]["stdout"]
        assert "Link info:" in mine[1]["stdout"]
        assert "GUID 0x1234abcd port 1: [LinkDownedCounter == 3]" in mine[-1]["stdout"]
        assert f"GUID {port:#x} port 1" not in mine[-1]["stdout"]
        bad = [["--load-cache", str(ours), "-D", "0,1"],
               ["--load-cache", str(tmp_path / "none")]]
        res = ibal(fabric, [["ibqueryerrors", *a] for a in bad], ok=False)
        for args, r, why in zip(bad, res, ("Cannot specify cache and direct route path",
                                           "loading cached fabric failed"), strict=True):
            c = fabric.run(["ibqueryerrors", *args], "Host")
            assert r["code"] == 1 and c.returncode != 0 and r["stdout"] == "", args
            assert why in r["stderr"] and why in c.stderr, args
    finally:
        ibal(fabric, [["ibqueryerrors", "-k"]], ok=False)


def test_ports_file_is_read_as_ibtracert_reads_it() -> None:
    text = ("# pairs\n\n   \n\t# indented comment\n1 2\n  3\t4 extra\n5\n"
            f"{'7' * 25} 8\n{' ' * 77}9 10\n")
    # %20s: the rest of a long word is the second end; fgets' 79 characters end a
    # line early, and what is left is a line of its own (one word: no pair)
    assert list(port_pairs(text)) == [(5, ("1", "2")), (6, ("3", "4")), (7, None),
                                      (8, ("7" * 20, "77777")), (9, None), (10, None)]
    assert list(port_pairs("1 2")) == [(1, ("1", "2"))]  # no newline at the end


@pytest.mark.timeout(600)
def test_ibtracert_ports_file_matches(ibsim_module_fabric: Fabric, tmp_path: Path) -> None:
    """A file of LID pairs (comments, blank lines), of GUID pairs with ``-G``: the C tool's
    routes and its count line; ``--json`` each route; a bad line and an unreachable LID
    stop both after the routes before them."""
    fabric = ibsim_module_fabric
    ls = lids(fabric)
    host, sw, sm = (str(ls[k]) for k in ("host", "switch", "sm"))
    peer = next(str(v) for v in range(1, 6) if str(v) not in (host, sw, sm))
    pairs = tmp_path / "pairs"
    pairs.write_text(f"# from the host\n{host} {peer}\n\n  {peer}\t{sm}  # a tail\n"
                     f"{sw} {peer}\n{host} {host}\n")  # fmt: skip
    _, port = _host(fabric)
    other = valid("ibaddr", ibal(fabric, [["ibaddr", "--json", peer]])[0]["stdout"])["PortGUID"]
    guids = tmp_path / "guids"
    guids.write_text(f"{port:#x} {other}\n{other} {port:#018x}\n")
    cases = [["--ports-file", str(pairs)], ["-n", "--ports-file", str(pairs)],
             ["-G", "--ports-file", str(guids)], ["--ports-file", str(pairs), "1", "2"]]
    mine = ibal(fabric, [["ibtracert", *a] for a in cases]
                + [["ibtracert", "--json", "--ports-file", str(pairs)]])  # fmt: skip
    for args, res in zip(cases, mine, strict=False):
        assert res["stdout"] == tool(fabric, ["ibtracert", *args]), args
    text = mine[0]["stdout"]
    assert text.count("\nFrom ") == 3 and text.endswith(f"4 lid/guid pairs processed from "
                                                         f"{pairs}\n")  # fmt: skip
    assert mine[2]["stdout"].endswith(f"2 lid/guid pairs processed from {guids}\n")
    js = valid("ibtracert", mine[-1]["stdout"])
    assert [(r["Source"], r["Destination"], len(r["hops"])) for r in js["routes"]] == [
        (host, peer, 3), (peer, sm, 3), (sw, peer, 2), (host, host, 1)]
    bad, gone = tmp_path / "bad", tmp_path / "gone"
    bad.write_text(f"{host} {peer}\n{sm}\n{host} {sm}\n")
    gone.write_text(f"{host} {peer}\n{host} 60\n")
    for f, why in ((bad, f"ports-file, {bad}, at line 2 contains bad data"),
                   (gone, "at line 2")):
        res = ibal(fabric, [["ibtracert", "--ports-file", str(f)]], ok=False)[0]
        c = fabric.run(["ibtracert", "--ports-file", str(f)], "Host")
        assert res["code"] == 1 and c.returncode != 0, f
        # the C tool's routes before the error, then its error line (on stdout)
        start, err = c.stdout.rsplit("ibtracert: iberror: ", 1)
        assert res["stdout"] == start and start.count("From ca ") == 1, f
        assert why in res["stderr"] and why in err, (f, res["stderr"], err)
    missing = ibal(fabric, [["ibtracert", "--ports-file", str(tmp_path / "none")]], ok=False)
    assert missing[0]["code"] == 1 and "cannot open ports-file" in missing[0]["stderr"]


def _heads(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(("CA: ", "Switch: "))]


@pytest.mark.timeout(600)
def test_iblinkinfo_hops_matches(ibsim_module_fabric: Fabric) -> None:
    """``-n`` from here and with ``-D``/``-a``, from the switch and from CAs two hops away
    (a CA is left backwards, a hop too): the C tool's partial scans, node for node."""
    fabric = ibsim_module_fabric
    cases = [["-n", "1"], ["-n", "2"], ["-n", "1", "-l"], ["-D", "0,1", "-a"],
             ["-D", "0,1", "-a", "-n", "3"], ["-D", "0,1,1", "-a"], ["-D", "0,1,3", "-a"],
             ["-D", "0,1,3", "-a", "-n", "2", "-p"], ["-D", "0,1,3", "-n", "1"],
             ["-D", "0", "-a", "--switches-only"]]  # fmt: skip
    mine = ibal(fabric, [["iblinkinfo", *a] for a in cases])
    for args, res in zip(cases, mine, strict=True):
        assert res["stdout"] == tool(fabric, ["iblinkinfo", *args]), args
    # one hop from Host reaches Switch1, and the first path one hop further still goes:
    # one of SmHca and Peer is found, the other's port is not available
    one = mine[0]["stdout"]
    assert len(_heads(one)) == 3 and one.count('"Port not available"') == 1
    assert len(_heads(mine[1]["stdout"])) == 4  # the whole fabric
    # from Peer: back to Switch1 is the one hop, then one more path only
    assert len(_heads(mine[6]["stdout"])) == 3
    assert _heads(mine[8]["stdout"]) == ["CA: Peer:"]
