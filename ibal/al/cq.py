"""Completion queues: poll, rearm, resize, completion callbacks, ``wait`` and ``poll_async``."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ibal.al.dispatcher import call_user, log
from ibal.al.obj import ALIVE, READY, CaObject, DestroyCallback, SyncDestroy, busy_if
from ibal.status import InvalidCqHandle, InvalidCqSize, InvalidParameter
from ibal.types import AsyncEventRec, Wc, WcStatus

if TYPE_CHECKING:
    import asyncio  # imported where used: ~30-50 ms of every tool's start

    from ibal.al.ca import Ca

CompCallback = Callable[["Cq", Any], object]
_QUIET = (WcStatus.SUCCESS, WcStatus.WR_FLUSHED_ERR)
EventCallback = Callable[[AsyncEventRec], object]


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Cq(CaObject):
    """``ib_create_cq``'s handle.

    The provider's per-CA completion upcall carries this object as its
    ``cq_context``; the completion queue turns it into ``comp_cb(cq, context)``.
    Notifications follow the provider's rearm semantics: one callback per
    ``rearm()`` (or per ``rearm_n(n)`` batch).
    """

    _invalid = InvalidCqHandle
    _rank = 50
    _kind = "CQ"

    def __init__(
        self,
        ca: Ca,
        comp_cb: CompCallback | None,
        event_cb: EventCallback | None,
        context: Any,
    ) -> None:
        super().__init__(ca, context)
        self._ca = ca
        self._comp_cb = comp_cb
        self._event_cb = event_cb
        self._size = 0
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._sync_waiters: list[threading.Event] = []

    @property
    def ca(self) -> Ca:
        return self._ca

    @property
    def size(self) -> int:
        """The size the provider granted (last known)."""
        return self._size

    # ------------------------------------------------------------------ hot path
    def poll(self, max_entries: int = 16) -> list[Wc]:
        """``ib_poll_cq``: up to ``max_entries`` completions in order; ``[]`` = ``IB_NOT_FOUND``."""
        if self._state is not READY:
            self._check()
        if type(max_entries) is not int or max_entries < 1:
            raise InvalidParameter("max_entries must be a positive int")
        wcs = self._ci.poll_cq(self._h, max_entries)
        for wc in wcs:  # SUCCESS is 0; the plain loop is the cheapest scan (~25 ns a WC)
            if wc.status:
                self._observe_errors(wcs)
                break
        return wcs

    def _observe_errors(self, wcs: list[Wc]) -> None:
        """Error completions move their QP's state (``Qp._observe_wc``); flushes do not."""
        with self._lock:  # QPs come and go on other threads
            deps = list(self._dependents)
        for wc in wcs:
            if wc.status in _QUIET:
                continue
            for dep in deps:
                if getattr(dep, "num", None) == wc.qp_num and hasattr(dep, "_observe_wc"):
                    dep._observe_wc(wc)
                    break

    def peek(self) -> int:
        """``ib_peek_cq``: how many completions are queued (optional verb)."""
        self._check()
        return self._ci.peek_cq(self._h)

    def rearm(self, solicited: bool = False) -> None:
        """``ib_rearm_cq``: one callback for the next (solicited) completion."""
        if self._state is not READY:
            self._check()
        self._ci.enable_cq_notify(self._h, bool(solicited))

    def rearm_n(self, n: int) -> None:
        """``ib_rearm_n_cq``: one callback after ``n`` new completions (optional verb)."""
        self._check()
        if type(n) is not int or n < 1 or (self._size and n > self._size):
            raise InvalidParameter(f"n must be 1..{self._size}")
        self._ci.enable_ncomp_cq_notify(self._h, n)

    # ------------------------------------------------------------------ control
    def modify(self, size: int) -> int:
        """``ib_modify_cq``: resize; returns the granted size (``Overflow`` if too small)."""
        self._check()
        self._check_size(size)
        self._use()
        try:
            self._size = self._ci.resize_cq(self._h, size)
        finally:
            self._unuse()
        return self._size

    def query(self) -> int:
        """``ib_query_cq``: the size."""
        self._use()
        try:
            self._size = self._ci.query_cq(self._h)
        finally:
            self._unuse()
        return self._size

    def _created(self, handle: Any, size: int) -> None:
        self._h, self._size = handle, size

    def _upcall(self, cica: object) -> None:
        if self._cica is cica and self._state in ALIVE:
            if self._sync_waiters:  # cq.wait() callers: no consumer code, wake now
                self._wake_sync_waiters()
            self._cica.post_completion(self._on_completion)

    def _check_size(self, size: object) -> None:
        if type(size) is not int:
            raise InvalidParameter("size must be an int")
        limit = self._cica.limit("max_cqes")
        if size < 1 or (limit and size > limit):
            raise InvalidCqSize(f"size {size} outside 1..{limit or 'max'}")

    def destroy(
        self,
        destroy_cb: DestroyCallback | SyncDestroy | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """``ib_destroy_cq``: ``ResourceBusy`` while QPs use it; else asynchronous."""
        self._destroy(destroy_cb, wait, timeout)

    def _check_busy(self) -> None:
        busy_if(self._dependents, "QPs")

    def _cleanup(self) -> None:
        self._ci.destroy_cq(self._h)

    def _on_destroying(self) -> None:
        # Wake poll_async waiters: their next poll raises InvalidCqHandle.
        self._wake_waiters()

    # ------------------------------------------------------------------ callbacks
    def _on_completion(self) -> None:
        """Completion-queue task for one provider completion upcall."""
        self._wake_waiters()
        cb = self._comp_cb
        if cb is None or not self._enter():
            return
        try:
            call_user(cb, self, self._context)
        finally:
            self._leave()

    def _wake_sync_waiters(self) -> None:
        """Wake ``wait()`` callers; safe on the provider's stack (runs no consumer code).

        Lock-free (list pops are atomic under the GIL), because a provider may
        upcall while the access layer holds the manager lock.
        """
        events = self._sync_waiters
        while events:
            try:
                events.pop().set()
            except IndexError:  # another upcall emptied it first
                break

    def _wake_waiters(self) -> None:
        self._wake_sync_waiters()
        with self._lock:
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_wake, fut)
            except RuntimeError:  # that event loop is closed
                log.debug("poll_async waiter's loop is closed")

    def wait(
        self, timeout: float | None = None, max_entries: int = 16, *, min_entries: int = 1
    ) -> list[Wc]:
        """Block until ``min_entries`` completions were polled; return them (up to ``max_entries``).

        Race-free and without spinning: poll, register, rearm, poll again,
        then sleep until the completion upcall.  ``timeout`` (seconds; ``None``
        waits for ever, ``0`` polls once) ends the wait: what was polled is
        returned, ``[]`` when nothing came, and nothing polled is lost.  Each
        wait rearms the CQ, so a ``comp_cb`` on the same CQ may see an extra
        notification.  Destroying the CQ meanwhile raises ``InvalidCqHandle``.
        The provider's completion upcall wakes it directly, so it also
        returns inside any completion callback, this CQ's own included.
        """
        if type(min_entries) is not int or min_entries < 1:
            raise InvalidParameter("min_entries must be a positive int")
        if type(max_entries) is not int or max_entries < min_entries:
            raise InvalidParameter("max_entries must be an int >= min_entries")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise InvalidParameter("timeout is None or a number of seconds >= 0")
        got = self.poll(max_entries)
        if len(got) >= min_entries or timeout == 0:
            return got
        deadline = None if timeout is None else time.monotonic() + timeout
        while len(got) < min_entries:
            ev = threading.Event()
            with self._lock:
                self._sync_waiters.append(ev)
            try:
                self.rearm()
                more = self.poll(max_entries - len(got))
                if more:
                    got.extend(more)
                    continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                woken = ev.wait(remaining)
                got.extend(self.poll(max_entries - len(got)))
                if not woken:
                    break
            finally:
                with contextlib.suppress(ValueError):  # woken: already popped
                    self._sync_waiters.remove(ev)
        return got

    async def poll_async(self, min_entries: int = 1, timeout: float | None = None) -> list[Wc]:
        """Wait (asyncio) until at least ``min_entries`` completions are polled.

        Race-free: register the waiter, rearm, poll again, then sleep until the
        dispatcher reports a completion.  On ``timeout`` it returns what it has
        (possibly fewer, never losing a polled completion).
        """
        if type(min_entries) is not int or min_entries < 1:
            raise InvalidParameter("min_entries must be a positive int")
        import asyncio

        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        cap = max(min_entries, 16)
        got = self.poll(cap)
        while len(got) < min_entries:
            fut: asyncio.Future[None] = loop.create_future()
            entry = (loop, fut)
            with self._lock:
                self._waiters.append(entry)
            try:
                self.rearm()
                more = self.poll(cap - len(got))
                if more:
                    got.extend(more)
                    continue
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    await asyncio.wait_for(fut, remaining)
                except TimeoutError:
                    break
                got.extend(self.poll(cap - len(got)))
            finally:
                with self._lock:
                    if entry in self._waiters:
                        self._waiters.remove(entry)
        return got


def check_size(cq: Cq, size: object) -> None:
    """A CQ size against the CA's ``max_cqes`` (before the provider sees it)."""
    cq._check_size(size)


def created(cq: Cq, handle: Any, size: int) -> None:
    """The provider made ``cq``: its handle and the size it granted."""
    cq._created(handle, size)


def completion_upcall(cq: Cq, cica: object) -> None:
    """The provider's completion upcall for ``cq`` (on the provider's stack): wake
    ``wait()`` callers at once, queue the completion callback; ignored unless ``cq``
    is a live CQ of ``cica``."""
    cq._upcall(cica)
