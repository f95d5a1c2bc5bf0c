"""``AlObject``: the life cycle every access-layer handle shares (IBAL ``al_common.c``).

Phases, made explicit:

* **init**: the object exists, pinned to its parent (and to the objects it uses,
  e.g. a QP pins its CQs); the provider resource is being created.  Async
  events may already arrive for it (IBAL: "possibly before create returns").
* **ready**: the handle is valid.
* **destroying**: set under the manager lock in one step.  From then on every
  call on it or passing it raises its type's ``Invalid*Handle`` and async
  events for it are dropped.  Children are destroyed newest first (the
  cascade); the object waits until nothing references it any more (children,
  users such as QPs on a CQ, calls in progress, callbacks running).
* **cleanup**: the provider's destroy verb, run by whichever thread dropped the
  last reference; then the consumer's destroy callback is queued on the
  teardown queue and the parent is unpinned.  Callbacks still queued for the
  object on the other queues are dropped when they come up (it is destroying).
* **destroyed**.

Invariant: no callback for an object runs after its destroy callback, and the
destroy callback runs only after every callback that was running for the object
(or its children) returned.  The destroy callback of an object destroyed by its
parent's cascade (only dependents have one) is queued with the parent's, just
before it.  Nothing is ever freed by force: a destroy that
waits and times out raises ``Timeout`` naming what still holds the object.
"""

from __future__ import annotations

import enum
import itertools
import os
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ibal.al.dispatcher import call_user, current_queue, held, log
from ibal.al.stash import Stash
from ibal.status import (
    IbError,
    InvalidHandle,
    InvalidParameter,
    InvalidState,
    ResourceBusy,
    Timeout,
)

if TYPE_CHECKING:
    import asyncio  # imported where used: ~30-50 ms of every tool's start

    from ibal.al.access_layer import AccessLayer
    from ibal.al.cica import CiCa
    from ibal.al.manager import AlManager
    from ibal.ci.interface import ChannelInterface


class State(enum.Enum):
    """Where an object is in its life cycle."""

    INIT = "init"
    READY = "ready"
    DESTROYING = "destroying"
    DESTROYED = "destroyed"


INIT = State.INIT
READY = State.READY
DESTROYING = State.DESTROYING
DESTROYED = State.DESTROYED
ALIVE = (INIT, READY)


class SyncDestroy:
    """The type of :data:`SYNC_DESTROY`."""

    _instance: ClassVar[SyncDestroy | None] = None

    def __new__(cls) -> SyncDestroy:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ib_sync_destroy"


SYNC_DESTROY = SyncDestroy()
"""IBAL's ``ib_sync_destroy``: passed as ``destroy_cb`` it means ``wait=True``."""

DestroyCallback = Callable[[Any], object]

_SEQ = itertools.count()
_T = TypeVar("_T", bound="AlObject")


_DestroyTask = tuple["DestroyCallback | None", Any, "threading.Event | None"]


def _run_destroy_cb(cb: DestroyCallback | None, context: Any, done: threading.Event | None) -> None:
    """Teardown-queue task: the consumer's destroy callback, then wake ``wait=True`` callers."""
    try:
        if cb is not None:
            call_user(cb, context)
    finally:
        if done is not None:
            done.set()


def resolve_future(fut: asyncio.Future[None]) -> None:
    """Complete ``fut`` unless it is done (a waiter may have been cancelled)."""
    if not fut.done():
        fut.set_result(None)


