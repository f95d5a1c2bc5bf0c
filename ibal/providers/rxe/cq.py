"""Completion queues of an rxe CA: a bounded FIFO with notification arming.

Arming follows the verbs rules: ``arm(solicited=False)`` fires at the next
completion, ``arm(solicited=True)`` at the next solicited or failed one
(a wider arm is never narrowed), ``arm_n(n)`` once ``n`` more completions
have been queued.  Each arm fires once.  A completion that finds the CQ full is lost
and the CQ reports ``CQ_ERROR`` once (IBA 11.4.2.1: an overrun is a CQ error).

Threading: used under the CA lock; the caller makes the upcalls.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ibal.providers.rxe.memory import Resource
from ibal.types import Wc, WcStatus

_OK = WcStatus.SUCCESS


class Cq(Resource):
    """One CQ of ``size`` entries."""

    __slots__ = ("context", "entries", "evented", "notify", "notify_n", "overrun", "size",
                 "users")

    NONE, NEXT, SOLICITED = 0, 1, 2

    def __init__(self, ca: object, size: int, context: Any) -> None:
        super().__init__(ca)
        self.size = size
        self.context = context
        self.entries: deque[Wc] = deque()
        self.users = 0
        self.notify = Cq.NONE
        self.notify_n = 0
        self.overrun = False
        self.evented = False  # its consumer has asked for a completion event

    def arm(self, solicited: bool) -> None:
        self.evented = True
        if not solicited:
            self.notify = Cq.NEXT
        elif self.notify != Cq.NEXT:
            self.notify = Cq.SOLICITED

    def arm_n(self, n: int) -> None:
        self.evented = True
        self.notify_n = n

    def add(self, wc: Wc, solicited: bool) -> tuple[bool, bool]:
        """Queue ``wc``: (the consumer must be told, the CQ just overran)."""
        entries = self.entries
        if len(entries) >= self.size:
            first = not self.overrun
            self.overrun = True
            return False, first
        entries.append(wc)
        fire = False
        n = self.notify
        if n and (n == Cq.NEXT or solicited or wc.status is not _OK):
            self.notify = Cq.NONE
            fire = True
        if self.notify_n:
            self.notify_n -= 1  # counts the new completions down to the callback
            if not self.notify_n:
                fire = True
        return fire, False

    def poll(self, max_entries: int) -> list[Wc]:
        ents = self.entries
        if max_entries >= len(ents):
            out = list(ents)
            ents.clear()
        else:
            out = [ents.popleft() for _ in range(max_entries)]
        return out

    def disarm(self) -> None:
        self.notify = Cq.NONE
        self.notify_n = 0
