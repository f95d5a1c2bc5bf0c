"""``ibal smpquery``/``perfquery``/``discover`` against infiniband-diags on ibsim + OpenSM.

The ibal commands run in a subprocess as ``Host`` under umad2sim, on the
rdma_core provider's MAD-only CA (``ibsim0``); ``smpquery``, ``perfquery``
and ``ibnetdiscover`` run as the same node in the same test.  ``tools_probe.py``
runs many ibal commands in one process (the CLI's own entry point, each
command opening and closing its own AL and CA) to keep the test short; ``smpquery -G`` and
``discover`` also run as ``python -m ibal.cli`` processes of their own.
MADs go through the MAD service (the default); the fat-tree sweep also runs
over the AL's bare agents (``--via agent``).  Counters that the queries
themselves move are masked.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ibal.mad.discover import parse_ibnetdiscover
from ibal.testing.ibsim import Fabric, fat_tree

PROBE = Path(__file__).with_name("tools_probe.py")
REPO = Path(__file__).resolve().parents[2]
NODE = "Host"


def _env(fabric: Fabric, node: str) -> dict[str, str]:
    env = fabric.env_for(node)
    env["PYTHONPATH"] = f"{REPO}:{env.get('PYTHONPATH', '')}"
    env["PYTHONFAULTHANDLER"] = "1"  # a crash under umad2sim shows its stack
    return env


def _ibal(fabric: Fabric, cmds: list[list[str]], node: str = NODE) -> list[dict[str, Any]]:
    """Run ``ibal CMD`` for each command in one process; their exit codes and output."""
    r = subprocess.run([sys.executable, str(PROBE)], input=json.dumps(cmds), env=_env(fabric, node),
                       cwd=fabric.workdir, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out: list[dict[str, Any]] = json.loads(r.stdout.strip().splitlines()[-1])
    for cmd, res in zip(cmds, out, strict=True):
        assert res["code"] == 0, (cmd, res)
    return out


def _tool(fabric: Fabric, args: list[str], node: str = NODE) -> str:
    r = fabric.run(args, node)
    assert r.returncode == 0, (args, r.stderr)
    return r.stdout


def _lids(fabric: Fabric) -> dict[str, int]:
    sw = _tool(fabric, ["smpquery", "-D", "portinfo", "0,1", "0"])
    me = _tool(fabric, ["smpquery", "-D", "portinfo", "0"])

    def field(text: str, name: str) -> int:
        m = re.search(rf"^{name}:\.+(\d+)$", text, re.M)
        assert m, text
        return int(m.group(1))

    return {"switch": field(sw, "Lid"), "host": field(me, "Lid"), "sm": field(me, "SMLid")}


@pytest.mark.timeout(600)
def test_smpquery_matches(ibsim_module_fabric: Fabric) -> None:
    fabric = ibsim_module_fabric
    lids = _lids(ibsim_module_fabric)
    sw, sm = str(lids["switch"]), str(lids["sm"])
    cases = [  # (ibal smpquery args, smpquery args)
        (["nodeinfo", sw], ["nodeinfo", sw]),
        (["nodeinfo", "-D", "0,1"], ["-D", "nodeinfo", "0,1"]),
        (["nodeinfo", "-D", "0"], ["-D", "nodeinfo", "0"]),
        (["portinfo", sm, "1"], ["portinfo", sm, "1"]),
        (["portinfo", sw, "0"], ["portinfo", sw, "0"]),
        (["portinfo", "-D", "0,1", "3"], ["-D", "portinfo", "0,1", "3"]),
        (["portinfo", "-D", "0"], ["-D", "portinfo", "0"]),
        (["nodedesc", sm], ["nodedesc", sm]),
        (["nodedesc", "-D", "0,1,3"], ["-D", "nodedesc", "0,1,3"]),
        (["switchinfo", sw], ["switchinfo", sw]),
        (["switchinfo", "-D", "0,1"], ["-D", "switchinfo", "0,1"]),
        (["pkeys", sm], ["pkeys", sm]),
        (["pkeys", "-D", "0,1", "2"], ["-D", "pkeys", "0,1", "2"]),
        (["guids", "-D", "0"], ["-D", "guidinfo", "0"]),
        (["guids", sw], ["guidinfo", sw]),
    ]
    ours = _ibal(ibsim_module_fabric, [["smpquery", *a] for a, _ in cases])
    for (a, b), res in zip(cases, ours, strict=True):
        theirs = _tool(ibsim_module_fabric, ["smpquery", *b])
        assert res["stdout"].splitlines() == theirs.splitlines(), a
    # The CLI as its own process, and -G (the port GUID through OpenSM's SA).
    guid = re.search(r"^PortGuid:\.+(0x[0-9a-f]+)$", ours[0]["stdout"], re.M)
    assert guid
    r = subprocess.run([sys.executable, "-m", "ibal.cli", "smpquery", "-G", "nodeinfo",
                        guid.group(1)], env=_env(fabric, NODE), cwd=fabric.workdir,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == _tool(fabric, ["smpquery", "nodeinfo", sw]).splitlines()
    # A target that does not answer: a clear error, exit status 1.
    bad = _ibal_fail(ibsim_module_fabric, ["smpquery", "nodeinfo", "-D", "0,1,7"])
    assert bad["code"] == 1 and "no response" in bad["stderr"]


def _ibal_fail(fabric: Fabric, cmd: list[str]) -> dict[str, Any]:
    r = subprocess.run([sys.executable, str(PROBE)], input=json.dumps([cmd]),
                       env=_env(fabric, NODE), cwd=fabric.workdir, capture_output=True,
                       text=True, timeout=300)  # fmt: skip
    res: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])[0]
    return res


_MOVING = re.compile(r"^(PortXmitData|PortRcvData|PortXmitPkts|PortRcvPkts):\.+\d+$", re.M)


def _masked(text: str) -> list[str]:
    return _MOVING.sub(lambda m: f"{m.group(1)}:<n>", text).splitlines()


@pytest.mark.timeout(600)
def test_perfquery_matches(ibsim_module_fabric: Fabric) -> None:
    lids = _lids(ibsim_module_fabric)
    sw, host = str(lids["switch"]), str(lids["host"])
    cases = [[], [host, "1"], [sw, "2"], ["-x", sw, "3"], ["-x"], [sw]]
    ours = _ibal(ibsim_module_fabric, [["perfquery", *a] for a in cases])
    for a, res in zip(cases, ours, strict=True):
        theirs = _tool(ibsim_module_fabric, ["perfquery", *a])
        assert _masked(res["stdout"]) == _masked(theirs), a
    # -r: read, then reset; the next read (by perfquery) starts again from zero
    _ibal(ibsim_module_fabric, [["perfquery", "-r", sw, "1"]])
    after = _tool(ibsim_module_fabric, ["perfquery", sw, "1"])
    pkts = int(re.search(r"^PortXmitPkts:\.+(\d+)$", after, re.M).group(1))  # type: ignore[union-attr]
    before = int(re.search(r"^PortXmitPkts:\.+(\d+)$", ours[2]["stdout"], re.M).group(1))  # type: ignore[union-attr]
    assert pkts < max(before, 1) + 5  # only what the few MADs since the reset moved


def _blocks(text: str) -> set[str]:
    """The node blocks of a topology text (order aside), the dated header dropped."""
    body = [b for b in text.split("\n\n") if not b.startswith("#")]
    return {b.strip("\n") for b in body}


@pytest.mark.timeout(600)
def test_discover_matches_ibnetdiscover_small(ibsim_module_fabric: Fabric) -> None:
    # the whole command, as its own process
    r = subprocess.run([sys.executable, "-m", "ibal.cli", "discover"],
                       env=_env(ibsim_module_fabric, NODE), cwd=ibsim_module_fabric.workdir,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    ours = {"stdout": r.stdout, "stderr": r.stderr}
    theirs = _tool(ibsim_module_fabric, ["ibnetdiscover"])
    assert parse_ibnetdiscover(ours["stdout"]) == parse_ibnetdiscover(theirs)
    # ibnetdiscover's order is deterministic here: the whole text matches but the date
    date = re.compile(r"^# Topology file: generated on .*$", re.M)
    assert date.sub("", ours["stdout"]) == date.sub("", theirs)
    assert ours["stderr"] == ""  # no progress when stderr is not a terminal


@pytest.mark.timeout(900)
def test_discover_matches_ibnetdiscover_fat_tree(ibsim_factory: Any, tmp_path: Path) -> None:
    tree = fat_tree(tmp_path / "fat.net", spines=4, leaves=8, hosts_per_leaf=6)
    fabric = ibsim_factory(tree.path)
    node = tree.hosts[5]
    # the bare AL agents (discover's default) and the MAD service, many SMPs in flight and one
    ours = _ibal(fabric, [["discover", "-w", "16"], ["discover", "-w", "1"],
                          ["discover", "--via", "service", "-w", "16"]], node)  # fmt: skip
    theirs = _tool(fabric, ["ibnetdiscover"], node)
    want = parse_ibnetdiscover(theirs)
    assert len(want["nodes"]) == tree.nodes
    for res in ours:
        assert parse_ibnetdiscover(res["stdout"]) == want
        assert _blocks(res["stdout"]) == _blocks(theirs)


_DATE = re.compile(r"^# Topology file: generated on .*$", re.M)
_DISCOVER_OPTS = [["-l"], ["-H"], ["-S"], ["-R"], ["-p"], ["-g"], ["-s"], ["-s", "-p"]]


@pytest.mark.timeout(600)
def test_discover_options_match_ibnetdiscover(ibsim_module_fabric: Fabric) -> None:
    """-l/-H/-S/-R (node lists), -p (ports report), -g (grouping: no chassis here), -s
    (each node as found first): the same text as ibnetdiscover's, the date aside."""
    ours = _ibal(ibsim_module_fabric, [["discover", *a] for a in _DISCOVER_OPTS])
    for args, res in zip(_DISCOVER_OPTS, ours, strict=True):
        theirs = _tool(ibsim_module_fabric, ["ibnetdiscover", *args])
        assert _DATE.sub("", res["stdout"]) == _DATE.sub("", theirs), args
    assert "Non-Chassis Nodes" in ours[5]["stdout"] and ours[6]["stdout"].count("-> new") == 4


