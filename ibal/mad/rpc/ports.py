"""The client's ports on the AL: :class:`AlMadPort` (bare MAD agents on the QP0/QP1
aliases, one per class), :class:`ServiceMadPort` (the MAD service), and
:func:`pick_port`, the port the tools use."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from ibal.mad.rpc.portid import PortId, mad_addr
from ibal.mad.rpc.request import MadError
from ibal.status import IbError

__all__ = ["VIAS", "AlMadPort", "ServiceMadPort", "pick_port"]


@dataclass
class AlMadPort:
    """A port of an open AL CA, through its QP0/QP1 alias QPs and one agent per class.

    ``ca``/``port_num`` as :func:`pick_port` chose them; the CA is closed by
    :meth:`close` only if ``owns_ca``.
    """

    ca: Any
    port_num: int
    port_guid: int
    lid: int
    sm_lid: int
    owns_ca: bool = True
    _pd: Any = None
    _aliases: dict[int, Any] = field(default_factory=dict)
    _agents: dict[int, Any] = field(default_factory=dict)
    _on_mad: Callable[[bytes], None] | None = None
    _transport_waits: bool = False
    _on_mads: Callable[[Sequence[bytes]], None] | None = None

    def start(self, on_mad: Callable[[bytes], None]) -> None:
        self._on_mad = on_mad
        self._pd = self.ca.alloc_pd()
        self._transport_waits = not self.ca.capabilities.mad_agents

    def start_batches(self, on_mads: Callable[[Sequence[bytes]], None]) -> None:
        """Optional for a :class:`MadPort`: MADs the provider reads together come to
        ``on_mads`` in one call (instead of ``on_mad`` each); call before the first send."""
        self._on_mads = on_mads

    def _agent(self, mgmt_class: int, qp: int) -> Any:
        agent = self._agents.get(mgmt_class)
        if agent is not None:
            return agent
        from ibal.types import QpType
        from ibal.wire.mad.consts import CLASS_VERSION

        alias = self._aliases.get(qp)
        if alias is None:
            kind = QpType.QP0_ALIAS if qp == 0 else QpType.QP1_ALIAS
            alias = self._aliases[qp] = self._pd.get_spl_qp(self.port_guid, kind)
        on_mad = self._on_mad
        assert on_mad is not None

        def recv(r: Any) -> None:
            on_mad(r.mad)

        on_mads = self._on_mads
        batch = None if on_mads is None else lambda rs: on_mads([r.mad for r in rs])
        # inline: ``recv`` only queues (or the client's drive() handles the answers, without
        # blocking), so it runs on the provider's thread: no thread crossing per MAD
        agent = alias.register_agent(
            mgmt_class, CLASS_VERSION.get(mgmt_class, 1), recv_cb=recv, inline=True,
            recv_batch_cb=batch,
        )  # fmt: skip
        self._agents[mgmt_class] = agent
        return agent

    def send(self, mad: bytes, to: PortId, qp: int, timeout_ms: int) -> None:
        from ibal.types import MadSend

        agent = self._agent(mad[1], qp)
        # timeout_ms 0 for the transport: the client times requests out itself (a
        # waiting transport would refuse a TID it still waits for, and umad2sim
        # never ends the wait); special-QP transports then drop the answer, so
        # there the transport's own wait is kept (one try; the client retries).
        agent.send(MadSend(mad, mad_addr(to, qp), timeout_ms if self._transport_waits else 0))

    def send_many(self, items: Sequence[tuple[bytes, PortId, int, int, int]]) -> int:
        """Send ``(mad, to, qp, timeout_ms, ...)`` items in order through one
        :meth:`~ibal.al.MadAgent.send_many` (those of the first item's class): how many
        were sent; raises as :meth:`send` only when the first could not be."""
        from ibal.types import MadSend

        first = items[0][0]
        cls, qp0 = first[1], items[0][2]
        agent = self._agent(cls, qp0)
        waits = self._transport_waits
        sends = []
        for mad, to, qp, timeout_ms, _tid in items:
            if mad[1] != cls:
                break
            sends.append(MadSend(mad, mad_addr(to, qp), timeout_ms if waits else 0))
        return int(agent.send_many(sends))

    def abandon(self, tid: int) -> None:
        """Nothing to undo: with ``timeout_ms`` 0 the transport keeps no state for it."""

    def close(self) -> None:
        for agent in self._agents.values():
            agent.deregister(wait=True)
        self._agents.clear()
        for alias in self._aliases.values():
            alias.destroy(wait=True)
        self._aliases.clear()
        if self._pd is not None:
            self._pd.dealloc(wait=True)
            self._pd = None
        if self.owns_ca:
            self.ca.close(wait=True)


@dataclass
class ServiceMadPort(AlMadPort):
    """The same port through the MAD service (:func:`ibal.mad.reg_mad_svc`), one per class.

    Each request is a pool element sent with ``resp_expected`` (the service links
    the response to it); the client's time-out cancels an element it gave up,
    since under umad2sim the transport would wait for it for ever.
    """

    _sent: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # TID low -> (svc, elem)

    def _agent(self, mgmt_class: int, qp: int) -> Any:
        service = self._agents.get(mgmt_class)
        if service is not None:
            return service
        from ibal.mad import reg_mad_svc
        from ibal.mad.svc import MadSvc
        from ibal.types import QpType
        from ibal.wire.mad.consts import CLASS_VERSION

        alias = self._aliases.get(qp)
        if alias is None:
            kind = QpType.QP0_ALIAS if qp == 0 else QpType.QP1_ALIAS
            alias = self._aliases[qp] = self._pd.get_spl_qp(self.port_guid, kind)
        svc = MadSvc(mgmt_class, CLASS_VERSION.get(mgmt_class, 1), recv_cb=self._recv,
                     send_cb=self._done)  # fmt: skip
        service = self._agents[mgmt_class] = reg_mad_svc(alias, svc)
        return service

    def _recv(self, e: Any) -> None:
        from ibal.mad import put_mad

        on_mad = self._on_mad
        assert on_mad is not None
        on_mad(bytes(e.mad))
        put_mad(e)

    def _done(self, e: Any) -> None:
        from ibal.mad import put_mad

        self._sent.pop(int.from_bytes(e.mad[12:16], "big"), None)
        put_mad(e)

    def send(self, mad: bytes, to: PortId, qp: int, timeout_ms: int) -> None:
        service = self._agent(mad[1], qp)
        e = service.pool_key.get_mad()
        e.mad[:] = mad
        e.addr = mad_addr(to, qp)
        e.resp_expected, e.timeout_ms, e.retry_cnt = True, timeout_ms, 0
        tid = int.from_bytes(mad[12:16], "big")
        self._sent[tid] = (service, e)
        try:
            service.send(e)
        except BaseException:
            self._sent.pop(tid, None)
            raise

    def send_many(self, items: Sequence[tuple[bytes, PortId, int, int, int]]) -> int:
        """One pool element per MAD, as :meth:`send` (the service sends one at a time)."""
        for n, (mad, to, qp, timeout_ms, *_) in enumerate(items):
            try:
                self.send(mad, to, qp, timeout_ms)
            except IbError:
                if n == 0:
                    raise
                return n
        return len(items)

    def abandon(self, tid: int) -> None:
        from ibal.status import NotFound

        got = self._sent.get(tid)
        if got is not None:
            with contextlib.suppress(NotFound):
                got[0].cancel(got[1])

    def close(self) -> None:
        for service in self._agents.values():
            service.deregister(wait=True)
        self._agents.clear()
        super().close()


VIAS: Final = ("service", "agent")


def pick_port(
    al: Any, ca_name: str | None = None, port_num: int | None = None, *, via: str = "service"
) -> AlMadPort:
    """The port the tools use: ``-C``/``-P``, else the first CA with an ACTIVE port.

    ``ca_name`` matches a CA's name or its GUID (hex).  ``via``: ``"service"``
    (the MAD service, :class:`ServiceMadPort`) or ``"agent"`` (the AL's bare
    MAD agents, :class:`AlMadPort`).  ``MadError`` if no port fits.
    """
    if via not in VIAS:
        raise ValueError(f"via must be one of {VIAS}")
    kind = ServiceMadPort if via == "service" else AlMadPort
    from ibal.types import LinkState

    seen: list[str] = []
    for guid in al.get_ca_guids():
        ca = al.open_ca(guid)
        keep = False
        try:
            if ca_name and ca_name not in (ca.name, f"{guid:016x}", hex(guid)):
                continue
            attr = ca.query()
            ports: Sequence[Any] = attr.ports
            for p in ports:
                seen.append(f"{ca.name}/{p.port_num} {p.link_state.name}")
                if port_num is not None and p.port_num != port_num:
                    continue
                if port_num is None and p.link_state is not LinkState.ACTIVE:
                    continue
                keep = True
                return kind(ca, p.port_num, p.port_guid, p.lid, p.sm_lid)
        finally:
            if not keep:
                ca.close(wait=True)
    want = f"CA {ca_name}" if ca_name else "a CA"
    if port_num is not None:
        want += f" port {port_num}"
    raise MadError(f"no {want} with an active port (seen: {', '.join(seen) or 'no CA'})")
