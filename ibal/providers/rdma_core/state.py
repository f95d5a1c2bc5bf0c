"""What every group of rdma_core verbs shares: the device and its state.

:class:`CaState` is the base of the verb mixins (:mod:`.ca`, :mod:`.cq_verbs`,
:mod:`.qp_verbs`, :mod:`.srq_verbs`, :mod:`.mr_verbs`): it opens the device,
declares the state they work on (tables of live objects, the lock, counts),
and picks the data path; handle checks are :mod:`.handle_checks`'s, ports,
GIDs and AV routing :mod:`.ports`'s.  The other modules use only what these name.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any

from ibal.ci.interface import (
    Capabilities,
)
from ibal.providers.rdma_core import counters, peek, umad
from ibal.providers.rdma_core.caps import build_capabilities, is_rxe
from ibal.providers.rdma_core.errors import translate
from ibal.providers.rdma_core.events import EventLoop
from ibal.providers.rdma_core.fastpath import (
    DATAPATH_ENV,
    Ops,
    OpsUnavailable,
)
from ibal.providers.rdma_core.handle_checks import HandleChecks
from ibal.providers.rdma_core.handles import (
    CaHandle,
    Cq,
    Pd,
    Qp,
    Srq,
)
from ibal.providers.rdma_core.ipmcast import IpMemberships
from ibal.providers.rdma_core.nethdr import ReceiveAreas
from ibal.providers.rdma_core.ports import PortQueries
from ibal.providers.rdma_core.quirks import RxeQuirks
from ibal.providers.rdma_core.wr import (
    PyverbsApi,
    RecvTokens,
    SqAccount,
)

log = logging.getLogger("ibal.providers.rdma_core")


class CaState(HandleChecks, PortQueries):
    """The device and the state the verb mixins share (see the module docstring)."""

    def __init__(self, pv: Any, name: str, guid: int, *, layout: peek.Layout | None) -> None:
        self.pv = pv
        self.name = name
        self.guid = guid
        self.layout = layout
        self._errs = pv.pyverbs_error
        self.api = PyverbsApi(
            pv.wr.SendWR,
            pv.wr.SGE,
            pv.wr.RecvWR,
            self._errs.PyverbsRDMAError,
            adopt_sge=layout.adopt_sge if layout is not None else None,
            free=peek.libc_free,
            set_bind_rkey=layout.set_bind_rkey if layout is not None else None,
        )
        self.ctx = pv.device.Context(name=name)
        try:
            self._setup()
        except BaseException:
            self.ctx.close()
            raise

    def _setup(self) -> None:
        pv, layout = self.pv, self.layout
        self.dev = self.ctx.query_device()
        self.vendor_id = int(self.dev.vendor_id)
        self.device_id = int(self.dev.vendor_part_id)
        self.revision = int(self.dev.hw_ver)
        self._lock = threading.RLock()
        self._open: CaHandle | None = None
        self._loop: EventLoop | None = None
        self._pds: set[Pd] = set()
        self._cqs: dict[int, Cq] = {}
        self._qps: dict[int, Qp] = {}
        self._srqs: dict[int, Srq] = {}
        self._ud_qpns: set[int] = set()
        self._areas = ReceiveAreas()
        self._errored: set[int] = set()  # QPs with an error completion since the last look
        self._sq_accts: dict[int, SqAccount] = {}
        self.tokens = RecvTokens()
        self._ports = {}
        self._max_inline = None
        self._gid_total = 0
        self._n = dict.fromkeys(("pd", "cq", "qp", "srq", "av", "mr", "mw"), 0)
        self._mcast_lib: peek.Multicast | None = None
        self._ip_groups = IpMemberships()
        self.notes: list[str] = []
        self._async_ok = False
        if layout is not None:
            try:
                layout.check_async_event(pv.device.AsyncEvent)
                layout.async_fd(self.ctx)
                self._async_ok = True
            except peek.PeekError as exc:
                self.notes.append(f"async events unavailable: {exc}")
        else:
            self.notes.append("async events unavailable: pyverbs layout not recognised")
        self._umad: umad.UmadAgents | None = None
        self._caps = build_capabilities(
            self.dev,
            self._port_link_layers(),
            self._multicast_reason(),
            self.name,
            umad.availability(self.name),
            counters.availability(self.name),
        )
        self.rxe = is_rxe(self.dev, self.name)
        """Kernel rxe: its workarounds (SQD hold, ERROR re-entry) apply to it only."""
        self.quirks = RxeQuirks(self.rxe, self.name, pv.qp.QPAttr, self._errs.PyverbsError)
        self.ops: Ops | None = self._load_ops()
        self.datapath = "ctypes" if self.ops is not None else "pyverbs"

    # ---------------------------------------------------------- identity
    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    def _load_ops(self) -> Ops | None:
        """libibverbs' data-path slots, validated (see fastpath.py), or None."""
        mode = os.environ.get(DATAPATH_ENV, "auto").strip().lower() or "auto"
        if mode not in ("auto", "ctypes", "pyverbs"):
            raise ValueError(f"{DATAPATH_ENV}={mode!r}: expected auto, ctypes or pyverbs")
        if mode == "pyverbs":
            self.notes.append(f"data path: pyverbs ({DATAPATH_ENV}=pyverbs)")
            return None
        why = ""
        ops = None
        if self.layout is None:
            why = "pyverbs layout not recognised"
        else:
            try:
                ops = Ops(self.layout.context_ptr(self.ctx))
                cq = self.pv.cq.CQ(self.ctx, 1, None, None, 0)
                try:
                    ops.check_poll(self.layout.cq_ptr(cq, self.ctx))
                finally:
                    cq.close()
            except (OpsUnavailable, peek.PeekError, self._errs.PyverbsError) as exc:
                why = str(exc)
                ops = None
        if ops is None:
            if mode == "ctypes":
                raise OpsUnavailable(
                    f"{DATAPATH_ENV}=ctypes but the dispatch table is unusable: {why}"
                )
            self.notes.append(f"data path: pyverbs (ctypes path unavailable: {why})")
        return ops

    def _multicast_reason(self) -> str | None:
        if self.layout is None:
            return "the ibv_qp pointer ibv_attach_mcast needs is not reachable in this pyverbs"
        try:
            self._mcast_lib = peek.Multicast()
        except (OSError, AttributeError) as exc:
            return f"libibverbs.so.1 not loadable through ctypes: {exc}"
        return None

    def release(self) -> None:
        """Close the device (provider stop): stops events, pyverbs closes the rest."""
        with self._lock:
            loop, self._loop = self._loop, None
            if self._open is not None:
                self._open.alive = False
                self._open = None
        if loop is not None:
            loop.stop()
        self._ip_groups.close()
        with contextlib.suppress(Exception):
            self.ctx.close()

    def _retire(self, obj: Any, destroy: Any, what: str, fd: int | None = None) -> None:
        """Destroy ``obj`` with no upcall for it afterwards; on failure it stays usable."""
        loop = self._loop
        try:
            if loop is not None:
                loop.retire(obj, destroy, fd)
            else:
                obj.alive = False
                destroy()
        except self._errs.PyverbsError as exc:
            obj.alive = True
            raise translate(exc, what) from exc
        obj.alive = False

    def completion_upcall(self, cq: Cq) -> None:
        """Call the open CA's completion callback for ``cq`` (no lock held)."""
        h = self._open
        if h is not None:
            h.completion_cb(cq.context)