@pytest.mark.timeout(900)
def test_discover_options_and_ibroute_m_match_on_a_fat_tree(ibsim_factory: Any,
                                                           tmp_path: Path) -> None:  # fmt: skip
    """The discover options on a fat tree, where the order of the lines depends on the
    order the answers came in: the same lines; -s prints the "new" lines only
    (docs/mad.md).  And ``ibroute -M`` of every switch, leaves of 11 ports (the header
    with the tens of the port numbers), no group joined: -a shows the empty rows."""
    tree = fat_tree(tmp_path / "fat.net", spines=2, leaves=4, hosts_per_leaf=9)
    fabric = ibsim_factory(tree.path)
    node = tree.hosts[1]
    lids = _switch_lids(fabric, node)
    cases = [["-M", str(lid)] for lid in lids]
    cases += [["-M", "-a", str(lids[0]), "0xc000", "0xc003"],
              ["-M", "-a", "-n", str(lids[-1]), "0xc01f", "0xc020"]]  # fmt: skip
    got = _ibal(fabric, [["ibroute", *a] for a in cases], node)
    for args, res in zip(cases, got, strict=True):
        assert res["stdout"] == _tool(fabric, ["ibroute", *args], node), args
    tens = "\n" + " " * 12 + "0" + " " * 19 + "1" + " " * 3 + "\n"  # ports 0..11
    assert sum(tens in r["stdout"] for r in got[: len(lids)]) == len(tree.leaves)
    ours = _ibal(fabric, [["discover", *a] for a in _DISCOVER_OPTS], node)
    for args, res in zip(_DISCOVER_OPTS, ours, strict=True):
        theirs = _tool(fabric, ["ibnetdiscover", *args], node)
        if args == ["-g"]:
            assert _blocks(res["stdout"]) == _blocks(theirs)
            continue
        want = sorted(_DATE.sub("", theirs).splitlines())
        if "-s" in args:
            want = [ln for ln in want if " -> known " not in ln]
        assert sorted(_DATE.sub("", res["stdout"]).splitlines()) == want, args
    assert len(ours[0]["stdout"].splitlines()) == tree.nodes


