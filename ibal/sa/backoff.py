"""The retry schedule of an SA request the SA did not take: doubling, capped."""

from __future__ import annotations

__all__ = ["Backoff"]


class Backoff:
    """Delays (seconds) from ``first``, doubled each time up to ``maximum``.

    A machine takes :meth:`next` when it arms a retry and calls :meth:`reset`
    once the SA answered well, so the next failure waits ``first`` again.
    """

    __slots__ = ("_next", "first", "maximum")

    def __init__(self, first: float, maximum: float) -> None:
        self.first = first
        self.maximum = maximum
        self._next = first

    def next(self) -> float:
        """The delay to wait now; the one after it is twice as long (at most ``maximum``)."""
        delay, self._next = self._next, min(self._next * 2, self.maximum)
        return delay

    def reset(self) -> None:
        self._next = self.first
