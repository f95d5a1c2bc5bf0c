"""A flood of unsolicited MADs at a MAD service through a transport, for a guest or probe.

:func:`flood`: three services of one class on one port's QP1 alias, talking
to that port itself: the target serves Get with a small ``max_unsolicited``
and keeps every MAD it gets; it asks the responder (which serves Set) a
question; the flooder sends ``FLOOD`` Gets at the target in chunks, and
halfway through the responder answers.  Returns what the target held, what it
dropped, and the answer to its question.  ``mad_service_guest.py`` runs it
over libibumad on kernel rxe; ibsim cannot (it hands unsolicited QP0/QP1
requests only to the SM's client).
"""

from __future__ import annotations

import contextlib
import queue
import time
from collections.abc import Callable
from typing import Any

GET, SET, GET_RESP = 0x01, 0x02, 0x81
BOUND, FLOOD, CHUNK = 16, 400, 16
WAIT = 60.0


def flood(alias: Any, me: Any, mgmt_class: int) -> dict[str, object]:
    """Run the flood on ``alias`` (a QP1 alias) towards ``me`` (its own port's address)."""
    from ibal.mad import MadElement, MadSvc, put_mad, reg_mad_svc

    held: queue.Queue[MadElement] = queue.Queue()
    t_sent: queue.Queue[MadElement] = queue.Queue()
    questions: queue.Queue[MadElement] = queue.Queue()
    f_sent: queue.Queue[MadElement] = queue.Queue()
    target = reg_mad_svc(alias, MadSvc(mgmt_class, 1, held.put, t_sent.put,
                                       methods=frozenset({GET}), support_unsol=True,
                                       max_unsolicited=BOUND))  # fmt: skip
    responder = reg_mad_svc(alias, MadSvc(mgmt_class, 1, questions.put, put_mad,
                                          methods=frozenset({SET}),
                                          support_unsol=True))  # fmt: skip
    flooder = reg_mad_svc(alias, MadSvc(mgmt_class, 1, put_mad, f_sent.put))

    req = target.pool_key.get_mad()
    req.mad[0:4] = bytes([1, mgmt_class, 1, SET])
    req.mad[24:37] = b"while flooded"
    req.addr, req.resp_expected, req.timeout_ms, req.retry_cnt = me, True, 120_000, 0
    target.send(req)
    question = questions.get(timeout=WAIT)

    got: list[MadElement] = []

    def accounted() -> int:
        while not held.empty():
            got.append(held.get_nowait())
        return len([e for e in got if e.request is None]) + target.stats["dropped_backlog"]

    def until(cond: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: target {target.all_stats()}")
            with contextlib.suppress(queue.Empty):  # wait on a delivery, not a fixed sleep
                got.append(held.get(timeout=0.5))

    elems = [flooder.pool_key.get_mad() for _ in range(CHUNK)]
    sent = 0
    answered = False
    while sent < FLOOD:
        for e in elems:
            e.mad[:] = bytes(len(e.mad))
            e.mad[0:4] = bytes([1, mgmt_class, 1, GET])
            e.mad[24:29] = b"flood"
            e.addr = me
        flooder.send(elems)
        for _ in elems:
            assert f_sent.get(timeout=WAIT).status.name == "SUCCESS"
        sent += CHUNK
        if not answered and sent >= FLOOD // 2:  # halfway: the answer goes out
            answered = True
            question.mad[3] = GET_RESP
            question.mad[24:30] = b"answer"
            responder.send(question)
        until(lambda s=sent: accounted() >= s, f"{sent} flood MADs at the target")
    until(lambda: any(e.request is req for e in got), "the answer at the target")
    answer = next(e for e in got if e.request is req)
    out = {
        "sent": sent,
        "answer": bytes(answer.mad[24:30]).decode(),
        # the low half: the kernel writes the high half of a request's TID on the wire only
        "answer_tid_matches": answer.tid & 0xFFFFFFFF == req.tid & 0xFFFFFFFF,
        "request_status": t_sent.get(timeout=WAIT).status.name,
        "held_unsolicited": len([e for e in got if e.request is None]),
        "dropped_backlog": target.stats["dropped_backlog"],
        "bound": BOUND,
    }
    put_mad([*got, req, *elems])
    for svc in (flooder, responder, target):
        svc.deregister(wait=True)
    return out
