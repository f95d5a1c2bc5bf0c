"""The shared ibsim/OpenSM harness (:mod:`ibal.testing.ibsim`).

The net-file generator is checked on its text; the fabric tests start ibsim
and OpenSM (skipping, naming the Debian packages, without them) and check what
independent clients (infiniband-diags) see.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ibal.testing.ibsim import DATA_DIR, Fabric, fat_tree, net_nodes


def _links(text: str) -> set[tuple[str, int, str, int]]:
    """Every ``[p] "remote"[q]`` line under its node header, as (node, p, remote, q)."""
    out: set[tuple[str, int, str, int]] = set()
    node = ""
    for line in text.splitlines():
        m = re.match(r'^(?:Switch|Hca)\s+\d+\s+"([^"]+)"', line)
        if m:
            node = m.group(1)
            continue
        m = re.match(r'^\[(\d+)\]\s+"([^"]+)"\[(\d+)\]', line)
        if m:
            out.add((node, int(m.group(1)), m.group(2), int(m.group(3))))
    return out


def test_fat_tree_links_are_symmetric_and_complete(tmp_path: Path) -> None:
    ft = fat_tree(tmp_path / "ft.net", spines=3, leaves=4, hosts_per_leaf=5)
    text = ft.path.read_text()
    nodes = net_nodes(ft.path)
    assert len(nodes) == ft.nodes == 3 + 4 + 4 * 5
    assert nodes[0].name == ft.sm_host == "H-0-1"
    links = _links(text)
    assert all((r, q, n, p) in links for n, p, r, q in links)  # both ends declared
    for leaf in ft.leaves:  # one uplink to every spine, one host per down port
        ups = {r for n, _p, r, _q in links if n == leaf and r in ft.spines}
        downs = [r for n, _p, r, _q in links if n == leaf and r in ft.hosts]
        assert ups == set(ft.spines) and len(downs) == 5
    assert len(links) == 2 * (4 * 5 + 4 * 3)


def test_fat_tree_refuses_empty_levels(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        fat_tree(tmp_path / "x.net", spines=0, leaves=1, hosts_per_leaf=1)


def _port_state(fabric: Fabric, node: str) -> str:
    out = fabric.run(["smpquery", "portinfo", "-D", "0"], node, timeout=60).stdout
    m = re.search(r"^LinkState:\.+(\w+)", out, re.M)
    assert m, out
    return m.group(1)


@pytest.mark.timeout(180)
def test_small_fabric_is_up_and_a_link_goes_down_and_up(ibsim_fabric: Fabric) -> None:
    fabric = ibsim_fabric
    assert "SMINFO_MASTER" in fabric.run(["sminfo"], "Peer").stdout
    disc = fabric.run(["ibnetdiscover"], "Peer").stdout
    for node in net_nodes(DATA_DIR / "small.net"):
        assert f'"{node.name}"' in disc
    assert _port_state(fabric, "Host") == "Active"
    fabric.unlink("Host", 1)
    assert _port_state(fabric, "Host") == "Down"
    fabric.relink("Host", 1)
    deadline = time.monotonic() + 60  # OpenSM sweeps on ibsim's trap and activates it
    while (state := _port_state(fabric, "Host")) != "Active":
        assert time.monotonic() < deadline, state


def test_env_for_names_the_node_and_socket(ibsim_fabric: Fabric) -> None:
    env = ibsim_fabric.env_for("Peer")
    assert env["SIM_HOST"] == "Peer"
    assert env["IBSIM_SOCKNAME"] == ibsim_fabric.sockname
    assert "libumad2sim.so" in env["LD_PRELOAD"]
    with pytest.raises(ValueError):
        ibsim_fabric.env_for("NoSuchNode")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fat_tree_of_1008_nodes_comes_up(
    ibsim_factory: Callable[..., Fabric], tmp_path: Path
) -> None:
    ft = fat_tree(tmp_path / "ft.net", spines=8, leaves=40, hosts_per_leaf=24)
    fabric = ibsim_factory(ft.path, ready_within=300)  # ready: every node has a LID
    disc = fabric.run(["ibnetdiscover"], ft.hosts[-1]).stdout
    assert len(re.findall(r'^Ca\s+1\s+"', disc, re.M)) == len(ft.hosts) == 960
    assert len(re.findall(r'^Switch\s+\d+\s+"', disc, re.M)) == 48