class AlObject:
    """Base of every handle: state, references, cascade and destroy.

    References (``_refs``): one for creation (dropped by destroy), one during
    construction, one per child, one per object pinning this one (a QP on a
    CQ), one per call in progress that must not race the provider cleanup, and
    one per callback running for it.  The cleanup runs when they are all gone.
    """

    _invalid: ClassVar[type[InvalidHandle]] = InvalidHandle
    _rank: ClassVar[int] = 50  # cascade order among siblings: lower goes first
    _kind: ClassVar[str] = "object"
    _sync_destroy: ClassVar[bool] = False  # Av, Mr, Mw, mcast: destroy returns when done
    _always_cleanup: ClassVar[bool] = False  # run _cleanup even without a provider handle

    _dep_port = 0  # the port a dependent hangs on (0: none)
    _mgr: AlManager
    _al: AlObject

    debug_refs: ClassVar[bool] = bool(os.environ.get("IBAL_DEBUG_REFS"))
    """Count references per origin (``ref_origins()``); set before creating objects."""

    def __init__(
        self, parent: AlObject | None, context: Any = None, *, mgr: AlManager | None = None
    ) -> None:
        """A child of ``parent`` (of its manager and AL instance), or with no parent an
        AL instance of ``mgr``."""
        if parent is not None:
            mgr, al = parent._mgr, parent._al
        else:
            assert mgr is not None, "an object without a parent is an AL instance of mgr"
            al = self
        self._mgr = mgr
        self._lock = mgr._lock
        self._al = al
        self._parent = parent
        self._state = INIT
        self._refs = 2  # creation + construction
        self._creation_dropped = False
        self._children: dict[AlObject, None] = {}
        self._dependents: dict[AlObject, None] = {}
        self._pins: tuple[AlObject, ...] = ()
        self._context = context
        self._destroy_cb: DestroyCallback | None = None
        self._done: threading.Event | None = None
        self._sync_waiting = False
        self._finishing = False
        self._cascaded = False  # destroyed by a parent's (or a used object's) cascade
        self._deferred: list[_DestroyTask] = []  # cascaded children's destroy callbacks
        self._inuse: deque[None] = deque()  # verbs in progress (lock-free: append/pop)
        self._h: Any = None  # the provider's handle, if the object has one
        self._stash: Stash | None = None
        self._seq = next(_SEQ)
        self._origins: Counter[str] | None = (
            Counter({"creation": 1, "construction": 1}) if self.debug_refs else None
        )

    # ------------------------------------------------------------------ public bits
    @property
    def context(self) -> Any:
        """The context given at creation (passed to this object's callbacks)."""
        return self._context

    @property
    def alive(self) -> bool:
        """True until it starts dying (upper layers check handles they are given)."""
        return self._state is READY

    @property
    def manager(self) -> AlManager:
        """The manager the object lives under (its CAs, callback queues, timers)."""
        return self._mgr

    @property
    def ci_handle(self) -> Any:
        """The provider's handle of the object, what the AL passes the provider's verbs in
        its place (``None`` before the provider made it and once it is gone)."""
        return self._h

    @property
    def stash(self) -> Stash:
        """Typed per-client data for layers built on this handle (see :mod:`ibal.al.stash`)."""
        if self._stash is None:
            self._stash = Stash()
        return self._stash

    def ref_origins(self) -> dict[str, int]:
        """References held on this object, by origin (only with ``debug_refs``)."""
        if self._origins is None:
            return {"total": self._refs + len(self._inuse)}
        out = {k: v for k, v in self._origins.items() if v}
        if self._inuse:
            out["use"] = len(self._inuse)
        return out

    def __repr__(self) -> str:
        return f"<{type(self).__name__} #{self._seq} {self._state.value}>"

    # ------------------------------------------------------------------ validation
    def _check(self) -> None:
        """Raise this type's ``Invalid*Handle`` unless the handle is valid."""
        if self._state is not READY:
            raise self._invalid(f"{self._kind} handle is {self._state.value}")

    def _check_busy(self) -> None:
        """Raise ``ResourceBusy`` if an explicit destroy is not allowed now (under lock)."""

    # ------------------------------------------------------------------ references
    def _ref(self, origin: str) -> None:
        """Take a reference (caller holds the lock)."""
        self._refs += 1
        if self._origins is not None:
            self._origins[origin] += 1

    def _use(self) -> None:
        """Pin a valid handle for the duration of a verb (pair with ``_unuse()``).

        Lock-free, as it guards every verb: register first, then check the
        state; a destroy marks the state first, then looks for users.  Under
        the GIL one of the two always sees the other, so the cleanup never
        runs while a verb is inside the provider.
        """
        self._inuse.append(None)
        if self._state is not READY:
            self._unuse()
            raise self._invalid(f"{self._kind} handle is {self._state.value}")

    def _unuse(self) -> None:
        self._inuse.pop()
        if self._state is not READY:  # a destroy may be waiting for this verb
            self._settle()

    def _settle(self, here: bool = True) -> None:
        """Run the cleanup if a destroying object has nothing left on it."""
        with self._lock:
            if self._sync_waiting:
                self._mgr.cond.notify_all()
            if (
                self._refs
                or self._inuse
                or self._state is not DESTROYING
                or self._finishing
            ):
                return
            self._finishing = True
        if here:
            self._finish()
        else:
            self._mgr.queues.teardown.post(self._finish)

    def _enter(self) -> bool:
        """Pin the object for a callback; False if it is destroying (drop the callback).

        Pair with ``_leave()``.  The object is recorded as held by this thread,
        so a wait for its destroy from inside the callback raises instead of hanging.
        """
        with self._lock:
            if self._state is not READY and self._state is not INIT:
                return False
            self._ref("callback")
        objs = held()
        objs.append(self)
        return True

    def _leave(self) -> None:
        """The callback ``_enter()`` pinned the object for returned (= ``_release("callback")``)."""
        self._release("callback")

    def _leave_inline(self) -> None:
        """``_leave()`` for a callback run on a provider's thread (inline delivery): a
        cleanup the release starts runs on the teardown queue, not inside the upcall."""
        self._release("callback", here=False)

    def _release(self, origin: str, *, here: bool = True) -> None:
        """Drop a reference; the last one of a destroying object runs its cleanup here
        (``here=False``: on the teardown queue, which never waits for a destroy)."""
        if origin == "callback":
            objs = held()
            if objs and objs[-1] is self:
                objs.pop()
        with self._lock:
            self._refs -= 1
            if self._origins is not None:
                self._origins[origin] -= 1
        self._settle(here)

    # ------------------------------------------------------------------ creation
    def _attach(self, pins: Iterable[AlObject] = ()) -> None:
        """Pin the parent (as a child) and ``pins`` (as a user); all must be valid.

        Called under the lock by the creating verb, after validation.
        """
        parent = self._parent
        pins = tuple(pins)
        if parent is not None:
            parent._check()
        for p in pins:
            p._check()
        if parent is not None:
            parent._children[self] = None
            parent._ref("child")
        for p in pins:
            if self not in p._dependents:
                p._dependents[self] = None
                p._ref("pin")
        self._pins = tuple(dict.fromkeys(pins))

    def _activate(self, doomed_error: type[IbError]) -> None:
        """The provider created the resource: the handle becomes valid.

        If a cascade reached the object meanwhile (its parent is being
        destroyed), the new resource is destroyed again and ``doomed_error``
        raised: the call did not produce a usable handle.
        """
        with self._lock:
            doomed = self._state is not INIT
            if not doomed:
                self._state = READY
        self._release("construction")
        if doomed:
            raise doomed_error("destroyed while the call was in progress")

    def _abort(self) -> None:
        """The provider refused to create it: undo the attach, nothing to clean up."""
        with self._lock:
            self._h = None
            self._state = DESTROYING
            creation = not self._creation_dropped
            self._creation_dropped = True
        if creation:
            with self._lock:
                self._refs -= 1
                if self._origins is not None:
                    self._origins["creation"] -= 1
        self._release("construction")

    def _spawn(self, child: _T, make: Callable[[], object], pins: Iterable[AlObject] = ()) -> _T:
        """Create ``child`` of this object: attach, ``make()`` at the provider, activate.

        ``make`` calls the provider's create verb and stores the handle on
        ``child``; if it raises, the attach is undone and nothing is left behind.
        """
        with self._lock:
            child._attach(pins)
        try:
            make()
        except BaseException:
            child._abort()
            raise
        child._activate(self._invalid)
        return child

    # ------------------------------------------------------------------ destroy
    def _cascade_victims(self) -> list[AlObject]:
        """What must go before this object: children, and users that pin it."""
        victims = [*self._children, *self._dependents, *self._extra_victims()]
        victims = list(dict.fromkeys(victims))
        victims.sort(key=lambda o: (o._rank, -o._seq))
        return victims

    def _extra_victims(self) -> Iterable[AlObject]:
        """Further objects a forced destroy takes along (e.g. windows bound to an MR)."""
        return ()

    def _mark(
        self, destroy_cb: DestroyCallback | None, done: threading.Event | None
    ) -> list[AlObject]:
        """Enter DESTROYING (caller holds the lock); return the cascade victims."""
        self._state = DESTROYING
        self._destroy_cb = destroy_cb
        self._done = done
        self._on_destroying()
        return self._cascade_victims()

    def _on_destroying(self) -> None:
        """Hook, under the lock, when the object enters DESTROYING."""

    def _destroying(self) -> None:
        """Hook, under no lock, after DESTROYING was entered and before the cascade."""

    def _cascade(self, victims: list[AlObject]) -> None:
        self._destroying()
        for v in victims:
            v._destroy_forced()
        self._drop_creation()

    def _drop_creation(self) -> None:
        with self._lock:
            if self._creation_dropped:
                return
            self._creation_dropped = True
        self._release("creation")

    def _destroy_forced(self) -> None:
        """Destroy as part of a parent's cascade (no callback, never raises)."""
        with self._lock:
            if self._state is not READY and self._state is not INIT:
                return
            self._cascaded = True
            victims = self._mark(None, None)
        self._cascade(victims)

    def _destroy(
        self,
        destroy_cb: DestroyCallback | SyncDestroy | None,
        wait: bool,
        timeout: float | None,
    ) -> None:
        """The asynchronous destroy verbs (``ib_close_ca``, ``ib_destroy_qp``, ...)."""
        if isinstance(destroy_cb, SyncDestroy):
            destroy_cb, wait = None, True
        if destroy_cb is not None and not callable(destroy_cb):
            raise InvalidParameter("destroy_cb must be callable")
        if wait:
            self._check_wait(f"the destroy of this {self._kind}")
        done = threading.Event() if wait else None
        with self._lock:
            self._check()
            self._check_busy()
            victims = self._mark(destroy_cb, done)
        self._cascade(victims)
        if done is not None:
            self._wait(done, timeout)

    def _check_wait(self, what: str) -> None:
        """Raise ``InvalidState`` if waiting here for this object's destroy could never end.

        That is so on this manager's teardown queue (it runs the destroy callback
        waited for) and in a callback that pins this object or one its destroy
        takes along (the callback's reference holds the destroy up).  Waits
        from any other callback return.
        """
        q = current_queue()
        if q is None or q.group is not self._mgr.queues:
            return
        if q is self._mgr.queues.teardown:
            raise InvalidState(f"waiting for {what} inside a destroy callback would deadlock")
        objs = held()
        if objs and self._reaches(objs):
            raise InvalidState(
                f"waiting for {what} inside a callback of an object it destroys would deadlock"
            )

    def _descendants(self, kind: str) -> list[AlObject]:
        """The live objects of ``kind`` (their ``_kind``) below this one, nearest first."""
        found: list[AlObject] = []
        with self._lock:
            todo = list(self._children)
            while todo:
                o = todo.pop(0)
                if o._kind == kind and o._state is READY:
                    found.append(o)
                todo.extend(o._children)
        return found

    def _reaches(self, objs: list[AlObject]) -> bool:
        """Whether destroying this object takes along any of ``objs`` (itself included)."""
        want = set(objs)
        with self._lock:
            todo: list[AlObject] = [self]
            seen: set[AlObject] = set()
            while todo:
                o = todo.pop()
                if o in want:
                    return True
                if o in seen:
                    continue
                seen.add(o)
                todo.extend(o._children)
                todo.extend(o._dependents)
                todo.extend(o._extra_victims())
        return False

    def _destroy_now(self) -> None:
        """The synchronous destroy verbs (``ib_destroy_av``, ``ib_dereg_mr``, ...).

        The provider's verdict counts: if it refuses (e.g. ``ResourceBusy``), the
        handle stays valid and the error is raised.
        """
        with self._lock:
            self._check()
            self._check_busy()
            self._state = DESTROYING
            self._creation_dropped = True
            self._on_destroying()
            self._sync_waiting = True
            try:
                while self._refs > 1 or self._inuse:  # calls in progress elsewhere
                    self._mgr.cond.wait()
            finally:
                self._sync_waiting = False
        try:
            if self._h is not None:
                self._cleanup()
        except IbError:
            with self._lock:
                parent_dying = self._parent is not None and self._parent._state is not READY
                if not parent_dying:
                    self._state = READY
                    self._creation_dropped = False
            if parent_dying:  # the parent's cascade counts on us: finish without the provider
                self._h = None
                self._release("creation")
            raise
        self._h = None  # cleaned: _finish must not call the provider again
        self._release("creation")

    def _wait(self, done: threading.Event, timeout: float | None) -> None:
        if not done.wait(timeout):
            raise Timeout(
                f"{self._kind} still referenced after {timeout} s: {self.ref_origins()} "
                "(it will be freed when they go; nothing is freed by force)"
            )

    async def _destroy_async(self) -> None:
        if self._sync_destroy:
            self._destroy_now()
            return
        import asyncio

        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()

        def cb(_context: Any) -> None:
            loop.call_soon_threadsafe(resolve_future, fut)

        self._destroy(cb, False, None)
        await fut

    async def destroy_async(self) -> None:
        """``await`` the destroy: returns once the destroy is complete (callback ran)."""
        await self._destroy_async()

    # ------------------------------------------------------------------ teardown
    def _finish(self) -> None:
        """No references left: provider cleanup, queue the destroy callback, unpin."""
        if self._h is not None or self._always_cleanup:
            try:
                self._cleanup()
            except Exception as exc:  # a cascade cannot report it; keep tearing down
                log.warning("ibal: cleanup of %r failed: %s", self, exc)
        with self._lock:
            self._state = DESTROYED
            parent, pins = self._parent, self._pins
            tasks, self._deferred = self._deferred, []
            if self._destroy_cb is not None or self._done is not None:
                tasks.append((self._destroy_cb, self._context, self._done))
            if parent is not None:
                parent._children.pop(self, None)
                if tasks and self._cascaded and parent._state is DESTROYING:
                    # The parent cannot finish before our "child" reference goes:
                    # its destroy callback will follow these.
                    parent._deferred.extend(tasks)
                    tasks = []
            for p in pins:
                p._dependents.pop(self, None)
            self._unlink()
        for task in tasks:
            self._mgr.queues.teardown.post(_run_destroy_cb, *task)
        for p in pins:
            p._release("pin")
        if parent is not None:
            parent._release("child")
        self._after_free()

    def _cleanup(self) -> None:
        """The provider's destroy verb for ``self._h`` (subclasses)."""

    def _unlink(self) -> None:
        """Hook, under the lock, when the object is freed (bookkeeping in other objects)."""

    def _after_free(self) -> None:
        """Hook, outside the lock, after the object is freed and unpinned."""


