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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ibal.al import Dependent
from ibal.cm.conn import CmConn
from ibal.status import IbError, Status
from ibal.wire.fields import Value

if TYPE_CHECKING:
    from ibal.al import AccessLayer, DestroyCallback
    from ibal.cm.service import CepIo, CmAgent

__all__ = ["ListenHandle"]

Incoming = Callable[["ListenHandle", CmConn, dict[str, Value]], None]


class ListenHandle(Dependent):
    """One listen (IBAL's ``ib_listen_handle_t``, see the module docstring); ``cancel`` is
    ``ib_cm_cancel``."""

    _kind = "CM listen"

    def __init__(self, al: AccessLayer, agent: CmAgent, *, svc_id: int, ca_guid: int = 0,
                 port_guid: int = 0, lid: int = 0, pkey: int = 0, compare_offset: int = 0,
                 compare_buf: bytes = b"", ud: bool = False, context: Any = None,
                 on_incoming: Incoming | None = None, record: Any = None) -> None:  # fmt: skip
        self.agent = agent
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

    def cm_error(self, reason: Status) -> None:
        """PnP queue: a local change invalidated the listen: ``on_error(handle, reason)`` on
        the misc queue (IBAL's ``pfn_listen_err_cb``); the listen stays registered."""
        if self.on_error is not None:
            self.post_callback(self.on_error, self, reason)

    def on_destroying(self) -> None:
        if self._listed:
            self.agent.remove_listen(self)
