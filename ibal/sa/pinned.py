"""A handle whose destroy waits for the SA's answer to its last request.

A membership's leave (SubnAdmDelete) and a subscription's unsubscribe
(Subscribe 0) both pin the handle from the call until the SA answered or the
request gave up, so the cleanup and the destroy callback come after the answer.
"""

from __future__ import annotations

import contextlib
import threading

from ibal.al import Dependent, DestroyCallback


class PinnedUntilAnswered(Dependent):
    """A :class:`~ibal.al.Dependent` with :meth:`_destroy_pinned` and :meth:`_unpin`."""

    _mlock: threading.RLock
    _leave_pin: contextlib.AbstractContextManager[None] | None

    def _destroy_pinned(self, destroy_cb: DestroyCallback | None, wait: bool,
                        timeout: float | None) -> None:
        """Pin the handle (``InvalidHandle`` when already going), then destroy it; the
        answer to the last request calls :meth:`_unpin`."""
        pin = self.use()
        pin.__enter__()
        with self._mlock:
            self._leave_pin = pin
        try:
            self.destroy(destroy_cb, wait=wait, timeout=timeout)
        except BaseException:
            self._unpin()
            raise

    def _unpin(self) -> None:
        with self._mlock:
            pin, self._leave_pin = self._leave_pin, None
        if pin is not None:
            pin.__exit__(None, None, None)
