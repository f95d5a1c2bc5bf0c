"""``ibal ibhosts``, ``ibswitches``, ``ibrouters``, ``ibnodes``: the nodes of the fabric.

As infiniband-diags' scripts of those names: a topology in ibnetdiscover's
format (a sweep, or the file given), each node line turned into one line of
the list (the scripts' awk, in :func:`node_lines`).  ``ibnodes`` is ``ibhosts``
then ``ibswitches``, from one sweep.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Final

import click

from ibal.records import record
from ibal.tools.diagcli import emit_json, fabric_client, fabric_options, guid

__all__ = ["NodeLine", "ibhosts_cmd", "ibnodes_cmd", "ibrouters_cmd", "ibswitches_cmd",
           "node_lines", "parse_nodes"]  # fmt: skip

_KINDS: Final = {"ibhosts": ("Ca",), "ibswitches": ("Switch",), "ibrouters": ("Rt",),
                 "ibnodes": ("Ca", "Switch")}  # fmt: skip
_TYPE_NAMES: Final = {"Ca": "CA", "Switch": "Switch", "Rt": "Router"}
_SWITCH_PORT0 = re.compile(r"^\"(.*)\" (base|enhanced) port 0 lid (\d+) lmc (\d+)$")


@record(frozen=True)
class NodeLine:
    """One node line of a topology: ibnetdiscover's kind word, GUID, ports, comment."""

    kind: str
    guid: int
    num_ports: int
    comment: str

    def text(self) -> str:
        """The scripts' line: ``Ca\\t: 0xGUID ports N "desc"``."""
        tail = self.comment
        if self.kind == "Switch":
            # ibswitches cuts the comment at "port 0" and puts it back together
            i = tail.find("port 0")
            if i > 0:
                tail = f"{tail[: i - 1]} {tail[i:]}"
        return f"{self.kind}\t: 0x{self.guid:016x} ports {self.num_ports} {tail}"

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"NodeType": _TYPE_NAMES[self.kind], "NodeGUID": guid(self.guid),
                               "NumPorts": self.num_ports}  # fmt: skip
        m = _SWITCH_PORT0.match(self.comment)
        if m:
            out.update(NodeDescription=m.group(1), EnhancedPort0=m.group(2) == "enhanced",
                       LID=int(m.group(3)), LMC=int(m.group(4)))  # fmt: skip
        else:
            out["NodeDescription"] = self.comment.removeprefix('"').removesuffix('"')
        return out


def parse_nodes(topology: str) -> list[NodeLine]:
    """The node lines (``Switch``, ``Ca``, ``Rt``) of a topology text, in its order."""
    out = []
    for line in topology.splitlines():
        kind = line.split("\t", 1)[0]
        if kind not in _TYPE_NAMES:
            continue
        fields = line.split()
        comment = re.split(r"#[ \t]*", line, maxsplit=1)
        out.append(NodeLine(kind, int(fields[2][3:19], 16), int(fields[1]),
                            comment[1] if len(comment) > 1 else ""))  # fmt: skip
    return out


def node_lines(topology: str, kinds: Sequence[str]) -> list[NodeLine]:
    """The nodes of ``kinds`` (``"Ca"``, ``"Switch"``, ``"Rt"``), kind by kind."""
    nodes = parse_nodes(topology)
    return [n for k in kinds for n in nodes if n.kind == k]


def _run(command: str, topofile: str | None, as_json: bool, kw: dict[str, Any]) -> None:
    if topofile is not None:
        try:
            with open(topofile, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as exc:
            raise click.ClickException(f"{topofile}: {exc.strerror}") from exc
    else:
        from ibal.tools.diags import discover

        with fabric_client(command, kw) as client:
            text = discover(client, progress=False)
    nodes = node_lines(text, _KINDS[command])
    if as_json:
        emit_json({"nodes": [n.as_json() for n in nodes]})
    else:
        click.echo("".join(n.text() + "\n" for n in nodes), nl=False)


def _command(name: str, doc: str) -> click.Command:
    @click.command(name, help=doc)
    @click.argument("topofile", required=False, metavar="[TOPOLOGY-FILE]")
    @fabric_options(via="agent")
    def cmd(topofile: str | None, as_json: bool, **kw: Any) -> None:
        _run(name, topofile, as_json, kw)

    return cmd


ibhosts_cmd = _command("ibhosts", "ibhosts: the channel adapters of the fabric, or of "
                       "TOPOLOGY-FILE (ibnetdiscover's format).")  # fmt: skip
ibswitches_cmd = _command("ibswitches", "ibswitches: the switches of the fabric, or of "
                          "TOPOLOGY-FILE.")  # fmt: skip
ibrouters_cmd = _command("ibrouters", "ibrouters: the routers of the fabric, or of "
                         "TOPOLOGY-FILE.")  # fmt: skip
ibnodes_cmd = _command("ibnodes", "ibnodes: the channel adapters, then the switches, of the "
                       "fabric or of TOPOLOGY-FILE.")  # fmt: skip
