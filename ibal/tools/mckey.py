"""``ibal mckey``: librdmacm's ``mckey`` (rdma-core 44) over ``ibal.cm.rdma_mcast``.

Each of ``connections`` nodes has a UD QP that joins the IP multicast group
(:func:`ibal.cm.rdma_mcast.join_multicast`).  A receiver posts ``count``
receives first and takes ``count`` datagrams per node; a sender (``-s``)
sends ``count`` datagrams of ``size`` bytes per node to the group (SEND with
immediate: its QPN), after ``delay`` seconds (mckey waits 3 s for an SM to
program the switches; here it also gives the receivers time to join).
Printed lines are mckey's, so either side interoperates with the real
``mckey`` over RoCE.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from ibal.al import AccessLayer, Ca
from ibal.cm.cma import gid_of, ip_address
from ibal.cm.rdma import port_with_gid
from ibal.tools.common import (
    ExchangeOptions,
    ExchangeResult,
    ToolError,
    close_nodes,
    run_checked,
)
from ibal.tools.udaddy import UdEnd
from ibal.types import Gid

__all__ = ["MckeyError", "MckeyOptions", "MckeyResult", "run"]


class MckeyError(ToolError):
    """A mckey run that could not complete."""


@dataclass
class MckeyOptions(ExchangeOptions):
    """``mckey -m group [-s] [-b bind] [-c connections] [-C count] [-S size]``."""

    group: str = ""
    sender: bool = False
    delay: float = 3.0
    """Seconds between the join and the first send (mckey's fixed 3)."""
    error: ClassVar[type[ToolError]] = MckeyError

    def check(self) -> None:
        super().check()
        if not self.group:
            raise MckeyError("mckey: a multicast address is needed (-m)")
        if self.delay < 0:
            raise MckeyError("the delay is not negative")


MckeyResult = ExchangeResult


def run(al: AccessLayer, opts: MckeyOptions, *, out: Callable[[str], None] = print,
        joined: Callable[[], object] = lambda: None) -> ExchangeResult:  # fmt: skip
    """One mckey run; ``joined()`` is called once every node is in the group."""
    return run_checked(opts, "mckey", lambda: _run(al, opts, out, joined))


def _run(al: AccessLayer, opts: MckeyOptions, out: Callable[[str], None],
         joined: Callable[[], object]) -> ExchangeResult:  # fmt: skip
    from ibal.cm import rdma_mcast

    out(f"mckey: starting {'client' if opts.sender else 'server'}")
    group = ip_address(opts.group)
    ca, port_num = _port(al, opts.bind)
    pd = ca.alloc_pd()
    ends: list[UdEnd] = []
    try:
        out("mckey: joining")
        members = []
        for _ in range(opts.connections):
            end = UdEnd(pd, port_num, opts.messages, opts.size, recvs=not opts.sender,
                        error=MckeyError)  # fmt: skip
            ends.append(end)
            m = rdma_mcast.join_multicast(end.qp, group, src=opts.bind)
            members.append(m)
            out(f"mckey: joined dgid: {_ntop(m.mgid)} mlid 0x{m.av.dlid:x} sl {m.av.sl}")
        joined()
        got: list[list[bytes]] = [[] for _ in ends]
        if opts.messages:
            if opts.sender:
                time.sleep(opts.delay)  # mckey's pause (see the module docstring)
                out("initiating data transfers")
                for end, m in zip(ends, members, strict=True):
                    end.send(m.av, m.qpn, m.qkey, opts.timeout)
            else:
                out("receiving data transfers")
                got = [[end.payload(w) for w in end.receive(opts.timeout)] for end in ends]
            out("data transfers complete")
        for m in members:
            m.leave()
    finally:
        close_nodes(ends, pd, ca)
    out("test complete")
    out("return status 0")
    return ExchangeResult(got)


def _ntop(gid: Gid) -> str:
    """A GID as ``inet_ntop`` writes it (an IPv4-mapped one in dotted form)."""
    v4 = gid.ipv4_mapped
    return f"::ffff:{v4}" if v4 is not None else str(gid)


def _port(al: AccessLayer, bind: str | None) -> tuple[Ca, int]:
    """The CA and port the nodes live on: the one with the bind address, else the first
    active RoCE port (the group's datagrams leave by its first address of the group's
    IP version)."""
    from ibal.cm import rdma

    if bind is not None:
        guid, port_num = port_with_gid(al, gid_of(ip_address(bind)), MckeyError)
        return al.open_ca(guid), port_num
    ports = rdma.roce_ports(al)
    if not ports:
        raise MckeyError("mckey: no active RoCE port")
    guid, port = ports[0]
    return al.open_ca(guid), port.port_num
