"""A listen in the user's AL: :class:`CmListen` (IBAL's ``ib_listen_handle_t``).

It registers with the process-wide agent's listen table (which refuses a
duplicate with ``InvalidSetting``) and hangs on the user's AL instance: the
AL's close, or :meth:`CmListen.cancel`, removes it; REQs then find nobody
(REJ "invalid service ID").  For each new REQ (or SIDR_REQ) the agent asks
it for the connection handle of the new passive endpoint
(:meth:`CmListen.cm_incoming`), made in the listen's AL; the API layer
(:attr:`CmListen.on_incoming`) sets up its callbacks.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ibal.al import Dependent
from ibal.cm.conn import CmConn
from ibal.cm.fsm import CmState, cm_ms
from ibal.status import IbError, Status
from ibal.wire.fields import Value
from ibal.wire.mad.cm import RejReason

if TYPE_CHECKING:
    from ibal.al import AccessLayer, DestroyCallback
    from ibal.cm.service import CepIo, CmAgent

__all__ = ["ListenHandle"]

_HALF_OPEN = frozenset({CmState.REQ_RCVD, CmState.MRA_REQ_SENT, CmState.REP_SENT,
                        CmState.MRA_REP_RCVD})  # fmt: skip

Incoming = Callable[["ListenHandle", CmConn, dict[str, Value]], None]


class ListenHandle(Dependent):
    """One listen (IBAL's ``ib_listen_handle_t``, see the module docstring); ``cancel`` is
    ``ib_cm_cancel``."""

    _kind = "CM listen"

    def __init__(self, al: AccessLayer, agent: CmAgent, *, svc_id: int, ca_guid: int = 0,
                 port_guid: int = 0, lid: int = 0, pkey: int = 0, compare_offset: int = 0,
                 compare_buf: bytes = b"", ud: bool = False, context: Any = None,
                 on_incoming: Incoming | None = None, record: Any = None,
                 backlog: int = 128) -> None:  # fmt: skip
        self.agent = agent
        self.backlog = backlog
        self.stats: dict[str, int] = {"refused_backlog": 0, "reclaimed": 0}
        # passive endpoints not yet established: endpoint -> (its handle, when a REQ_RCVD
        # one is reclaimed); the listen's share of the agent's memory is bounded by these.
        # Weak both ways: an endpoint released or a handle dropped leaves the table alone.
        self._half_open: weakref.WeakKeyDictionary[CepIo, tuple[weakref.ref[CmConn], float]]
        self._half_open = weakref.WeakKeyDictionary()
        self._sweep_at: float | None = None
        self.svc_id = svc_id
        self.ca_guid = ca_guid
        self.port_guid = port_guid
        self.lid = lid
        self.pkey = pkey
        self.compare_offset = compare_offset
        self.compare_buf = bytes(compare_buf)
        self.ud = ud
        self.on_incoming = on_incoming
        self.record = record
        self.on_error: Callable[[ListenHandle, Status], object] | None = None
        """The request it was made from (``ibal.cm.records.CmListen``), if any."""
        self.info: dict[str, Any] = {}
        """What the API layer keeps (callbacks, the listen record)."""
        self._listed = False
        super().__init__(al, context=context)
        try:
            agent.add_listen(self)
        except BaseException:
            with contextlib.suppress(IbError):
                self.destroy()
            raise
        self._listed = True

    def __repr__(self) -> str:
        return f"<ListenHandle 0x{self.svc_id:016x}{' UD' if self.ud else ''}>"

    def cancel(self, destroy_cb: DestroyCallback | None = None) -> None:
        """``ib_cm_cancel``: stop listening; ``destroy_cb(context)`` once no REQ callback
        runs any more (``InvalidHandle`` if already cancelled)."""
        self.destroy(destroy_cb)

    def cm_incoming(self, cep: CepIo, fields: dict[str, Value]) -> CmConn | None:
        """Under the agent's lock: the handle of a new passive endpoint, or ``None`` when the
        listen is going away."""
        if not self.alive:
            return None
        try:
            conn = CmConn(self.al, self.agent, active=False, context=self.context)
        except IbError:
            return None
        conn.attach(cep)
        conn.info["listen"] = self
        if self.on_incoming is not None:
            self.on_incoming(self, conn, fields)
        return conn

    # ------------------------------------------------------------------ backlog
    def admits(self) -> bool:
        """Under the agent's lock, for a new REQ: room in the backlog (after reclaiming)."""
        self._prune()
        if len(self._half_open) < self.backlog:
            return True
        self.sweep()
        if len(self._half_open) < self.backlog:
            return True
        self.stats["refused_backlog"] += 1
        return False

    def track(self, cep: CepIo, conn: CmConn, fields: dict[str, Value]) -> None:
        """Count ``cep`` against the backlog until it is established or gone.

        Unanswered (REQ_RCVD) it is rejected "timeout" once the active side has given
        up waiting for a REP: its REQ's remote CM response time-out times its tries.
        """
        t = int(fields.get("remote_cm_response_timeout", 31))
        tries = int(fields.get("max_cm_retries", 15)) + 1
        now = self.al.timers.clock.now()
        deadline = now + cm_ms(t) * tries / 1000
        self._half_open[cep] = (weakref.ref(conn), deadline)
        if self._sweep_at is None or deadline < self._sweep_at:
            self._arm(deadline)

    def _arm(self, at: float) -> None:
        self._sweep_at = at
        with contextlib.suppress(IbError):  # the AL is closing: so is the listen
            self.al.timers.call_later(max(at - self.al.timers.clock.now(), 0.0), self._tick,
                                      owner=self)  # fmt: skip

    def _tick(self) -> None:
        self._sweep_at = None
        if self.alive:
            self.sweep()

    def _prune(self) -> None:
        for cep in [c for c in self._half_open if getattr(c.machine, "state", None)
                    not in _HALF_OPEN]:  # fmt: skip
            self._half_open.pop(cep, None)

    def sweep(self) -> None:
        """Forget established or closed endpoints; reject unanswered ones past their time."""
        from ibal.cm import ops
        from ibal.cm.records import CmRej

        now = self.al.timers.clock.now()
        due: list[CmConn] = []
        nxt: float | None = None
        for cep, (ref, deadline) in list(self._half_open.items()):
            state = getattr(cep.machine, "state", None)
            conn = ref()
            if state not in _HALF_OPEN or conn is None:
                del self._half_open[cep]
            elif state is CmState.REQ_RCVD and now >= deadline:
                del self._half_open[cep]
                due.append(conn)
            elif state is CmState.REQ_RCVD:
                nxt = deadline if nxt is None else min(nxt, deadline)
        for conn in due:
            with contextlib.suppress(IbError):  # answered or gone meanwhile
                ops.reject(conn, CmRej(rej_status=RejReason.TIMEOUT))
                self.stats["reclaimed"] += 1
        if nxt is not None and (self._sweep_at is None or nxt < self._sweep_at):
            self._arm(nxt)

    @property
    def half_open(self) -> int:
        """Passive endpoints of this listen not established yet (what the backlog bounds)."""
        return len(self._half_open)

    def cm_error(self, reason: Status) -> None:
        """PnP queue: a local change invalidated the listen: ``on_error(handle, reason)`` on
        the misc queue (IBAL's ``pfn_listen_err_cb``); the listen stays registered."""
        if self.on_error is not None:
            self.post_callback(self.on_error, self, reason)

    def on_destroying(self) -> None:
        self._half_open.clear()
        with contextlib.suppress(IbError):
            self.al.timers.cancel_owner(self)
        if self._listed:
            self.agent.remove_listen(self)
