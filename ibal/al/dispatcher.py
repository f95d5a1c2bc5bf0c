"""The access layer's callback queues: four single-consumer FIFO threads per manager.

Providers upcall from any thread, even from inside ``post_send``; consumer
code must never run on that stack (nor on the caller's).  Every callback is
therefore queued and run by a queue thread.  A manager has four, so that a
callback of one kind may wait for a callback of another kind (IBAL's
``AL_OBJ``/``AL_MISC``/``AL_PNP`` async queues, plus completions apart):

* ``completion``: CQ completion callbacks (and ``poll_async`` wake-ups);
* ``misc``: async-event callbacks, the port bookkeeping behind PnP, callbacks
  of dependent objects, and work upper layers post (MAD, CM, queries, timers);
* ``pnp``: PnP callbacks, then the teardown of a withdrawn CA;
* ``teardown``: destroy callbacks (and the wake-up of ``wait=True`` destroys).

Each queue runs its items one at a time in FIFO order.  A wait that depends on
the very queue (or callback) it runs on raises ``InvalidState`` instead of
deadlocking; every other wait returns (see ``docs/architecture.md``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from ibal.status import InvalidState

log = logging.getLogger("ibal.al")

_tls = threading.local()


def current_queue() -> CallbackQueue | None:
    """The AL callback queue whose thread this is, or ``None``."""
    q: CallbackQueue | None = getattr(_tls, "queue", None)
    return q


def in_callback() -> bool:
    """True on any AL callback-queue thread (of any manager)."""
    return getattr(_tls, "queue", None) is not None


def held() -> list[Any]:
    """The objects whose callbacks run on this thread right now (innermost last).

    Each holds a "callback" reference until its callback returns, so a wait for
    their destroy from this thread would never end.  Empty off the queue threads.
    """
    out: list[Any] | None = getattr(_tls, "held", None)
    return [] if out is None else out


_Item = tuple[Callable[..., Any], tuple[Any, ...]]


class CallbackQueue:
    """A daemon thread draining a FIFO of ``(function, args)`` items.

    ``post`` is safe from any thread, never blocks and never runs the item on
    the caller's stack.  An item that raises is logged; the queue goes on.
    """

    def __init__(self, name: str, group: CallbackQueues | None = None) -> None:
        self.name = name
        self.group = group
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"<CallbackQueue {self.name}>"

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)`` to run on this queue's thread, after what is queued already."""
        if self._stopped:
            log.debug("queue %s stopped: dropped %r", self.name, fn)
            return
        self._q.put((fn, args))

    def is_current(self) -> bool:
        """True when called on this queue's thread."""
        return threading.current_thread() is self._thread

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued before this call ran; ``InvalidState`` on this thread."""
        if self.is_current():
            raise InvalidState(f"flush() on {self.name} would wait for itself")
        done = threading.Event()
        self.post(done.set)
        return done.wait(timeout)

    def stop(self) -> None:
        """Run what is queued, then end the thread (a no-op the second time)."""
        if self._stopped:
            return
        self._stopped = True
        self._q.put(None)
        if not self.is_current():
            self._thread.join()

    def _run(self) -> None:
        _tls.queue = self
        _tls.held = []
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except Exception:  # an internal task failing must not stop the queue
                log.exception("ibal queue %s: task %r failed", self.name, fn)


Dispatcher = CallbackQueue
"""The former name of :class:`CallbackQueue`."""


class CallbackQueues:
    """One manager's four queues: ``completion``, ``misc``, ``pnp`` and ``teardown``."""

    def __init__(self, prefix: str = "ibal") -> None:
        self.completion = CallbackQueue(f"{prefix}-completion", self)
        self.misc = CallbackQueue(f"{prefix}-misc", self)
        self.pnp = CallbackQueue(f"{prefix}-pnp", self)
        self.teardown = CallbackQueue(f"{prefix}-teardown", self)

    def __repr__(self) -> str:
        return f"<CallbackQueues {self.misc.name.rsplit('-', 1)[0]}>"

    @property
    def all(self) -> tuple[CallbackQueue, ...]:
        """In the order work flows between them: a task may post to the queues after it."""
        return (self.misc, self.pnp, self.completion, self.teardown)

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """``misc.post``: the queue for upper layers' work unless they need another."""
        self.misc.post(fn, *args)

    def is_current(self) -> bool:
        """True on any of these queues' threads (i.e. inside one of this manager's callbacks)."""
        q = current_queue()
        return q is not None and q.group is self

    def flush(self, timeout: float | None = None) -> bool:
        """Flush each queue in turn (misc, pnp, completion, teardown); False on a timeout.

        Covers what was queued before the call and what those items queue on a
        later queue in that order (a port event's PnP callbacks, a completion
        callback's destroy callback).  ``InvalidState`` on one of the threads.
        """
        if self.is_current():
            raise InvalidState("flush() from a callback would wait for itself")
        return all(q.flush(timeout) for q in self.all)

    def stop(self) -> None:
        """Stop the queues in flow order, each after what it has queued ran."""
        for q in self.all:
            q.stop()


def call_user(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a consumer callback (on a queue thread), logging what it raises."""
    try:
        return fn(*args)
    except Exception:
        log.exception("ibal callback %r raised", fn)
        return None
