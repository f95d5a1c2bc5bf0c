"""Deterministic fault injection: packet rules and verb failures.

A :class:`FaultPlan` belongs to one fabric (``fabric.faults``).  Packet rules
select packets by what they are (operation, transport, QP, port, CA, link, or
any predicate) and then by which of the matching packets they are (``nth``,
``count``, ``probability`` drawn from the fabric's seeded RNG), and drop,
delay, duplicate or corrupt them.  Verb faults make the Nth call of a named
verb raise a chosen status.  Everything is evaluated in a fixed order, so the
same seed and the same calls give the same outcome.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable
from typing import TYPE_CHECKING, Any

from ibal.providers.mock.packets import Packet, PacketOp
from ibal.status import Status, error_class, post_error
from ibal.types import QpType

if TYPE_CHECKING:
    from ibal.providers.mock.ca_state import CaState
    from ibal.providers.mock.engine_core import EngineCore
    from ibal.providers.mock.objects import MockQp
    from ibal.providers.mock.topology import Link, MockPort

PacketPredicate = Callable[[Packet], bool]

POST_VERBS = frozenset({"post_send", "post_recv", "post_srq_recv"})


def _qp_key(qp: MockQp | int) -> tuple[CaState | None, int]:
    if isinstance(qp, int):
        return (None, qp)
    return (qp.ca, qp.num)


class PacketRule:
    """One packet fault.  ``matched`` counts matching packets, ``fired`` those it hit."""

    def __init__(
        self,
        plan: FaultPlan,
        action: str,
        *,
        delay: float = 0.0,
        copies: int = 1,
        op: PacketOp | Collection[PacketOp] | None = None,
        transport: QpType | None = None,
        qp: MockQp | None = None,
        src_qp: MockQp | int | None = None,
        dst_qp: MockQp | int | None = None,
        port: MockPort | None = None,
        src_port: MockPort | None = None,
        dst_port: MockPort | None = None,
        ca: CaState | None = None,
        link: Link | None = None,
        predicate: PacketPredicate | None = None,
        nth: int | Collection[int] | None = None,
        count: int | None = None,
        probability: float | None = None,
    ) -> None:
        self._plan = plan
        self.action = action
        self.delay = delay
        self.copies = copies
        self.ops: frozenset[PacketOp] | None = (
            None if op is None else frozenset({op}) if isinstance(op, PacketOp) else frozenset(op)
        )
        self.transport = transport
        self.qp = qp
        self.src_qp = None if src_qp is None else _qp_key(src_qp)
        self.dst_qp = None if dst_qp is None else _qp_key(dst_qp)
        self.port = port
        self.src_port = src_port
        self.dst_port = dst_port
        self.ca = ca
        self.link = link
        self.predicate = predicate
        self.nth: frozenset[int] | None = (
            None if nth is None else frozenset({nth}) if isinstance(nth, int) else frozenset(nth)
        )
        self.count = count
        self.probability = probability
        self.matched = 0
        self.fired = 0
        self.active = True

    def __repr__(self) -> str:
        return f"<PacketRule {self.action} matched={self.matched} fired={self.fired}>"

    def remove(self) -> None:
        """Stop applying this rule."""
        self.active = False
        if self in self._plan.packet_rules:
            self._plan.packet_rules.remove(self)
        self._plan.sync_fabric()

    def _matches(self, pkt: Packet) -> bool:
        if self.ops is not None and pkt.op not in self.ops:
            return False
        if self.transport is not None and pkt.transport is not self.transport:
            return False
        src = (pkt.src_port.ca, pkt.src_qpn)
        dst = (pkt.dst_port.ca, pkt.dst_qpn)
        if self.qp is not None:
            key = (self.qp.ca, self.qp.num)
            if src != key and dst != key:
                return False
        if self.src_qp is not None and not _same(self.src_qp, src):
            return False
        if self.dst_qp is not None and not _same(self.dst_qp, dst):
            return False
        port = self.port
        if port is not None and port is not pkt.src_port and port is not pkt.dst_port:
            return False
        if self.src_port is not None and self.src_port is not pkt.src_port:
            return False
        if self.dst_port is not None and self.dst_port is not pkt.dst_port:
            return False
        ca = self.ca
        if ca is not None and ca is not pkt.src_port.ca and ca is not pkt.dst_port.ca:
            return False
        if self.link is not None and self.link not in pkt.route:
            return False
        return self.predicate is None or bool(self.predicate(pkt))

    def selects(self, pkt: Packet, rng: random.Random) -> bool:
        if not self.active or not self._matches(pkt):
            return False
        self.matched += 1
        if self.nth is not None and self.matched not in self.nth:
            return False
        if self.count is not None and self.fired >= self.count:
            return False
        if self.probability is not None and rng.random() >= self.probability:
            return False
        self.fired += 1
        return True


def _same(want: tuple[CaState | None, int], got: tuple[CaState, int]) -> bool:
    return want[1] == got[1] and (want[0] is None or want[0] is got[0])


class VerbFault:
    """Fail call number ``nth`` (and the ``count - 1`` after it) of ``verb``."""

    def __init__(
        self,
        plan: FaultPlan,
        verb: str,
        status: Status,
        nth: int,
        count: int,
        ca: CaState | None,
        failed_index: int,
    ) -> None:
        self._plan = plan
        self.verb = verb
        self.status = status
        self.nth = nth
        self.count = count
        self.ca = ca
        self.failed_index = failed_index
        self.calls = 0
        self.fired = 0

    def __repr__(self) -> str:
        return (
            f"<VerbFault {self.verb} -> {self.status.name} calls={self.calls} fired={self.fired}>"
        )

    def remove(self) -> None:
        if self in self._plan.verb_faults:
            self._plan.verb_faults.remove(self)
        self._plan.sync_fabric()

    def check(self, verb: str, ca: CaState) -> None:
        if verb != self.verb or (self.ca is not None and self.ca is not ca):
            return
        self.calls += 1
        if self.calls < self.nth or self.fired >= self.count:
            return
        self.fired += 1
        msg = f"injected fault: call {self.calls} of {verb}"
        if verb in POST_VERBS:
            raise post_error(self.status, self.failed_index, msg)
        raise error_class(self.status)(msg)


class FaultPlan:
    """The fault rules of one fabric; reach it as ``fabric.faults``."""

    def __init__(self, fabric: EngineCore) -> None:
        self._fabric = fabric
        self.packet_rules: list[PacketRule] = []
        self.verb_faults: list[VerbFault] = []

    def sync_fabric(self) -> None:
        self._fabric.packet_faults_armed = bool(self.packet_rules)
        self._fabric.verb_faults_armed = bool(self.verb_faults)

    def _add(self, rule: PacketRule) -> PacketRule:
        self.packet_rules.append(rule)
        self.sync_fabric()
        return rule

    # ----------------------------------------------------------------- packets
    def drop(self, **match: Any) -> PacketRule:
        """Drop matching packets (see :class:`PacketRule` for the selectors)."""
        return self._add(PacketRule(self, "drop", **match))

    def delay(self, seconds: float, **match: Any) -> PacketRule:
        """Deliver matching packets ``seconds`` later (fabric clock)."""
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        return self._add(PacketRule(self, "delay", delay=seconds, **match))

    def lag_sends(self, seconds: float, **match: Any) -> PacketRule:
        """Complete matching datagram (UD) sends ``seconds`` after they leave (fabric
        clock), as an HCA reports a send some time after it posted it; the QP's later
        sends go out meanwhile and complete behind them, in order.  Selected by the
        packet each send puts on the wire (sends answered by the port's own agents and
        sends with no route complete at once)."""
        if seconds < 0:
            raise ValueError("lag must be >= 0")
        return self._add(PacketRule(self, "lag", delay=seconds, **match))

    def send_lag(self, pkt: Packet, rng: random.Random) -> float:
        """The engine asks, for a datagram just sent: how long its completion waits."""
        lag = 0.0
        for rule in list(self.packet_rules):
            if rule.action == "lag" and rule.selects(pkt, rng):
                lag += rule.delay
        return lag

    def duplicate(self, copies: int = 1, **match: Any) -> PacketRule:
        """Deliver ``copies`` extra copies of matching packets."""
        return self._add(PacketRule(self, "duplicate", copies=copies, **match))

    def corrupt(self, **match: Any) -> PacketRule:
        """Flip a bit of matching packets; the receiver's ICRC check drops them."""
        return self._add(PacketRule(self, "corrupt", **match))

    # -------------------------------------------------------------------- verbs
    def fail_verb(
        self,
        verb: str,
        status: Status,
        *,
        nth: int = 1,
        count: int = 1,
        ca: CaState | None = None,
        failed_index: int = 0,
    ) -> VerbFault:
        """Make call ``nth`` of ``verb`` (counted from now) raise ``status``.

        Post verbs raise a :class:`~ibal.status.PostError` with ``failed_index``.
        """
        if status is Status.SUCCESS:
            raise ValueError("a verb fault needs an error status")
        fault = VerbFault(self, verb, status, nth, count, ca, failed_index)
        self.verb_faults.append(fault)
        self.sync_fabric()
        return fault

    def clear(self) -> None:
        """Remove every packet rule and verb fault."""
        for rule in self.packet_rules:
            rule.active = False
        self.packet_rules.clear()
        self.verb_faults.clear()
        self.sync_fabric()

    # ----------------------------------------------------------------- engine
    def check_verb(self, verb: str, ca: CaState) -> None:
        for fault in list(self.verb_faults):
            fault.check(verb, ca)

    def on_packet(self, pkt: Packet, rng: random.Random) -> Iterable[tuple[Packet, float]]:
        """What becomes of ``pkt``: ``(packet, delay)`` deliveries (none if dropped)."""
        delay = 0.0
        extra = 0
        corrupt = False
        counters = self._fabric.counters
        for rule in list(self.packet_rules):
            if rule.action == "lag" or not rule.selects(pkt, rng):
                continue  # a lag rule acts on the sender's completion, not the packet
            action = rule.action
            if action == "drop":
                counters.dropped_fault += 1
                counters.dropped += 1
                return ()
            if action == "delay":
                delay += rule.delay
                counters.delayed += 1
            elif action == "duplicate":
                extra += rule.copies
            else:
                corrupt = True
        out = [(pkt, delay)]
        for _ in range(extra):
            counters.duplicated += 1
            out.append((pkt.clone(), delay))
        if corrupt:
            counters.corrupted_sent += 1
            _corrupt(pkt, rng)
        return out


def _corrupt(pkt: Packet, rng: random.Random) -> None:
    """Flip one bit, after stamping the packet with the CRC of its intact form."""
    pkt.icrc = pkt.compute_icrc()
    if pkt.length and len(pkt.payload):
        data = bytearray(pkt.payload)
        bit = rng.randrange(len(data) * 8)
        data[bit >> 3] ^= 1 << (bit & 7)
        pkt.payload = bytes(data)
    else:
        pkt.psn ^= 1 << rng.randrange(24)
