"""Shared receive queues (``ib_create_srq`` and friends)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ibal.al import wrcheck
from ibal.al.obj import READY, CaObject, DestroyCallback, SyncDestroy, busy_if
from ibal.status import InvalidParameter, InvalidSetting, InvalidSrqHandle
from ibal.types import AsyncEventRec, RecvWr, SrqAttr, SrqAttrMask

if TYPE_CHECKING:
    from ibal.al.pd import Pd

EventCallback = Callable[[AsyncEventRec], object]

_MASK_VALID = int(SrqAttrMask.MAX_WR | SrqAttrMask.LIMIT)


def check_srq_attr(attr: object) -> SrqAttr:
    """``attr`` as an ``SrqAttr`` with no negative value."""
    if not isinstance(attr, SrqAttr):
        raise InvalidParameter("an SrqAttr is required")
    if not all(type(v) is int for v in (attr.max_wr, attr.max_sge, attr.srq_limit)):
        raise InvalidParameter("SRQ max_wr, max_sge and srq_limit are ints")
    if min(attr.max_wr, attr.max_sge, attr.srq_limit) < 0:
        raise InvalidSetting("SRQ attributes cannot be negative")
    return attr


class Srq(CaObject):
    """``ib_create_srq``'s handle; QPs created with it receive from it."""

    _invalid = InvalidSrqHandle
    _rank = 30
    _kind = "SRQ"

    def __init__(self, pd: Pd, event_cb: EventCallback | None, context: Any) -> None:
        super().__init__(pd, context)
        self._pd = pd
        self._event_cb = event_cb
        self._attr = SrqAttr()

    def _created(self, handle: Any, attr: SrqAttr) -> None:
        self._h, self._attr = handle, attr

    @property
    def pd(self) -> Pd:
        return self._pd

    def query(self) -> SrqAttr:
        """``ib_query_srq``."""
        self._use()
        try:
            self._attr = self._ci.query_srq(self._h)
        finally:
            self._unuse()
        return self._attr

    def modify(self, attr: SrqAttr, mask: SrqAttrMask) -> None:
        """``ib_modify_srq``: only the fields ``mask`` selects change."""
        self._check()
        attr = check_srq_attr(attr)
        if not isinstance(mask, int) or not mask or int(mask) & ~_MASK_VALID:
            raise InvalidParameter(f"bad SRQ attribute mask {mask!r}")
        self._use()
        try:
            self._ci.modify_srq(self._h, attr, SrqAttrMask(mask))
        finally:
            self._unuse()

    def post_recv(self, wrs: RecvWr | Sequence[RecvWr]) -> None:
        """``ib_post_srq_recv`` (a bad SRQ raises ``InvalidSrqHandle``, see decisions)."""
        if self._state is not READY:
            self._check()
        wrs, bad = wrcheck.recv_list(wrs)
        if bad is None or wrs:
            self._ci.post_srq_recv(self._h, wrs)
        if bad is not None:
            raise bad

    def destroy(
        self,
        destroy_cb: DestroyCallback | SyncDestroy | None = None,
        *,
        wait: bool = False,
        timeout: float | None = None,
    ) -> None:
        """``ib_destroy_srq``: ``ResourceBusy`` while QPs use it; else asynchronous."""
        self._destroy(destroy_cb, wait, timeout)

    def _check_busy(self) -> None:
        busy_if(self._dependents, "QPs")

    def _cleanup(self) -> None:
        self._ci.destroy_srq(self._h)


def created(srq: Srq, handle: Any, attr: SrqAttr) -> None:
    """The provider made ``srq``: its handle and the attributes it granted."""
    srq._created(handle, attr)
