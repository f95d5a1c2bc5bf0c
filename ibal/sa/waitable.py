"""The first outcome of an SA operation, for a blocking ``wait()`` and for ``await``.

Joins, subscriptions and service registrations each report one first outcome
(later ones go to their callbacks only); :class:`FirstOutcome` keeps it, wakes
the threads blocked in :meth:`FirstOutcome.wait` and settles the futures of
the coroutines awaiting it, on their own event loops.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ibal.status import IbError, Timeout

if TYPE_CHECKING:
    import asyncio

__all__ = ["FirstOutcome"]

R = TypeVar("R")


class FirstOutcome(Generic[R]):
    """Set once from any thread; read by ``wait()`` (threads) and ``await`` (coroutines).

    ``check(rec)`` turns a record into the result (or raises its ``IbError``,
    which ``await`` then raises too); ``what`` names the outcome in ``Timeout``.
    """

    def __init__(self, what: str, check: Callable[[R], R] | None = None) -> None:
        self._what = what
        self._check = check
        self._lock = threading.Lock()
        self._rec: R | None = None
        self._done = threading.Event()
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[R]]] = []

    @property
    def value(self) -> R | None:
        """The outcome (``None`` before it came)."""
        return self._rec

    def set(self, rec: R) -> bool:
        """Keep ``rec`` if it is the first outcome (then ``True``) and wake its waiters."""
        with self._lock:
            if self._rec is not None:
                return False
            self._rec = rec
            futures, self._futures = self._futures, []
        self._done.set()
        for loop, fut in futures:
            with contextlib.suppress(RuntimeError):  # its loop closed
                loop.call_soon_threadsafe(self._settle, fut, rec)
        return True

    def arrived(self, timeout: float | None = None) -> bool:
        """Block until the outcome came (``False``: not within ``timeout``)."""
        return self._done.wait(timeout)

    def wait(self, timeout: float | None = None) -> R:
        """The outcome through ``check``; ``Timeout`` if it does not come in time.

        Not on the AL's callback threads: the outcome is delivered there."""
        if not self._done.wait(timeout):
            raise Timeout(f"no {self._what} within {timeout} s")
        assert self._rec is not None
        return self._rec if self._check is None else self._check(self._rec)

    def __await__(self) -> Generator[Any, None, R]:
        import asyncio

        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        with self._lock:
            if self._rec is None:
                self._futures.append((loop, fut))
                rec = None
            else:
                rec = self._rec
        if rec is not None:
            self._settle(fut, rec)
        return (yield from fut.__await__())

    def _settle(self, fut: asyncio.Future[R], rec: R) -> None:
        if fut.done():
            return
        try:
            result = rec if self._check is None else self._check(rec)
        except IbError as exc:
            fut.set_exception(exc)
            return
        fut.set_result(result)
