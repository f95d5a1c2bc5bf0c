"""The diagnostics' lean MAD path: a :class:`~ibal.mad.rpc.MadClient` port on libibumad.

A diagnostic sends a few SMPs or PMA queries and exits; opening an access
layer for them (its providers, CA, PD and QP0/QP1 aliases) costs more than the
query, and importing :mod:`ibal.al` a large part of the command's start-up.
:class:`UmadMadPort` is the :class:`~ibal.mad.rpc.AlMadPort` interface straight
on the rdma_core provider's libibumad agents (``ibal.providers.rdma_core.umad``:
the same agents the provider's CAs hand the AL, so the same MADs on the wire),
one agent per class, answers handed to the client on the agents' receive thread.

:func:`lean_port` chooses the port as :func:`~ibal.mad.rpc.pick_port` does
(``-C`` by name or node GUID, ``-P``, else the first CA with an ACTIVE port),
among the CAs libibumad serves; ``None`` when it serves none that fits, and
the caller opens an AL instead (so its providers and its error words apply).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ibal.mad.rpc import PortId
from ibal.mad.rpc.portid import mad_addr

__all__ = ["UmadMadPort", "lean_port"]

_ACTIVE = 4


class UmadMadPort:
    """A port of a libibumad CA for the MAD client (bare agents, one per class)."""

    def __init__(self, ca_name: str, port_num: int, port_guid: int, lid: int, sm_lid: int,
                 link_layer: str) -> None:  # fmt: skip
        from ibal.providers.rdma_core import umad

        self.ca_name = ca_name
        self.port_num = port_num
        self.port_guid = port_guid
        self.lid = lid
        self.sm_lid = sm_lid
        self.link_layer = link_layer
        self._umad = umad
        self._agents_tbl = umad.agents_for(ca_name)
        self._agents: dict[int, Any] = {}
        self._on_mad: Callable[[bytes], None] | None = None
        self._on_mads: Callable[[Sequence[bytes]], None] | None = None

    def start(self, on_mad: Callable[[bytes], None]) -> None:
        self._on_mad = on_mad

    def start_batches(self, on_mads: Callable[[Sequence[bytes]], None]) -> None:
        self._on_mads = on_mads

    def _agent(self, mgmt_class: int, qp: int) -> Any:
        agent = self._agents.get(mgmt_class)
        if agent is not None:
            return agent
        from ibal.types import MadAgentSpec
        from ibal.wire.mad.consts import CLASS_VERSION

        on_mad, on_mads = self._on_mad, self._on_mads
        assert on_mad is not None
        batch = None if on_mads is None else lambda rs: on_mads([r.mad for r in rs])
        spec = MadAgentSpec(self.port_num, qp, mgmt_class, CLASS_VERSION.get(mgmt_class, 1),
                            recv_cb=lambda r: on_mad(r.mad), recv_batch_cb=batch)  # fmt: skip
        agent = self._agents[mgmt_class] = self._agents_tbl.register(spec)
        return agent

    def send(self, mad: bytes, to: PortId, qp: int, timeout_ms: int) -> None:
        from ibal.types import MadSend

        # timeout 0: the client times requests out and retries itself, as on the AL
        self._agents_tbl.send(self._agent(mad[1], qp), MadSend(mad, mad_addr(to, qp), 0))

    def send_many(self, items: Sequence[tuple[bytes, PortId, int, int, int]]) -> int:
        """As :meth:`~ibal.mad.rpc.AlMadPort.send_many`: the first item's class, in order."""
        from ibal.types import MadSend

        cls, qp0 = items[0][0][1], items[0][2]
        agent = self._agent(cls, qp0)
        sends = []
        for mad, to, qp, _timeout, _tid in items:
            if mad[1] != cls:
                break
            sends.append(MadSend(mad, mad_addr(to, qp), 0))
        return int(self._agents_tbl.send_many(agent, sends))

    def abandon(self, tid: int) -> None:
        """Nothing to undo: with time-out 0 the agents keep no state for it."""

    def close(self) -> None:
        for agent in self._agents.values():
            self._agents_tbl.unregister(agent)
        self._agents.clear()
        # under umad2sim the table parks its registrations and stays for the process
        if not self._agents_tbl.keep_open:
            self._agents_tbl.close()


def lean_port(ca_name: str | None, port_num: int | None) -> UmadMadPort | None:
    """The port :func:`~ibal.mad.rpc.pick_port` would take, from libibumad's CAs, or None."""
    from ibal.providers.rdma_core import umad

    try:
        names = umad.umad_cas()
    except umad.UmadUnavailable:
        return None
    for name in names:
        try:
            info = umad.ca_info(name)
        except Exception:  # a CA that went away or that libibumad cannot describe: the AL's
            return None
        guid = info.node_guid
        if ca_name and ca_name not in (name, f"{guid:016x}", hex(guid)):
            continue
        for p in info.ports:
            if port_num is not None and p.port_num != port_num:
                continue
            if port_num is None and p.state != _ACTIVE:
                continue
            # libibumad lists devices the kernel's ib_umad may not serve (or not to this
            # user): then the AL's provider says why (umad2sim serves every one it lists)
            if not umad.under_umad2sim() and umad.availability(name, p.port_num) is not None:
                return None
            return UmadMadPort(name, p.port_num, p.port_guid, p.lid, p.sm_lid, p.link_layer)
    return None
