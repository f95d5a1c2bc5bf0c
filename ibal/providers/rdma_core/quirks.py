"""Kernel rxe's deviations from what a device does, and the provider's workarounds.

Every workaround that applies to rxe only is decided here, so the verb modules
ask :class:`RxeQuirks` instead of testing for rxe themselves.  Deviations that
cannot be worked around are declared in :mod:`.caps` (``deviations``) instead.
Two things the verbs do for any device because rxe needs them are only noted
where they happen: ``resize_cq`` maps ``EINVAL`` to ``Overflow`` (rxe and mlx5
refuse a size below the queued entries that way), and ``bind_mw`` passes a
scratch region when unbinding a window that was never bound (rxe's library
reads the region's lkey even for a zero-length bind).
"""

from __future__ import annotations

import logging
from typing import Any

from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core.handles import Qp

log = logging.getLogger("ibal.providers.rdma_core")


class RxeQuirks:
    """The rxe workarounds of one CA; all of them are off when ``active`` is False.

    Called by the verbs on the posting thread; never blocks, never raises.
    """

    def __init__(self, active: bool, name: str, qp_attr: Any, pyverbs_error: Any) -> None:
        self.active = active
        self.name = name
        self._qp_attr = qp_attr
        self._error = pyverbs_error

    @property
    def wc_with_inv(self) -> int:
        """The ``wc_flags`` bit meaning "with invalidate" (kernel rxe passes the kernel's)."""
        return C.KERNEL_WC_WITH_INVALIDATE if self.active else C.IBV_WC_WITH_INV

    @property
    def hold_sends_in_sqd(self) -> bool:
        """Hold sends posted in SQD until SQD -> RTS: rxe does not restart a drained queue."""
        return self.active

    def posted_in_error(self, qp: Qp) -> None:
        """Work was posted to ``qp`` in ERROR and must complete flushed.

        rxe's requester and responder flush only when they run, which is on a
        state change or a packet, so re-enter ERROR (a legal ERR -> ERR).
        """
        if self.active:
            self.reenter_error(qp)

    def reenter_error(self, qp: Qp) -> None:
        """Modify ``qp`` from ERROR to ERROR; a failure is logged, never raised."""
        a = self._qp_attr()
        a.qp_state = C.IBV_QPS_ERR
        try:
            qp.pv.modify(a, C.IBV_QP_STATE)
        except self._error as exc:
            log.debug("rdma_core %s: ERR -> ERR on QP %d failed: %s", self.name, qp.num, exc)