class CaObject(AlObject):
    """An object that lives on one CA and has a provider handle there."""

    _cica: CiCa

    def __init__(self, parent: AlObject, context: Any = None, *, cica: CiCa | None = None) -> None:
        """A child of ``parent`` on CA ``cica``, by default the parent's (a PD's QP)."""
        super().__init__(parent, context)
        if cica is None:
            assert isinstance(parent, CaObject), "only a CA object's child inherits its CA"
            cica = parent._cica
        self._cica = cica
        self._ci: ChannelInterface = cica.ci

    @property
    def al(self) -> AccessLayer:
        """The AL instance it was opened through (upper layers reach its timers)."""
        return self._al  # type: ignore[return-value]


def busy_if(users: Iterable[AlObject], what: str) -> None:
    """Raise ``ResourceBusy`` if any of ``users`` is still alive (caller holds the lock)."""
    alive = sum(1 for u in users if u._state is READY or u._state is INIT)
    if alive:
        raise ResourceBusy(f"{alive} {what} still in use")


def check_callback(cb: object, name: str) -> None:
    """``InvalidParameter`` unless ``cb`` (argument ``name``) is ``None`` or callable."""
    if cb is not None and not callable(cb):
        raise InvalidParameter(f"{name} must be callable")


def is_handle_of(
    obj: object,
    cls: type[AlObject] | tuple[type[AlObject], ...],
    al: AlObject | None,
    cica: CiCa | None = None,
) -> bool:
    """Whether ``obj`` is a live ``cls`` (of access layer ``al`` and CA ``cica``, those
    given): :func:`check_handle`'s test, for callers that report instead of raising."""
    return (
        isinstance(obj, cls)
        and obj._state is READY
        and (al is None or obj._al is al)
        and (cica is None or getattr(obj, "_cica", cica) is cica)
    )


def check_handle(obj: object, cls: type[_T], al: AlObject, cica: CiCa | None = None) -> _T:
    """``obj`` as a valid ``cls`` of access layer ``al`` (and CA ``cica``), else ``cls``'s error.

    Wrong type, another AL instance's handle, a handle on another CA and a
    destroyed handle all raise the same ``Invalid*Handle`` of the expected type.
    """
    if not isinstance(obj, cls):
        raise cls._invalid(f"expected a {cls._kind} handle, got {type(obj).__name__}")
    if obj._al is not al:
        raise cls._invalid(f"{cls._kind} handle belongs to another AL instance")
    if obj._state is not READY:
        raise cls._invalid(f"{cls._kind} handle is {obj._state.value}")
    if cica is not None and getattr(obj, "_cica", cica) is not cica:
        raise cls._invalid(f"{cls._kind} handle is on another CA")
    return obj


def set_handle(obj: AlObject, handle: Any) -> None:
    """The provider made ``obj``: the handle its verbs pass on (set inside ``_spawn``'s make)."""
    obj._h = handle
