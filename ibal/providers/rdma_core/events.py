"""The per-CA event thread: completion channels and the async event fd.

pyverbs' ``CompChannel.get_cq_event`` and ``Context.get_async_event`` block in
``read()`` while holding the GIL, so one thread per open CA waits on the fds
with :mod:`selectors` (which releases the GIL) and calls them only when the
fd is readable.  The fds are made non-blocking, as ``ibv_get_async_event(3)``
suggests, so a spurious wake-up cannot block the interpreter.

Ordering rules kept here (the contract's "no upcall after destroy"):

* reading an event, deciding whether its object is still alive and
  acknowledging events of dead objects happen under ``lock``;
* the upcall itself runs without the lock, with ``dispatching`` naming the
  object, and the event is acknowledged right after it returns;
* :meth:`retire` (used by destroy_cq/qp/srq and close_ca) marks the object
  dead, waits until it is not being dispatched, and runs the destroy under the
  lock.  Every event read for the object has then been acknowledged, which is
  what ``ibv_destroy_*`` waits for (it would otherwise wait forever, holding
  the GIL).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import selectors
import threading
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger("ibal.providers.rdma_core")


def set_nonblocking(fd: int) -> None:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)


AsyncDispatch = tuple[object, Callable[[], None], Callable[[], None]]
"""What ``on_async`` returns for a live object: (object, upcall, acknowledge)."""


class Retirable(Protocol):
    """An object whose events the loop delivers while ``alive``."""

    alive: bool


class EventLoop:
    """Waits for completion-channel and async events of one CA and dispatches them."""

    def __init__(
        self,
        name: str,
        *,
        on_async: Callable[[], AsyncDispatch | None],
        rdma_error: type[BaseException],
    ) -> None:
        self.name = name
        self._on_async = on_async
        self._rdma_error = rdma_error
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        set_nonblocking(self._wake_r)
        set_nonblocking(self._wake_w)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self.dispatching: object | None = None
        self._stopping = False
        self._thread = threading.Thread(
            target=self._run, name=f"ibal-rdma_core-{name}", daemon=True
        )

    # ------------------------------------------------------------ life cycle
    def start(self, async_fd: int | None) -> None:
        if async_fd is not None:
            set_nonblocking(async_fd)
            self._sel.register(async_fd, selectors.EVENT_READ, "async")
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (unless called from it)."""
        with self.lock:
            self._stopping = True
        self._wake()
        if threading.current_thread() is not self._thread and self._thread.is_alive():
            self._thread.join()
        with contextlib.suppress(OSError):
            self._sel.close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    # ---------------------------------------------------------- completion
    def add_channel(
        self, fd: int, cq: Any, read_event: Callable[[], None], upcall: Callable[[], None]
    ) -> None:
        """Deliver ``upcall`` after each completion event on ``fd`` while ``cq.alive``.

        ``read_event`` consumes and acknowledges one event (under the lock).
        """
        set_nonblocking(fd)
        with self.lock:
            self._sel.register(fd, selectors.EVENT_READ, (cq, read_event, upcall))
        self._wake()

    def retire(self, obj: Retirable, destroy: Callable[[], None], fd: int | None = None) -> None:
        """Mark ``obj`` dead, wait out an upcall for it, then ``destroy()`` under the lock."""
        with self.lock:
            obj.alive = False
            if not self.in_loop:
                while self.dispatching is obj:
                    self._cond.wait()
            key = None
            if fd is not None:
                with contextlib.suppress(KeyError, ValueError):
                    key = self._sel.unregister(fd)
            try:
                destroy()
            except BaseException:
                if key is not None:  # still alive: keep delivering its events
                    self._sel.register(key.fd, selectors.EVENT_READ, key.data)
                raise

    # ---------------------------------------------------------------- loop
    def _run(self) -> None:
        while True:
            try:
                ready = self._sel.select()
            except (OSError, ValueError):
                if self._stopping:
                    return
                continue
            for key, _ in ready:
                if self._stopping:
                    return
                if key.data is None:
                    with contextlib.suppress(OSError):
                        while os.read(self._wake_r, 512):
                            pass
                    continue
                try:
                    if key.data == "async":
                        self._async_ready()
                    else:
                        self._channel_ready(key)
                except Exception:  # never let the thread die
                    log.exception("rdma_core %s: event handling failed", self.name)

    def _channel_ready(self, key: selectors.SelectorKey) -> None:
        cq, read_event, upcall = key.data
        with self.lock:
            try:
                current = self._sel.get_map().get(key.fd)
            except (KeyError, RuntimeError):
                return
            if current is not key or not cq.alive:
                return
            try:
                read_event()
            except self._rdma_error:
                return  # EAGAIN: nothing there after all
            self.dispatching = cq
        try:
            upcall()
        except Exception:
            log.exception("rdma_core %s: completion callback raised", self.name)
        finally:
            with self.lock:
                self.dispatching = None
                self._cond.notify_all()

    def _async_ready(self) -> None:
        """``on_async`` (called under the lock) reads one event and returns its upcall.

        The upcall is None when the event was for a dead object (already
        acknowledged) or when nothing was there.
        """
        with self.lock:
            try:
                dispatch = self._on_async()
            except self._rdma_error:
                return
            if dispatch is None:
                return
            target, upcall, ack = dispatch
            self.dispatching = target
        try:
            upcall()
        except Exception:
            log.exception("rdma_core %s: async event callback raised", self.name)
        finally:
            with self.lock:
                try:
                    ack()
                finally:
                    self.dispatching = None
                    self._cond.notify_all()
