"""One CM connection in the user's AL: :class:`CmConn` (IBAL's ``ib_cm_handle_t``).

The same handle serves every step of a connection (IBAL's ``h_cm_req``,
``h_cm_rep``, ``h_cm_dreq``, ``h_cm_lap`` are all one CEP).  It is a
:class:`~ibal.al.Dependent` of the user's AL instance, and once it has a QP a
small link object hangs on that QP too: closing the AL or destroying the QP
tears the connection down (the machine sends what the state asks for, DREQ
or REJ, and no callback comes any more).

The agent (``ibal.cm.service``) calls :meth:`CmConn.cm_modify` and
:meth:`CmConn.cm_upcall` under its lock, in the machine's order: QP changes
happen there and then (through the AL's ``qp.modify_validated``: attributes
derived by ``ibal.cm.wire`` from the REQ/REP and the path, checked as they
were derived, so the AL does not check each field again); callbacks are
posted to the AL's misc queue, where :attr:`CmConn.deliver` (the API layer)
turns them into records.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ibal.al import Dependent, StashKey
from ibal.cm import fsm
from ibal.status import IbError, InvalidHandle, InvalidState
from ibal.types import AsyncEvent, AsyncEventRec, QpMod, QpState

if TYPE_CHECKING:
    from ibal.al import AccessLayer, Qp
    from ibal.cm.service import CepIo, CmAgent

__all__ = ["CmConn", "connection_of"]

log = logging.getLogger("ibal.cm")

ModsFor = Callable[["CmConn", QpState], list[QpMod]]
_CONN: StashKey[CmConn] = StashKey()


def connection_of(qp: Qp) -> CmConn | None:
    """The live CM connection of ``qp`` (``ib_cm_dreq``/``ib_cm_lap`` name the QP)."""
    conn = qp.stash.get(_CONN, None)
    return conn if conn is not None and conn.alive else None


class _QpLink(Dependent):
    """Hangs on the connection's QP: the QP's destroy takes the connection along."""

    _kind = "CM connection's QP link"

    def __init__(self, qp: Qp, conn: CmConn) -> None:
        self.conn = conn
        super().__init__(qp)

    def on_destroying(self) -> None:
        conn = self.conn
        if conn.alive:
            with contextlib.suppress(IbError):
                conn.destroy()


class CmConn(Dependent):
    """A connection endpoint's handle (see the module docstring)."""

    _kind = "CM connection"

    def __init__(self, al: AccessLayer, agent: CmAgent, *, active: bool, context: Any = None,
                 ) -> None:  # fmt: skip
        self.agent = agent
        self._active = active
        self.cep: CepIo | None = None
        self.qp: Qp | None = None
        self._link: _QpLink | None = None
        self.deliver: Callable[[CmConn, fsm.Deliver], object] | None = None
        """The API layer's upcall handler (misc queue)."""
        self.answer: Callable[[CmConn, fsm.Deliver], object] | None = None
        """The API layer's own answer to an upcall (no user code: the Pythonic shape's RTU
        and DREP), run under the agent's lock on the thread the message came on, before
        the upcall is posted: the answer leaves without a hop to the misc queue."""
        self.mods_for: ModsFor | None = None
        """The API layer's QP attribute derivation: the QpMods that reach a target state."""
        self.info: dict[str, Any] = {}
        """What the API layer keeps for the connection's life (path, local PSN, callbacks...)."""
        self.sync_done: threading.Event | None = None
        self._unlisten: Callable[[], None] | None = None
        super().__init__(al, context=context)

    def __repr__(self) -> str:
        side = "active" if self.active else "passive"
        return f"<CmConn {side} {self.cep!r}>"

    @property
    def active(self) -> bool:
        """The active side (it sent the REQ that won; a peer-to-peer REQ may turn passive)."""
        cep = self.cep
        return bool(getattr(cep.machine, "active", self._active)) if cep else self._active

    @property
    def state(self) -> fsm.CmState:
        """The machine's state (``CLOSED`` once released)."""
        cep = self.cep
        if cep is None or self.agent.find(cep.local_comm_id) is not cep:
            return fsm.CmState.CLOSED
        state = cep.state
        return state if isinstance(state, fsm.CmState) else fsm.CmState.CLOSED

    def attach(self, cep: CepIo) -> None:
        self.cep = cep
        cep.user = self

    def bind_qp(self, qp: Qp) -> None:
        """The connection's QP (its destroy tears the connection down)."""
        if self.qp is qp:
            return
        if self.qp is not None:
            raise InvalidState("the connection has a QP already")
        self.qp = qp
        self._link = _QpLink(qp, self)
        qp.stash[_CONN] = self
        # "Communication established" (data before the RTU) completes the passive side.
        self._unlisten = qp.add_event_listener(self._on_qp_event)

    def _on_qp_event(self, rec: AsyncEventRec) -> None:
        """Misc queue: the QP's async events; COMM_EST drives the machine (a lost RTU)."""
        cep = self.cep
        if rec.code is AsyncEvent.QP_COMM and cep is not None and self.alive:
            with contextlib.suppress(InvalidState):
                cep.handle(fsm.QpEstablished())

    def handle(self, event: Any) -> None:
        """Feed an API event to the machine (``InvalidState`` when it is not allowed now)."""
        self.check()
        cep = self.cep
        if cep is None:
            raise InvalidState("the connection has no endpoint")
        cep.handle(event)

    # ------------------------------------------------------------------ from the agent
    def cm_modify(self, cep: CepIo, target: Any) -> None:
        """Under the agent's lock: move the QP as the machine says."""
        qp = self.qp
        if qp is None or not isinstance(target, QpState):
            return
        try:
            if target is QpState.ERROR:
                if qp.state not in (QpState.RESET, QpState.ERROR):
                    qp.modify(QpMod(QpState.ERROR))
                return
            mods = self.mods_for(self, target) if self.mods_for is not None else []
            for mod in mods:  # built by ibal.cm.wire from checked messages and paths
                qp.modify_validated(mod)
        except (IbError, InvalidHandle) as exc:
            log.info("%r: QP to %s failed: %s", self, target.name, exc)
            self.info["qp_error"] = exc

    def cm_upcall(self, cep: CepIo, upcall: fsm.Deliver) -> None:
        """Under the agent's lock: queue the callback on the misc queue (dropped once dying),
        after :attr:`answer` once the machine's actions are carried out."""
        if self.deliver is None:
            return
        answer = self.answer
        if answer is None:
            self._post_upcall(upcall)
            return

        def answer_then_post() -> None:
            try:
                answer(self, upcall)
            finally:
                self._post_upcall(upcall)

        self.agent.after_run(answer_then_post)

    def _post_upcall(self, upcall: fsm.Deliver) -> None:
        if not self.post_callback(self._run_upcall, upcall):
            self._sync_release()

    def _run_upcall(self, upcall: fsm.Deliver) -> None:
        self.info["answered"] = True
        try:
            if self.deliver is not None:
                self.deliver(self, upcall)
        finally:
            self._sync_release()

    def _sync_release(self) -> None:
        done = self.sync_done
        if done is not None:
            self.sync_done = None
            done.set()

    # ------------------------------------------------------------------ teardown
    def on_destroying(self) -> None:
        cep = self.cep
        if cep is not None:
            self.agent.forget_user(cep)
        self._sync_release()
        qp = self.qp
        if qp is not None and qp.stash.get(_CONN, None) is self:
            del qp.stash[_CONN]
        unlisten, self._unlisten = self._unlisten, None
        if unlisten is not None:
            unlisten()
        link, self._link = self._link, None
        if link is not None and link.alive:
            with contextlib.suppress(IbError):
                link.destroy()
