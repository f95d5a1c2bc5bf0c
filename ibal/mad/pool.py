"""MAD pools and MAD elements (IBAL ``ib_create_mad_pool`` ... ``ib_put_mad``).

A :class:`MadPool` counts MAD elements: it starts with ``min_count``, grows by
``grow_size`` up to ``max_count`` (0: no limit).  Registering it with a PD
gives a :class:`PoolKey`; elements are taken through a key
(:meth:`PoolKey.get_mad`) and given back with :func:`put_mad`.  A pool or key
with elements out refuses to go (``ResourceBusy``).  Elements are plain
Python objects, so "growing" only raises the count the pool may hand out.

Thread safety: every call may come from any thread (one lock per pool).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ibal.al import AccessLayer, Dependent, Pd
from ibal.status import (
    InsufficientResources,
    InvalidAlHandle,
    InvalidHandle,
    InvalidParameter,
    InvalidPdHandle,
    InvalidSetting,
    ResourceBusy,
)
from ibal.types import MAD_SIZE, MadAddr, WcStatus, is_int

_TID = slice(8, 16)


class ElementState(enum.Enum):
    """Who holds a :class:`MadElement`."""

    USER = "user"
    SENDING = "sending"  # the MAD service's until its send callback
    FREE = "free"  # back in its pool: unusable


@dataclass(eq=False)
class MadElement:
    """``ib_mad_element_t``: one MAD buffer with its addressing and transaction state.

    Send: fill ``mad``, ``addr`` and, for a request that wants an answer,
    ``resp_expected``/``timeout_ms``/``retry_cnt``.  Completion: ``status``.
    Receive: ``addr`` is the sender (the reply's address as it stands); a
    response carries ``request`` (its request element) and
    ``send_context1``/``send_context2`` (that request's contexts).
    """

    mad: bytearray
    pool_key: PoolKey
    context1: Any = None
    context2: Any = None
    addr: MadAddr | None = None
    resp_expected: bool = False
    timeout_ms: int = 0
    retry_cnt: int = 0
    rmpp_version: int = 0
    status: WcStatus = WcStatus.SUCCESS
    send_context1: Any = None
    send_context2: Any = None
    request: MadElement | None = None
    port_num: int = 0
    qp_num: int = 0
    state: ElementState = ElementState.USER
    on_put: Callable[[MadElement], object] | None = field(default=None, repr=False)
    """Called once when the element goes back to its pool (the service's backlog count)."""

    @property
    def size(self) -> int:
        return len(self.mad)

    @property
    def tid(self) -> int:
        """The 64-bit transaction ID in the MAD header."""
        return int.from_bytes(self.mad[_TID], "big")

    @tid.setter
    def tid(self, value: int) -> None:
        self.mad[_TID] = value.to_bytes(8, "big")

    @property
    def is_response(self) -> bool:
        method = self.mad[3]
        return bool(method & 0x80) or method == 0x07


def get_mad_buf(element: MadElement) -> bytearray:
    """``ib_get_mad_buf``: the element's MAD buffer."""
    if not isinstance(element, MadElement):
        raise InvalidParameter("a MadElement is required")
    return element.mad


class MadPool:
    """``ib_create_mad_pool``: a bounded supply of MAD elements."""

    def __init__(
        self, al: AccessLayer | None, min_count: int = 0, max_count: int = 0, grow_size: int = 16
    ) -> None:
        # ``None``: a pool a MAD service makes for itself.
        if al is not None and (not isinstance(al, AccessLayer) or al.closed):
            raise InvalidAlHandle("an open AccessLayer is required")
        for name, v in (("min_count", min_count), ("max_count", max_count),
                        ("grow_size", grow_size)):
            if not is_int(v) or v < 0:
                raise InvalidParameter(f"{name} must be a non-negative int")
        if max_count and max_count < min_count:
            raise InvalidSetting(f"max_count {max_count} < min_count {min_count}")
        if min_count == 0 and grow_size == 0:
            raise InvalidParameter("a pool with min_count 0 must be allowed to grow")
        self.al = al
        self.min_count = min_count
        self.max_count = max_count
        self.grow_size = grow_size
        self._lock = threading.Lock()
        self._capacity = min_count
        self._out = 0
        self._keys: list[PoolKey] = []
        self._destroyed = False
        self._life = _PoolLife(al, self) if al is not None else None

    def __repr__(self) -> str:
        return f"<MadPool {self._out}/{self._capacity} out (max {self.max_count or 'none'})>"

    @property
    def outstanding(self) -> int:
        """Elements taken and not yet put back."""
        return self._out

    @property
    def capacity(self) -> int:
        """Elements the pool has grown to (``min_count`` at first)."""
        return self._capacity

    @property
    def destroyed(self) -> bool:
        """True once destroyed (by :meth:`destroy`, or with its AL)."""
        return self._destroyed

    def _check(self) -> None:
        if self._destroyed:
            raise InvalidHandle("the MAD pool is destroyed")

    def _close(self) -> None:
        """The pool ends (explicitly, or its AL closing): keys go, elements out stay usable
        until put back (which then only counts them in)."""
        with self._lock:
            self._destroyed = True
            for key in self._keys:
                key._valid = False
            self._keys.clear()

    def register(self, pd: Pd) -> PoolKey:
        """``ib_reg_mad_pool``: a key for taking elements usable on the PD's QPs."""
        if not isinstance(pd, Pd) or not pd.alive:
            raise InvalidPdHandle("a live Pd is required")
        with self._lock:
            self._check()
            key = PoolKey(self, pd)
            self._keys.append(key)
        try:
            key._life = _KeyLife(pd, key)  # it goes with its PD (dealloc, CA withdrawn)
        except BaseException:
            key._forget()
            raise
        return key

    def destroy(self) -> None:
        """``ib_destroy_mad_pool`` (synchronous): ``ResourceBusy`` with elements out."""
        with self._lock:
            self._check()
            if self._out:
                raise ResourceBusy(f"{self._out} MAD element(s) are still out of the pool")
        self._close()
        life = self._life
        if life is not None and life.alive:
            life.destroy()  # leaves the AL's object tree (asynchronous; nothing to wait for)

    def _take(self, key: PoolKey) -> None:
        with self._lock:
            self._check()
            if not key._valid:
                raise InvalidParameter("the pool key is deregistered")
            if self._out >= self._capacity:
                room = (self.max_count - self._capacity) if self.max_count else self.grow_size
                grow = min(self.grow_size, room)
                if grow <= 0:
                    raise InsufficientResources(
                        f"the MAD pool is at its limit ({self._capacity} elements)"
                    )
                self._capacity += grow
            self._out += 1
            key._out += 1

    def _give_back(self, key: PoolKey) -> None:
        with self._lock:
            self._out -= 1
            key._out -= 1


class _PoolLife(Dependent):
    """A pool's place in its AL's object tree: closing the AL destroys the pool (as
    ``ib_close_al`` does), whatever elements are out; an explicit :meth:`MadPool.destroy`
    keeps its ``ResourceBusy`` rule."""

    _kind = "MAD pool"

    def __init__(self, al: AccessLayer, pool: MadPool) -> None:
        self.pool = pool
        super().__init__(al)

    def on_destroying(self) -> None:
        self.pool._close()


class _KeyLife(Dependent):
    """A pool key's place under its PD: when the PD goes (deallocated, its CA withdrawn)
    the key is deregistered, so the pool no longer holds the dead PD; elements out stay
    usable until put back."""

    _kind = "MAD pool key"

    def __init__(self, pd: Pd, key: PoolKey) -> None:
        self.key = key
        super().__init__(pd)

    def on_destroying(self) -> None:
        self.key._forget()


class PoolKey:
    """A pool registered with a PD (``ib_pool_key_t``); it goes with the PD."""

    def __init__(self, pool: MadPool, pd: Pd) -> None:
        self.pool = pool
        self.pd = pd
        self._out = 0
        self._valid = True
        self._life: _KeyLife | None = None

    def _forget(self) -> None:
        with self.pool._lock:
            self._valid = False
            if self in self.pool._keys:
                self.pool._keys.remove(self)

    def __repr__(self) -> str:
        return f"<PoolKey {self._out} out{'' if self._valid else ' (deregistered)'}>"

    @property
    def outstanding(self) -> int:
        """Elements taken through this key and not yet put back."""
        return self._out

    def get_mad(self, size: int = MAD_SIZE) -> MadElement:
        """``ib_get_mad``: a zero-filled element of ``size`` bytes.

        ``InsufficientResources`` when the pool is at its limit, ``InvalidParameter``
        for a bad size or a deregistered key.
        """
        if not is_int(size) or size < MAD_SIZE:
            raise InvalidParameter(f"a MAD buffer is at least {MAD_SIZE} bytes")
        self.pool._take(self)
        return MadElement(bytearray(size), self)

    def dereg(self) -> None:
        """``ib_dereg_mad_pool``: ``ResourceBusy`` while elements taken through it are out."""
        with self.pool._lock:
            if not self._valid:
                raise InvalidParameter("the pool key is not registered")
            if self._out:
                raise ResourceBusy(f"{self._out} MAD element(s) taken by this key are out")
            self._valid = False
            self.pool._keys.remove(self)
            life, self._life = self._life, None
        if life is not None and life.alive:
            life.destroy()  # leaves the PD's children (nothing to wait for)


def put_mad(elements: MadElement | Iterable[MadElement]) -> None:
    """``ib_put_mad``: give elements back to their pools.

    ``InvalidParameter`` (before any goes back) for an element already free or
    still being sent.
    """
    items = [elements] if isinstance(elements, MadElement) else list(elements)
    if not items or not all(isinstance(e, MadElement) for e in items):
        raise InvalidParameter("put_mad takes MadElements")
    if len({id(e) for e in items}) != len(items):
        raise InvalidParameter("an element is listed twice")
    for e in items:
        if e.state is not ElementState.USER:
            raise InvalidParameter(f"a MAD element that is {e.state.value} cannot be put back")
    for e in items:
        e.state = ElementState.FREE
        e.pool_key.pool._give_back(e.pool_key)
        cb, e.on_put = e.on_put, None
        if cb is not None:
            cb(e)
