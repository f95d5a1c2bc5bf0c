"""The access layer's callback dispatcher: one thread, one FIFO queue per manager.

Providers upcall from any thread, even from inside ``post_send``; consumer
code must never run on that stack (nor on the caller's).  Every completion,
async-event, destroy and PnP callback is therefore queued here and run by one
thread, in queue order.  One consumer thread serialises callbacks by queue
rather than by lock (IBAL's ``AL_OBJ``/``AL_MISC``/``AL_PNP`` async queues,
folded into one), which is what makes "the destroy callback comes last"
cheap to guarantee: it is queued after everything that could precede it.

Code running on a dispatcher thread is "inside an AL callback": a call that
would wait for the dispatcher from there (``al.close()``, ``destroy(wait=True)``)
raises ``InvalidState`` instead of deadlocking; :func:`in_callback` tells.
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


def in_callback() -> bool:
    """True on any AL dispatcher thread, i.e. inside an AL callback (of any manager)."""
    return getattr(_tls, "dispatcher", None) is not None


_Item = tuple[Callable[..., Any], tuple[Any, ...]]


class Dispatcher:
    """A daemon thread draining a FIFO of ``(function, args)`` items.

    Items are internal tasks; they run consumer callbacks through
    :meth:`call_user`, which isolates exceptions (a raising callback is logged,
    the dispatcher keeps going).
    """

    def __init__(self, name: str = "ibal-dispatcher") -> None:
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def post(self, fn: Callable[..., Any], *args: Any) -> None:
        """Queue ``fn(*args)``; safe from any thread, never blocks, never runs it here."""
        if self._stopped:
            log.debug("dispatcher stopped: dropped %r", fn)
            return
        self._q.put((fn, args))

    def is_current(self) -> bool:
        """True when called on this dispatcher's thread."""
        return threading.current_thread() is self._thread

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything queued before this call has run (not from a callback)."""
        if self.is_current():
            raise InvalidState("flush() from the dispatcher thread would wait for itself")
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
        _tls.dispatcher = self
        while True:
            item = self._q.get()
            if item is None:
                return
            fn, args = item
            try:
                fn(*args)
            except Exception:  # an internal task failing must not stop the dispatcher
                log.exception("ibal dispatcher task %r failed", fn)


def call_user(fn: Callable[..., Any], *args: Any) -> Any:
    """Run a consumer callback (on the dispatcher thread), logging what it raises."""
    try:
        return fn(*args)
    except Exception:
        log.exception("ibal callback %r raised", fn)
        return None
