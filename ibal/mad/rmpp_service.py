"""RMPP for a MAD service: :class:`RmppSessions` over
:class:`~ibal.transport.rmpp_io.RmppTransfers`.

``enable_rmpp(service, timers)`` plugs the sans-IO sender/receiver into a
service's RMPP seam.  An RMPP element is laid out as one long MAD: the 24-byte
common header, 12 bytes for the RMPP header (the sessions fill it per
segment), the class header (``class_header_size`` bytes, repeated in every
segment) and the data.  A reassembled message comes to ``recv_cb`` in the same
layout, with the RMPP header area zero.

Threads: the driver calls back with a transfer's lock held; everything here
only queues work for the service (its callbacks run on the AL's misc queue).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

from ibal.mad.pool import MadElement
from ibal.mad.service import MadService
from ibal.transport.rmpp import Complete, Deliver, Fail, RmppSender
from ibal.transport.rmpp_io import Result, RmppTransfers, Timers
from ibal.types import MadAddr, WcStatus
from ibal.wire.mad.rmpp import RMPP_DATA, RmppStatus

RMPP_DATA_OFFSET = RMPP_DATA  # the common header (24) and the RMPP header (12)


class TransferSessions:
    """One service's RMPP transfers, keyed by the service's transaction key."""

    def __init__(self, service: MadService, timers: Timers, class_header_size: int = 0) -> None:
        self.service = service
        self.class_header_size = class_header_size
        self.transfers = RmppTransfers(timers, self._on_result, class_header_size)
        self._lock = threading.Lock()
        self._sending: dict[Hashable, MadElement] = {}
        self._peers: dict[Hashable, MadAddr] = {}
        self.failed = 0
        """Transfers this end received that failed (ABORT/STOP either way)."""

    def start(self, key: Hashable, element: MadElement, send: Callable[[bytes], None]) -> None:
        mad, chs = bytes(element.mad), self.class_header_size
        sender = RmppSender(
            header=mad[:24],
            data=mad[RMPP_DATA_OFFSET + chs :],
            class_header=mad[RMPP_DATA_OFFSET : RMPP_DATA_OFFSET + chs],
            resp_timeout=(element.timeout_ms or 1000) / 1000,
            retries=element.retry_cnt,
        )
        assert element.addr is not None
        with self._lock:
            self._sending[key] = element
            self._peers[key] = element.addr
        try:
            self.transfers.send(key, sender, send)
        except ValueError:
            with self._lock:
                self._sending.pop(key, None)
            raise

    def feed(self, key: Hashable, mad: bytes, addr: MadAddr, send: Callable[[bytes], None]
             ) -> bool:
        with self._lock:
            self._peers.setdefault(key, addr)
        return self.transfers.feed(key, mad, send)

    def _on_result(self, key: Hashable, result: Result) -> None:
        with self._lock:
            if isinstance(result, Deliver):
                element, addr = None, self._peers.pop(key, None)
            else:
                element, addr = self._sending.pop(key, None), self._peers.get(key)
                if not (isinstance(result, Complete) and result.switch):
                    self._peers.pop(key, None)  # a switch keeps it for the answer's receiver
        if isinstance(result, Deliver):
            whole = result.header + bytes(12) + result.class_header + result.data
            if addr is not None:
                self.service.rmpp_message_in(whole, addr)
            return
        if element is None:
            if isinstance(result, Fail):
                self.failed += 1
            return
        if isinstance(result, Complete):
            self.service.rmpp_send_done(element, WcStatus.SUCCESS, answered=result.switch)
        else:
            timed_out = result.status in (RmppStatus.TOO_MANY_RETRIES,
                                          RmppStatus.TOTAL_TIME_TOO_LONG)
            self.service.rmpp_send_done(
                element, WcStatus.TIMEOUT_RETRY_ERR if timed_out else WcStatus.REM_OP_ERR
            )


def enable_rmpp(service: MadService, timers: Timers, class_header_size: int = 0
                ) -> TransferSessions:
    """Give ``service`` RMPP (``timers``: the AL's, e.g. ``al.timers``); returns the sessions."""
    sessions = TransferSessions(service, timers, class_header_size)
    service.rmpp = sessions
    return sessions
