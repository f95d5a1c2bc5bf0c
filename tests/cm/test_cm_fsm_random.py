"""ibal.cm.fsm under random event sequences.

Invariants checked after every event: received messages, timers and QP/stale/destroy
events never raise; API calls raise only InvalidState/Unsupported and then change
nothing; every transition taken is a table row; the QP is failed at most once; no
upcall follows Destroy; nothing but drops follows Release; the timer the machine
reports is the one its actions armed.  A seeded walk that mostly picks events the
state has rows for must also reach every row (so the table has no dead rows).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from hypothesis import given, settings
from hypothesis import strategies as st

from ibal.cm.fsm import (
    LAP_TRANSITIONS,
    TRANSITIONS,
    ApiEvent,
    ArmTimer,
    CancelTimer,
    Cep,
    CmState,
    Deliver,
    Destroy,
    Drop,
    Event,
    ModifyQp,
    QpEstablished,
    RecvMsg,
    Release,
    SendApr,
    SendDrep,
    SendDreq,
    SendLap,
    SendMra,
    SendRej,
    SendRep,
    SendReq,
    SendRtu,
    StaleConn,
    TimerFired,
)
from ibal.status import InvalidState, Unsupported
from ibal.types import QpState
from ibal.wire.mad import cm
from ibal.wire.mad.cm import CmAttr, MessageMraed, RejReason

T = TypeVar("T")
Choose = Callable[[Sequence[T]], T]

ME, PEER = 0x100, 0x200
ROWS = {(a, t, b) for a, t, b, _ in TRANSITIONS} | {(a, t, b) for a, t, b, _ in LAP_TRANSITIONS}
CONN_ATTRS = [a for a in cm.TABLES if a not in (CmAttr.SIDR_REQ, CmAttr.SIDR_REP)]
API_KINDS = ["REQ", "REP", "RTU", "REJ", "MRA", "DREQ", "DREP", "LAP", "APR"]


def _msg(attr: CmAttr, **kw: Any) -> bytes:
    return cm.TABLES[attr].encode({k: v for k, v in kw.items() if k in cm.TABLES[attr].by_name})


def received(choose: Choose[Any], attr: CmAttr | None = None,
             mraed: MessageMraed | None = None) -> RecvMsg:  # fmt: skip
    """A message from the peer: mostly well addressed (so runs get far), sometimes not."""
    attr = attr or choose(CONN_ATTRS)
    mraeds = list(MessageMraed) + ([mraed] * 8 if mraed is not None else [])
    reasons = [RejReason.STALE_CONN] * len(RejReason) + list(RejReason)
    raw = _msg(
        attr, local_comm_id=choose([PEER] * 7 + [0x999]),
        remote_comm_id=choose([ME] * 7 + [0]), local_ca_guid=choose([1, 3]),
        local_qpn=choose([5, 7]), remote_qpn=choose([6, 6, 5]), reason=choose(reasons),
        message_mraed=choose(mraeds), message_rejected=choose(list(MessageMraed)),
        service_timeout=choose(range(32)), primary_local_ack_timeout=choose(range(32)),
    )  # fmt: skip
    return RecvMsg(attr, raw, cm.TABLES[attr].decode(raw))


def api(kind: str, retries: int) -> ApiEvent:
    """An API call carrying a message of this endpoint (local CA GUID 2, QPN 6)."""
    base = {"local_comm_id": ME, "remote_comm_id": PEER, "local_ca_guid": 2, "local_qpn": 6,
            "reason": RejReason.CONSUMER_DEFINED}  # fmt: skip
    m = {k: _msg(CmAttr[k], **base) for k in API_KINDS}
    return {
        "REQ": SendReq(m["REQ"], 100, retries, peer_to_peer=retries % 2 == 1),
        "REP": SendRep(m["REP"], 100, retries), "RTU": SendRtu(m["RTU"]),
        "REJ": SendRej(m["REJ"]), "MRA": SendMra(m["MRA"]),
        "DREQ": SendDreq(m["DREQ"], 100, retries), "DREP": SendDrep(m["DREP"]),
        "LAP": SendLap(m["LAP"], 100, retries), "APR": SendApr(m["APR"]),
    }[kind]  # fmt: skip


def anything(choose: Choose[Any]) -> Event | str:
    kind = choose(["recv", "api", "other", "timer", "old timer"])
    if kind == "recv":
        return received(choose)
    if kind == "api":
        return api(choose(API_KINDS), choose(range(4)))
    if kind == "other":
        return choose([QpEstablished(), StaleConn(), Destroy()])
    return "timer" if kind == "timer" else TimerFired(choose(range(6)))


def _rows_by_key(cep: Cep) -> dict[str, list[tuple[Any, str, Any]]]:
    """The table rows open to the endpoint now, by trigger key."""
    out: dict[str, list[tuple[Any, str, Any]]] = {}
    for table, cur in ((TRANSITIONS, cep.state), (LAP_TRANSITIONS, cep.lap_state)):
        if table is LAP_TRANSITIONS and cep.state is not CmState.ESTABLISHED:
            continue
        for a, t, b, _ in table:
            if a is cur:
                out.setdefault(t.partition(" / ")[0], []).append((a, t, b))
    return out


def guided(choose: Choose[Any], cep: Cep, visits: Counter[Any] | None = None) -> Event | str:
    """Mostly an event the state has a row for, sometimes anything.

    With ``visits`` (rows taken so far) half the picks go to the key whose rows
    were taken least, so rare corners get reached without very long runs.
    """
    rows = _rows_by_key(cep)
    if not rows or choose(range(10)) == 9:
        return anything(choose)
    keys = sorted(rows)
    if visits is not None and choose(range(2)) == 0:
        key = min(keys, key=lambda k: (min(visits[r] for r in rows[k]), k))
    else:
        main = [k for k in keys if k not in ("stale", "destroy")] or keys
        key = choose(main) if choose(range(10)) < 9 else choose(keys)
    verb, _, what = key.partition(" ")
    if key == "timeout":
        return "timer"
    if key in ("QP established", "stale", "destroy"):
        return {"QP established": QpEstablished(), "stale": StaleConn(),
                "destroy": Destroy()}[key]  # fmt: skip
    if verb == "send":
        return api(what, choose(range(4)))
    mraed = {CmState.REQ_SENT: MessageMraed.REQ, CmState.REP_SENT: MessageMraed.REP,
             CmState.ESTABLISHED: MessageMraed.LAP}.get(cep.state)  # fmt: skip
    return received(choose, CmAttr[what], mraed)


class Walk:
    """Feeds one Cep and checks the invariants after each event."""

    def __init__(self, is_active: bool) -> None:
        self.cep = Cep(ME, active=is_active, now=0.0)
        self.now = 0.0
        self.armed: ArmTimer | None = None
        self.failed_qp = self.released = self.muted = False
        self.seen: set[tuple[Any, str, Any]] = set()

    def feed(self, ev: Event | str) -> None:
        cep = self.cep
        if ev == "timer":
            if self.armed is None:
                return
            self.now, ev = max(self.now, self.armed.at), TimerFired(self.armed.generation)
        else:
            self.now += 0.01
        assert not isinstance(ev, str)
        if isinstance(ev, TimerFired) and self.armed and ev.generation == self.armed.generation:
            self.armed = None  # delivered: it is spent unless the machine arms again
        before = (cep.state, cep.lap_state)
        try:
            acts = cep.handle(ev, self.now)
        except (InvalidState, Unsupported):
            assert isinstance(ev, ApiEvent)
            assert (cep.state, cep.lap_state) == before
            return
        if cep.last_transition is not None:
            assert cep.last_transition in ROWS
            self.seen.add(cep.last_transition)
            cep.last_transition = None
        if self.released:
            assert all(isinstance(a, Drop) for a in acts), acts
        self.muted = self.muted or isinstance(ev, Destroy)
        for a in acts:
            if isinstance(a, ArmTimer):
                self.armed = a
            elif isinstance(a, CancelTimer | Release):
                self.armed = None
            if a == ModifyQp(QpState.ERROR):
                assert not self.failed_qp, "QP failed twice"
                self.failed_qp = True
            assert not (self.muted and isinstance(a, Deliver)), "upcall after destroy"
            self.released = self.released or isinstance(a, Release)
        assert (cep.state is CmState.CLOSED) == self.released
        if self.armed is not None:
            assert (cep.timer_at, cep.generation) == (self.armed.at, self.armed.generation)
        else:
            assert cep.timer_at is None


@settings(max_examples=200, deadline=None)
@given(st.booleans(), st.data())
def test_hypothesis_sequences_keep_the_machine_sound(is_active: bool, data: st.DataObject) -> None:
    def choose(xs: Sequence[Any]) -> Any:
        return data.draw(st.sampled_from(xs))

    walk = Walk(is_active)
    for _ in range(data.draw(st.integers(1, 30))):
        walk.feed(guided(choose, walk.cep))


def test_seeded_walks_stay_sound_and_reach_every_row() -> None:
    rng = random.Random(11)
    visits: Counter[Any] = Counter()
    for n in range(20000):
        walk = Walk(is_active=n % 2 == 0)
        for _ in range(40):
            walk.feed(guided(rng.choice, walk.cep, visits))
            visits.update(walk.seen)
            walk.seen.clear()
            if walk.released and rng.random() < 0.5:
                break  # a few more events after Release check nothing follows it
    missing = ROWS - set(visits)
    assert not missing, sorted(f"{a.value} --{t}--> {b.value}" for a, t, b in missing)
