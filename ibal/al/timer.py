"""The access layer's timer service: one per manager, against an injectable clock.

MAD retries, RMPP windows, CM timers and SA lease renewals all schedule here::

    t = al.timers.call_later(0.5, retry, mad, owner=self)
    t.reschedule(1.0)     # push the deadline out (also re-arms a fired timer)
    t.cancel()            # True: the callback will not run

Expired callbacks never run on the timer thread: they are handed to the
service's ``post`` (the manager's misc callback queue), where ``call_user``
isolates what they raise.  ``cancel()`` returning ``True`` means the callback
will not start, even if it was already handed to ``post``.

Clocks (:mod:`ibal.clock`): on a :class:`~ibal.clock.MonotonicClock` (or any
real-time clock) one lazily started thread serves every timer of the
manager; on a :class:`~ibal.clock.ManualClock` there is no thread: the service
is a listener of the clock and ``clock.advance()`` posts due callbacks in
time order, interleaved with a mock fabric sharing the clock.

Ownership: a timer carries an ``owner`` (any hashable object, usually the
dependent object that armed it) and a scope (``al.timers`` is a scope per AL
instance).  A dependent object cancels its timers on destroy with
``al.timers.cancel_owner(self)`` (or by keeping and cancelling its
:class:`Timer`); ``al.close()`` closes the AL's scope, cancelling every timer
armed through it, and a closed scope refuses new timers (``InvalidState``).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Hashable
from typing import Any

from ibal.al.dispatcher import call_user, log
from ibal.clock import Clock, ManualClock, MonotonicClock
from ibal.status import InvalidParameter, InvalidState

Post = Callable[..., None]
"""``post(fn, *args)``: queue ``fn(*args)`` on a callback thread; never blocks."""

_PENDING, _POSTED, _RUNNING, _DONE, _CANCELLED = range(5)


class Timer:
    """One scheduled callback; made by :meth:`TimerService.call_later`."""

    __slots__ = ("_args", "_due", "_fn", "_gen", "_scope", "_state", "_svc", "owner")

    def __init__(
        self,
        svc: TimerService,
        scope: TimerScope | None,
        fn: Callable[..., object],
        args: tuple[Any, ...],
        owner: Hashable | None,
    ) -> None:
        self._svc = svc
        self._scope = scope
        self._fn = fn
        self._args = args
        self.owner = owner
        self._due = 0.0
        self._gen = 0
        self._state = _DONE

    def __repr__(self) -> str:
        state = ("pending", "posted", "running", "done", "cancelled")[self._state]
        return f"<Timer {getattr(self._fn, '__qualname__', self._fn)} {state} due={self._due:.6f}>"

    @property
    def due(self) -> float | None:
        """The clock time it fires at, while pending; ``None`` once fired or cancelled."""
        return self._due if self._state == _PENDING else None

    @property
    def pending(self) -> bool:
        """Armed and not yet handed to ``post``."""
        return self._state == _PENDING

    @property
    def cancelled(self) -> bool:
        return self._state == _CANCELLED

    def cancel(self) -> bool:
        """Disarm; ``True`` if that kept the callback from running (idempotent)."""
        return self._svc._cancel(self)

    def reschedule(self, delay: float) -> None:
        """Fire ``delay`` seconds from now instead (re-arms a fired or cancelled timer)."""
        self._svc._arm(self, self._svc.clock.now() + _delay(delay))


def _delay(delay: object) -> float:
    if isinstance(delay, bool) or not isinstance(delay, int | float) or delay != delay:
        raise InvalidParameter(f"a delay is a number of seconds, not {delay!r}")
    if delay < 0:
        raise InvalidParameter(f"a delay cannot be negative ({delay!r} s)")
    return float(delay)


class TimerService:
    """Timers of one manager: a heap, one thread (real clock) or a clock listener (manual).

    Thread-safe: arm, cancel and reschedule from any thread, including from
    inside a timer's own callback.
    """

    def __init__(self, post: Post, clock: Clock | None = None, *, name: str = "ibal-timer") -> None:
        if not callable(post):
            raise InvalidParameter("post must be callable")
        clock = MonotonicClock() if clock is None else clock
        if not isinstance(clock, Clock):
            raise InvalidParameter(f"{clock!r} is not a Clock (it needs now())")
        self.clock: Clock = clock
        self._post = post
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._heap: list[tuple[float, int, int, Timer]] = []
        self._seq = itertools.count()
        self._owned: dict[Hashable, dict[Timer, None]] = {}
        self._stale = 0  # heap entries of cancelled or re-armed timers, skipped lazily
        self._thread: threading.Thread | None = None
        self._closed = False
        self._manual = isinstance(clock, ManualClock)
        if isinstance(clock, ManualClock):
            clock.attach(self)

    def __repr__(self) -> str:
        return f"<TimerService {self._name} {len(self._heap)} queued clock={self.clock!r}>"

    @property
    def post(self) -> Post:
        """Where expired callbacks go (the seam to the manager's callback queues)."""
        return self._post

    def set_post(self, post: Post) -> None:
        """Hand expired callbacks to ``post`` from now on."""
        if not callable(post):
            raise InvalidParameter("post must be callable")
        self._post = post

    # ------------------------------------------------------------------ public
    def call_later(
        self, delay: float, fn: Callable[..., object], *args: Any, owner: Hashable | None = None
    ) -> Timer:
        """Run ``fn(*args)`` (through ``post``) ``delay`` seconds from now."""
        return self._new(None, self.clock.now() + _delay(delay), fn, args, owner)

    def call_at(
        self, when: float, fn: Callable[..., object], *args: Any, owner: Hashable | None = None
    ) -> Timer:
        """Run ``fn(*args)`` at clock time ``when`` (at once, if that has passed)."""
        return self._new(None, float(when), fn, args, owner)

    def cancel_owner(self, owner: Hashable) -> int:
        """Cancel every timer of ``owner``; returns how many were stopped."""
        with self._cond:
            timers = list(self._owned.get(owner, ()))
        return sum(self._cancel(t) for t in timers)

    def scope(self) -> TimerScope:
        """A group of timers cancelled together by ``close()`` (one per AL instance)."""
        return TimerScope(self)

    def close(self) -> None:
        """Cancel everything and end the thread; later arms raise ``InvalidState``."""
        with self._cond:
            self._closed = True
            timers = [e[3] for e in self._heap]
            self._cond.notify_all()
            thread = self._thread
        for t in timers:
            self._cancel(t)
        if isinstance(self.clock, ManualClock):
            self.clock.detach(self)
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def __len__(self) -> int:
        """Timers armed and not yet fired."""
        with self._cond:
            return len(self._heap) - self._stale

    # ------------------------------------------------------------------ internals
    def _new(
        self,
        scope: TimerScope | None,
        when: float,
        fn: Callable[..., object],
        args: tuple[Any, ...],
        owner: Hashable | None,
    ) -> Timer:
        if not callable(fn):
            raise InvalidParameter("the timer callback must be callable")
        if owner is not None and not isinstance(owner, Hashable):
            raise InvalidParameter("a timer owner must be hashable")
        timer = Timer(self, scope, fn, args, owner)
        self._arm(timer, when)
        return timer

    def _arm(self, timer: Timer, when: float) -> None:
        with self._cond:
            if self._closed or (timer._scope is not None and timer._scope._closed):
                raise InvalidState("the timer service (or its AL) is closed")
            if timer._state == _PENDING:
                self._stale += 1
            timer._gen += 1
            timer._due = when
            timer._state = _PENDING
            for key in (timer.owner, timer._scope):
                if key is not None:
                    self._owned.setdefault(key, {})[timer] = None
            first = not self._heap or when < self._heap[0][0]
            heapq.heappush(self._heap, (when, next(self._seq), timer._gen, timer))
            if self._manual:
                return
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            elif first:
                self._cond.notify()

    def _forget(self, timer: Timer) -> None:
        """Drop ``timer`` from the owner/scope index (lock held)."""
        for key in (timer.owner, timer._scope):
            if key is not None:
                group = self._owned.get(key)
                if group is not None:
                    group.pop(timer, None)
                    if not group:
                        del self._owned[key]

    def _cancel(self, timer: Timer) -> bool:
        with self._cond:
            if timer._state not in (_PENDING, _POSTED):
                return False
            if timer._state == _PENDING:
                self._stale += 1
            timer._state = _CANCELLED
            timer._gen += 1
            self._forget(timer)
            heap = self._heap
            if self._stale > 64 and 2 * self._stale >= len(heap):  # mostly dead: compact
                self._heap = [e for e in heap if e[3]._gen == e[2]]
                heapq.heapify(self._heap)
                self._stale = 0
            return True

    def _take_due(self, now: float) -> list[tuple[Timer, int]]:
        """Pop every live timer due at ``now`` (lock held), in deadline order."""
        heap = self._heap
        out = []
        while heap and heap[0][0] <= now:
            _, _, gen, timer = heapq.heappop(heap)
            if timer._gen == gen and timer._state == _PENDING:
                timer._state = _POSTED
                out.append((timer, gen))
            else:
                self._stale -= 1
        return out

    def _hand_off(self, due: list[tuple[Timer, int]]) -> None:
        post = self._post
        for timer, gen in due:
            try:
                post(self._run, timer, gen)
            except Exception:  # a dead queue must not kill the timer thread
                log.exception("ibal: posting timer %r failed", timer)

    def _run(self, timer: Timer, gen: int) -> None:
        """On the callback thread: run the callback unless cancelled or re-armed meanwhile."""
        with self._cond:
            if timer._gen != gen or timer._state != _POSTED:
                return
            timer._state = _RUNNING
        try:
            call_user(timer._fn, *timer._args)
        finally:
            with self._cond:
                if timer._gen == gen:
                    timer._state = _DONE
                    self._forget(timer)

    def _loop(self) -> None:
        clock = self.clock
        while True:
            with self._cond:
                if self._closed:
                    return
                now = clock.now()
                due = self._take_due(now)
                if not due:
                    wait = self._heap[0][0] - now if self._heap else None
                    self._cond.wait(wait)
                    continue
            self._hand_off(due)

    # ------------------------------------------------------------------ ClockListener
    def clock_deadline(self) -> float | None:
        with self._cond:
            heap = self._heap
            while heap and (heap[0][3]._gen != heap[0][2] or heap[0][3]._state != _PENDING):
                heapq.heappop(heap)
                self._stale -= 1
            return heap[0][0] if heap else None

    def clock_run(self, now: float) -> None:
        with self._cond:
            due = self._take_due(now)
        self._hand_off(due)


class TimerScope:
    """Timers armed through it die with it: ``al.timers`` for one AL instance."""

    def __init__(self, svc: TimerService) -> None:
        self._svc = svc
        self._closed = False

    @property
    def clock(self) -> Clock:
        return self._svc.clock

    def call_later(
        self, delay: float, fn: Callable[..., object], *args: Any, owner: Hashable | None = None
    ) -> Timer:
        """:meth:`TimerService.call_later`, cancelled when the scope closes."""
        svc = self._svc
        return svc._new(self, svc.clock.now() + _delay(delay), fn, args, owner)

    def call_at(
        self, when: float, fn: Callable[..., object], *args: Any, owner: Hashable | None = None
    ) -> Timer:
        return self._svc._new(self, float(when), fn, args, owner)

    def cancel_owner(self, owner: Hashable) -> int:
        """Cancel every timer of ``owner`` (armed through any scope)."""
        return self._svc.cancel_owner(owner)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> int:
        """Cancel every timer of this scope and refuse new ones; returns how many."""
        with self._svc._cond:
            self._closed = True
        return self._svc.cancel_owner(self)

    def __len__(self) -> int:
        with self._svc._cond:
            return len(self._svc._owned.get(self, ()))
