"""``ibal dump_fts``, ``dump_lfts``, ``dump_mfts``: every switch's forwarding tables.

As infiniband-diags' ``dump_fts``: a directed-route sweep, then each switch
(the last found first, as libibnetdisc lists them) dumped as ``ibroute`` does,
addressed by the DR path the sweep found it by (``DR path slid 0; dlid 0;
0,1``); ``-M`` the multicast tables.  ``dump_lfts``/``dump_mfts`` are the old
scripts' names: the same text, then their "replaced by" notice.
"""

from __future__ import annotations

from typing import Any

import click

from ibal.mad.discover import sweep
from ibal.mad.rpc import MadClient, MadError, PortId
from ibal.tools.cliopts import node_name_map_option
from ibal.tools.diagcli import emit_json, fabric_client, fabric_options, guid

__all__ = ["dump_fts", "dump_fts_cmd", "dump_lfts_cmd", "dump_mfts_cmd", "table_rows"]


def dump_fts(client: MadClient, start: int = 0, end: int = 0, *, all_lids: bool = False,
             no_dests: bool = False, multicast: bool = False,
             window: int = 64,
             names: dict[int, str] | None = None) -> list[tuple[Any, PortId, str]]:  # fmt: skip
    """Each switch, its address and ibroute's text of its table (``names``: a
    ``--node-name-map``)."""
    from ibal.tools.diags import ibroute

    topo = sweep(client, window=window).topology
    if topo.root is None:
        raise MadError("discover failed: the local port did not answer NodeInfo")
    out = []
    for node in reversed(topo.nodes.values()):
        if not node.is_switch:
            continue
        to = PortId(dr_path=node.path)
        text = ibroute(client, to, start, end, all_lids=all_lids, no_dests=no_dests,
                       multicast=multicast, names=names)  # fmt: skip
        # libibnetdisc's addresses carry DrSLID/DrDLID 0 (sent as 0xFFFF): dump_fts shows 0s
        text = text.replace(f" of switch {to} ", f" of switch DR path slid 0; dlid 0; "
                            f"{','.join(map(str, (0, *node.path)))} ", 1)  # fmt: skip
        out.append((node, to, text))
    return out


def _lid(text: str | None) -> int:
    try:
        return 0 if text is None else int(text, 0)
    except ValueError:
        raise click.ClickException(f"bad LID {text}") from None


def _run(name: str, start: str | None, end: str | None, all_lids: bool, no_dests: bool,
         multicast: bool, as_json: bool, kw: dict[str, Any], notice: str) -> None:  # fmt: skip
    from ibal.tools import nodemap

    names = nodemap.load(kw.pop("node_name_map"))
    with fabric_client(name, kw) as client:
        tables = dump_fts(client, _lid(start), _lid(end), all_lids=all_lids, no_dests=no_dests,
                          multicast=multicast, names=names)  # fmt: skip
    for node, _, _ in tables:
        node.desc = nodemap.remap(names, node.guid, node.desc)
    if as_json:
        emit_json({"switches": [{"NodeGUID": guid(n.guid), "NodeDescription": n.desc,
                                 "LID": n.lid, "DRPath": [0, *n.path],
                                 "Multicast": multicast, "Table": table_rows(text, multicast)}
                                for n, to, text in tables]})  # fmt: skip
        return
    click.echo("".join(t for _, _, t in tables) + notice, nl=False)


def table_rows(text: str, multicast: bool) -> list[dict[str, Any]]:
    """The table's rows, from ibroute's lines: LID and out port (MLID and ports)."""
    rows: list[dict[str, Any]] = []
    for line in text.splitlines():
        if not line.startswith("0x"):
            continue
        head, _, rest = line.partition(" ")
        if multicast:
            ports = [i for i, c in enumerate(rest) if c == "x"]
            rows.append({"MLID": int(head, 16), "Ports": ports})
        else:
            rows.append({"LID": int(head, 16), "Port": int(rest.split()[0])})
    return rows


def _command(name: str, multicast: bool | None, notice: str, doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.argument("start", required=False)
    @click.argument("end", required=False)
    @click.option("-a", "--all", "all_lids", is_flag=True, help="Show invalid out ports too.")
    @click.option("-n", "--no_dests", is_flag=True, help="Do not resolve destinations.")
    @node_name_map_option
    @fabric_options(via="agent")
    def cmd(start: str | None, end: str | None, all_lids: bool, no_dests: bool, as_json: bool,
            multicast_flag: bool = False, **kw: Any) -> None:  # fmt: skip
        mc = multicast_flag if multicast is None else multicast
        _run(name, start, end, all_lids, no_dests, mc, as_json, kw, notice)

    if multicast is None:
        cmd = click.option("-M", "--Multicast", "multicast_flag", is_flag=True,
                           help="The multicast forwarding tables.")(cmd)  # fmt: skip
    return cmd


def _notice(what: str) -> str:
    return f"\n*** WARNING ***: this command has been replaced by {what}\n\n\n"


dump_fts_cmd = _command("dump_fts", None, "", "dump_fts: every switch's unicast (-M: multicast) "
                        "forwarding table [from START to END].")  # fmt: skip
dump_lfts_cmd = _command("dump_lfts", False, _notice("dump_fts"), "dump_lfts: every switch's "
                         "unicast forwarding table (the old name of dump_fts).")  # fmt: skip
dump_mfts_cmd = _command("dump_mfts", True, _notice("dump_fts -M"), "dump_mfts: every switch's "
                         "multicast forwarding table (the old name of dump_fts -M).")  # fmt: skip