_ACTIVITY = re.compile(r"activity count \d+")


@pytest.mark.timeout(300)
def test_sminfo_matches(ibsim_module_fabric: Fabric) -> None:
    """``ibal sminfo`` (the SM the port names, and the SM's LID given) is sminfo's line; the
    activity count, which OpenSM moves every sweep, is masked."""
    sm = str(_lids(ibsim_module_fabric)["sm"])
    ours = _ibal(ibsim_module_fabric, [["sminfo"], ["sminfo", sm]])
    for res, args in zip(ours, ([], [sm]), strict=True):
        theirs = _tool(ibsim_module_fabric, ["sminfo", *args])
        assert f"sm lid {sm} " in theirs and "SMINFO_MASTER" in theirs, theirs
        assert _ACTIVITY.sub("N", res["stdout"]) == _ACTIVITY.sub("N", theirs), args


def _switch_lids(fabric: Fabric, node: str = NODE) -> list[int]:
    nodes = parse_ibnetdiscover(_tool(fabric, ["ibnetdiscover"], node))["nodes"]
    return sorted(n["lid"] for n in nodes.values() if n["type"] == "Switch")


def _check_ibroute(fabric: Fabric, node: str, extra: list[list[str]]) -> None:
    """``ibal ibroute`` of every switch (and the ``extra`` forms) is ibroute's text."""
    cases = [[str(lid)] for lid in _switch_lids(fabric, node)] + extra
    ours = _ibal(fabric, [["ibroute", *a] for a in cases], node)
    for args, res in zip(cases, ours, strict=True):
        theirs = _tool(fabric, ["ibroute", *args], node)
        assert "lids dumped" in theirs and ("portguid" in theirs or "-n" in args), theirs
        assert res["stdout"] == theirs, args


