"""Which ``ibal`` subcommands exist, what each is for, and where the lazy ones live.

``ibal --help`` groups the commands by :data:`GROUPS`; a command in :data:`LAZY`
is imported only when it is run (or its own ``--help`` is asked for), so a
diagnostic's start-up pays for its own module and nothing else.  Its one-line
help is kept here for the same reason: listing the commands imports none of them.
"""

from __future__ import annotations

from typing import Final

from ibal.records import record

__all__ = ["GROUPS", "LAZY", "Lazy", "group_of"]


@record(frozen=True)
class Lazy:
    """A subcommand defined as ``attr`` of ``module``, loaded when first resolved."""

    module: str
    attr: str
    help: str


def _in(module: str, **cmds: str) -> dict[str, Lazy]:
    return {name: Lazy(module, f"{name}_cmd", text) for name, text in cmds.items()}


LAZY: Final[dict[str, Lazy]] = {
    **_in("ibal.tools.nodes",
          ibhosts="ibhosts: the channel adapters of the fabric (or of a topology file).",
          ibswitches="ibswitches: the switches of the fabric (or of a topology file).",
          ibrouters="ibrouters: the routers of the fabric (or of a topology file).",
          ibnodes="ibnodes: the CAs, then the switches, of the fabric."),
    **_in("ibal.tools.ibstat",
          ibstat="ibstat: this node's CAs and their ports.",
          ibstatus="ibstatus: the state of this node's ports."),
    **_in("ibal.tools.links",
          iblinkinfo="iblinkinfo: every link of the fabric, both ends, state, width and speed."),
    **_in("ibal.tools.errors",
          ibqueryerrors="ibqueryerrors: the ports whose error counters are over a threshold."),
    **_in("ibal.tools.paths",
          ibtracert="ibtracert: the route from one port to another, hop by hop (-m: multicast)."),
    **_in("ibal.tools.portstate",
          ibportstate="ibportstate: a port's state, width and speed; enable, disable, reset, set."),
    **_in("ibal.tools.fts",
          dump_fts="dump_fts: every switch's unicast (-M: multicast) forwarding table.",
          dump_lfts="dump_lfts: every switch's unicast forwarding table.",
          dump_mfts="dump_mfts: every switch's multicast forwarding table."),
    **_in("ibal.tools.ping",
          ibping="ibping: ping a port over the OpenIB ping class (-S: answer pings).",
          ibsysstat="ibsysstat: ping, host name or CPUs of a node's ibsysstat server (-S)."),
    **_in("ibal.tools.cache",
          ibcacheedit="ibcacheedit: change GUIDs in an ibnetdiscover cache file."),
    **_in("ibal.tools.addr",
          ibaddr="ibaddr: the GID and LID range of a port [default: this port].",
          smpdump="smpdump: one SMP attribute of a target, as hex words."),
}  # fmt: skip

GROUPS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("This node", ("devices", "info", "ibstat", "ibstatus", "ibaddr", "events")),
    ("The fabric", ("discover", "ibnodes", "ibhosts", "ibswitches", "ibrouters", "iblinkinfo",
                    "ibcacheedit")),
    ("Querying a node or port", ("smpquery", "smpdump", "perfquery", "sminfo", "saquery",
                                 "ibroute", "dump_fts", "dump_lfts", "dump_mfts", "ibsysstat")),
    ("Following a path, finding errors", ("ibtracert", "ibping", "ibqueryerrors")),
    ("Changing a port", ("ibportstate",)),
    ("Moving data", ("pingpong", "perftest", "rping", "cmtime", "ucmatose", "udaddy", "mckey")),
    ("Channel drivers", ("nvme",)),
    ("Checking ibal", ("conformance", "demo", "lab")),
)  # fmt: skip


def group_of(name: str) -> str:
    """The heading ``name`` is listed under (commands not in :data:`GROUPS`: "Other")."""
    return next((title for title, names in GROUPS if name in names), "Other")
