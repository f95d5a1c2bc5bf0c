"""``Dependent``: the public hook for objects of upper layers that die with an AL handle.

A CM connection hangs on its QP, a MAD service on a port, a pending query on
its AL instance: each must be cancelled when what it hangs on goes, with the
same rules as the access layer's own objects.  Subclass :class:`Dependent`,
give the owner to ``__init__``, and override ``on_destroying`` (cancel) and
``cleanup`` (release).  See ``docs/architecture.md`` ("Dependent objects").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ibal.al.dispatcher import call_user
from ibal.al.obj import READY, AlObject, DestroyCallback, SyncDestroy, resolve_future
from ibal.status import InvalidHandle, InvalidParameter, InvalidPort

if TYPE_CHECKING:
    import asyncio  # imported where used: ~30-50 ms of every tool's start

    from ibal.al.access_layer import AccessLayer
    from ibal.al.ca import Ca
    from ibal.al.cq import Cq
    from ibal.al.pd import Pd
    from ibal.al.qp import Qp
    from ibal.al.srq import Srq
    from ibal.al.timer import Timer


_OWNER_TYPES: tuple[type[AlObject], ...] = ()


def _owner_types() -> tuple[type[AlObject], ...]:
    """The classes an owner may be (imported on first use: they import this module)."""
    global _OWNER_TYPES
    if not _OWNER_TYPES:
        from ibal.al.access_layer import AccessLayer
        from ibal.al.ca import Ca
        from ibal.al.cq import Cq
        from ibal.al.pd import Pd
        from ibal.al.qp import Qp
        from ibal.al.srq import Srq

        _OWNER_TYPES = (AccessLayer, Ca, Pd, Qp, Cq, Srq, Dependent)
    return _OWNER_TYPES


class Dependent(AlObject):
    """An upper layer's object in the access layer's object tree.

    ``owner`` is an :class:`~ibal.al.AccessLayer`, ``Ca``, ``Pd``, ``Qp``,
    ``Cq``, ``Srq``, another ``Dependent``, or ``(ca, port_num)`` for a port
    (a child of that CA handle that also goes when PnP removes the port).  An
    invalid owner raises its ``Invalid*Handle``; a missing port ``InvalidPort``.
    ``uses`` are further objects of the tree it relies on (a CA handle, another
    ``Dependent``): destroying any of them destroys it first, as a QP goes with
    its CQs, and each waits for it; an invalid one raises its ``Invalid*Handle``.
    (A CQ, SRQ or MR it uses refuses an explicit destroy while it lives, with
    ``ResourceBusy``, as for a QP on it; a cascade still takes it along.)

    The object is valid when ``__init__`` returns and may be cancelled by a
    cascade from then on: set what ``on_destroying``/``cleanup`` use *before*
    calling ``super().__init__``.  ``destroy_cb(context)`` runs once, on the
    teardown queue, however the object dies (its own ``destroy`` or its
    owner's cascade), after every callback for it returned and, in a cascade,
    right before the destroy callback of the object destroyed.
    """

    _invalid = InvalidHandle
    _rank = -1  # cancelled before the verbs objects beside it (and multicast attachments)
    _kind = "dependent object"
    _always_cleanup = True

    def __init__(
        self,
        owner: AccessLayer | Ca | Pd | Qp | Cq | Srq | Dependent | tuple[Ca, int],
        *,
        context: Any = None,
        destroy_cb: DestroyCallback | None = None,
        uses: Iterable[AlObject] = (),
    ) -> None:
        port_num = 0
        parent: object = owner
        if isinstance(owner, tuple):
            if len(owner) != 2 or not isinstance(owner[0], _owner_types()[1]):
                raise InvalidParameter("a port owner is (ca, port_num)")
            parent, port_num = owner
            if type(port_num) is not int or port_num < 1:
                raise InvalidPort(f"bad port number {port_num!r}")
        if not isinstance(parent, _owner_types()):
            raise InvalidParameter(f"a {type(parent).__name__} cannot own a dependent object")
        if destroy_cb is not None and not callable(destroy_cb):
            raise InvalidParameter("destroy_cb must be callable")
        used = tuple(uses)
        if not all(isinstance(u, AlObject) for u in used):
            raise InvalidParameter("uses are access-layer objects")
        super().__init__(parent, context)
        self._dep_port = port_num
        self._preset_cb = destroy_cb
        with self._lock:
            if port_num:
                parent._check()
                if parent._cica.port(port_num) is None:  # type: ignore[attr-defined]
                    raise InvalidPort(f"the CA has no port {port_num}")
            self._attach(used)
        self._activate(parent._invalid)

    # ------------------------------------------------------------------ for subclasses
    def on_destroying(self) -> None:
        """Hook: the object started dying (cancel timers, transactions).

        Runs once, under no lock, on the thread that destroys it (or its owner),
        before the objects hung on it are destroyed.  What it raises is logged.
        """

    def cleanup(self) -> None:
        """Hook: nothing references the object any more (release what it holds).

        Runs once, under no lock, on whichever thread dropped the last
        reference, before the destroy callback is queued; it must not wait for
        an AL callback.  What it raises is logged.
        """

    def post_callback(self, fn: Callable[..., object], *args: Any) -> bool:
        """Run ``fn(*args)`` on the misc queue unless the object is destroying by then.

        The object is pinned while ``fn`` runs, so its destroy callback comes
        after; a call still queued when it starts dying is dropped.  False if
        it is already dying (nothing queued).
        """
        if self._state is not READY:
            return False
        self._mgr.queues.misc.post(self._run_callback, fn, args)
        return True

    def call_later(self, delay: float, fn: Callable[..., object], *args: Any) -> Timer:
        """Run ``fn(*args)`` on the misc queue ``delay`` seconds from now (the manager's
        clock), like :meth:`post_callback`: not once the object is dying, whose timers
        are all cancelled as it starts to (``owner=self`` in ``al.timers``)."""
        return self.al.timers.call_later(delay, self._run_callback, fn, args, owner=self)

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        """Pin the valid object for a call: its ``cleanup`` waits until the block ends."""
        self._use()
        try:
            yield
        finally:
            self._unuse()

    def check(self) -> None:
        """Raise this type's ``Invalid*Handle`` unless the object is valid."""
        self._check()

    # ------------------------------------------------------------------ public bits
    @property
    def owner(self) -> AlObject:
        """What the object hangs on (the CA for a port owner)."""
        assert self._parent is not None
        return self._parent

    @property
    def port_num(self) -> int:
        """The port it hangs on, 0 for none."""
        return self._dep_port

    @property
    def al(self) -> AccessLayer:
        """The AL instance it belongs to."""
        return self._al  # type: ignore[return-value]

    @property
    def alive(self) -> bool:
        """True until it starts dying."""
        return self._state is READY

    def destroy(
        self,
        destroy_cb: DestroyCallback | SyncDestroy | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Destroy it (and what hangs on it); ``destroy_cb`` replaces the one given at creation."""
        self._destroy(destroy_cb, wait, timeout)

    async def destroy_async(self) -> None:
        """``await`` the destroy; the ``destroy_cb`` given at creation still runs first."""
        import asyncio

        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        preset = self._preset_cb

        def cb(context: Any) -> None:
            if preset is not None:
                call_user(preset, context)
            loop.call_soon_threadsafe(resolve_future, fut)

        self._destroy(cb, False, None)
        await fut

    # ------------------------------------------------------------------ internals
    def _run_callback(self, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        if not self._enter():
            return
        try:
            call_user(fn, *args)
        finally:
            self._leave()

    def _mark(self, destroy_cb: DestroyCallback | None, done: Any) -> list[AlObject]:
        return super()._mark(destroy_cb if destroy_cb is not None else self._preset_cb, done)

    def _destroying(self) -> None:
        self.al.timers.cancel_owner(self)
        call_user(self.on_destroying)

    def _cleanup(self) -> None:
        self.cleanup()