@pytest.mark.timeout(600)
def test_ibroute_matches(ibsim_module_fabric: Fabric) -> None:
    """Every switch of the small fabric; by DR path, -n (no destinations), -a (invalid out
    ports too) and a LID range."""
    sw = str(_switch_lids(ibsim_module_fabric)[0])
    extra = [["-D", "0,1"], ["-n", sw], ["-a", sw], [sw, "2", "0x3"]]
    _check_ibroute(ibsim_module_fabric, NODE, extra)
    bad = _ibal_fail(ibsim_module_fabric, ["ibroute", "-D", "0"])  # the local port is a CA
    assert bad["code"] == 1 and "not a switch" in bad["stderr"]


@pytest.mark.timeout(900)
def test_ibroute_matches_fat_tree(ibsim_factory: Any, tmp_path: Path) -> None:
    tree = fat_tree(tmp_path / "fat.net", spines=2, leaves=4, hosts_per_leaf=3)
    fabric = ibsim_factory(tree.path)
    _check_ibroute(fabric, tree.hosts[0], [])


QUERY_PROBE = Path(__file__).with_name("umad_query_probe.py")
IPOIB_BROADCAST = bytes.fromhex("ff12401bffff000000000000ffffffff")  # OpenSM's default group


def _join(fabric: Fabric, node: str, sm_lid: int) -> None:
    """``node``'s port joins the IPoIB broadcast group as a full member (SubnAdmSet of an
    MCMemberRecord to OpenSM's SA)."""
    from ibal.wire.mad import header, sa, smp
    from ibal.wire.mad.consts import MgmtClass, SaAttr, SmpAttr

    def probe(reqs: list[dict[str, Any]]) -> dict[str, bytes]:
        r = subprocess.run([sys.executable, str(QUERY_PROBE)], input=json.dumps(reqs),
                           env=_env(fabric, node), cwd=fabric.workdir, capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        return {k: bytes.fromhex(v) for k, v in got.items()}

    dr = {"class": MgmtClass.SUBN_DR, "dr_path": [], "mod": 0}
    got = probe([{"name": "pi", "attr": SmpAttr.PORT_INFO, **dr},
                 {"name": "ni", "attr": SmpAttr.NODE_INFO, **dr}])  # fmt: skip
    prefix = int(smp.PORT_INFO.decode(header.payload(got["pi"]))["gid_prefix"])
    guid = int(smp.NODE_INFO.decode(header.payload(got["ni"]))["port_guid"])
    gid = prefix.to_bytes(8, "big") + guid.to_bytes(8, "big")
    rec = sa.MCMEMBER_RECORD.encode(mgid=IPOIB_BROADCAST, port_gid=gid, join_state=1)
    mask = sa.component_mask(sa.MCMEMBER_RECORD, ["mgid", "port_gid", "join_state"])
    got = probe([{"name": "join", "class": MgmtClass.SUBN_ADM, "method": 0x02,
                  "attr": SaAttr.MCMEMBER_RECORD, "lid": sm_lid, "comp_mask": mask,
                  "data": rec.hex()}])  # fmt: skip
    assert header.header(got["join"]).status == 0, got["join"].hex()


@pytest.mark.timeout(600)
def test_ibroute_multicast_matches(ibsim_fabric: Fabric) -> None:
    """``ibroute -M`` once two hosts joined the IPoIB broadcast group and OpenSM programmed
    the switch's MulticastForwardingTable: the table, -n (masks), -a over a range, by DR
    path."""
    from ibal.testing.helpers import wait_until

    lids = _lids(ibsim_fabric)
    sw = str(lids["switch"])
    empty = _tool(ibsim_fabric, ["ibroute", "-M", sw])
    assert empty.endswith("\n0 valid mlids dumped \n")  # OpenSM's group has no member yet
    assert _ibal(ibsim_fabric, [["ibroute", "-M", sw]])[0]["stdout"] == empty
    for node in ("Host", "Peer"):
        _join(ibsim_fabric, node, lids["sm"])
    wait_until(lambda: "\n1 valid mlids dumped" in _tool(ibsim_fabric, ["ibroute", "-M", sw]),
               "OpenSM programmed the group's MFT", timeout=60)  # fmt: skip
    cases = [["-M", sw], ["-M", "-n", sw], ["-M", "-a", sw, "0xc000", "0xc021"],
             ["-M", "-D", "0,1"], ["-M", sw, "0xc001"]]  # fmt: skip
    ours = _ibal(ibsim_fabric, [["ibroute", *a] for a in cases])
    for args, res in zip(cases, ours, strict=True):
        assert res["stdout"] == _tool(ibsim_fabric, ["ibroute", *args]), args
    rows = [ln for ln in ours[0]["stdout"].splitlines() if ln.startswith("0xc000")]
    assert len(rows) == 1 and rows[0][6:].count("x") == 2  # the ports to Host and Peer
