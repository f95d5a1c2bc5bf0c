"""Per-device counters: kernel rxe's ``hw_counters`` names, drops per reason, socket I/O.

One :class:`DeviceCounters` per device.  The transport core increments the
``hw_counters`` attributes (``counters.sent_pkts += n``) and calls
:meth:`DeviceCounters.drop` with a reason string; the socket layer counts
datagrams, batches and its own drops.  Increments are plain ``int`` attribute
updates (no locks): two threads incrementing the same counter at once may
lose a count, which a statistic tolerates and a data path lock would not.
:meth:`DeviceCounters.snapshot` gives everything as a flat ``dict`` for
``ibal info``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from ibal.transport.qp import Counters

#: Kernel rxe's counters in its order (``rxe_hw_counters.c``), same meaning here.
HW_COUNTERS: Final = (
    "sent_pkts",  # RoCE packets sent
    "rcvd_pkts",  # RoCE packets received (before transport checks)
    "duplicate_request",  # responder saw a request PSN it already executed
    "out_of_seq_request",  # responder saw a request PSN past the expected one
    "rcvd_rnr_err",  # requester received an RNR NAK
    "send_rnr_err",  # responder sent an RNR NAK
    "rcvd_seq_err",  # requester received a PSN sequence error NAK
    "ack_deferred",  # completer work deferred (kernel: completer scheduled)
    "retry_exceeded_err",  # retry_cnt exhausted
    "retry_rnr_exceeded_err",  # rnr_retry exhausted
    "completer_retry_err",  # completer started a retry
    "send_err",  # a datagram the socket refused to send
    "link_downed",  # port went from ACTIVE to DOWN
    "rdma_sends",  # RDMA WRITE/READ requests sent
    "rdma_recvs",  # RDMA WRITE/READ requests received
)

#: Socket-layer counters (ibal's own; kernel rxe has none of these).
IO_COUNTERS: Final = (
    "rx_datagrams",  # UDP datagrams read from the sockets
    "rx_bytes",
    "rx_batches",  # receive system calls that returned datagrams
    "tx_datagrams",
    "tx_bytes",
    "tx_batches",  # send system calls
    "rx_fast",  # packets the C engine's receive fast path landed (fastrx.py)
)

#: Drop reasons the socket layer itself uses (besides the codec's ``DropReason`` values).
IO_DROPS: Final = (
    "truncated",  # datagram larger than the receive buffer
    "not_roce",  # raw path: not UDP to port 4791 of this device (filter race)
    "ip_options",  # raw path: IPv4 header with options (rxe never sends them)
    "handler_error",  # the CA layer's callback raised
    "qp_fault",  # a QP core raised on a work request (the QP goes to ERROR, the thread lives)
)


class DeviceCounters(Counters):
    """Counters of one device; attribute increments, per-reason drops, a snapshot.

    A :class:`~ibal.transport.qp.Counters` (what the transport core of
    every QP of the device counts into) with kernel rxe's other counters and
    the socket layer's.
    """

    __slots__ = ("ack_deferred", "link_downed", "send_err", *IO_COUNTERS)

    ack_deferred: int
    send_err: int
    link_downed: int
    rx_datagrams: int
    rx_bytes: int
    rx_batches: int
    tx_datagrams: int
    tx_bytes: int
    tx_batches: int

    def __init__(self, drop_reasons: Iterable[str] = ()) -> None:
        super().__init__()
        for name in HW_COUNTERS:
            setattr(self, name, 0)
        for name in IO_COUNTERS:
            setattr(self, name, 0)
        # reasons listed up front show as 0 in a snapshot
        self.drops.update(dict.fromkeys((*known_drop_reasons(), *drop_reasons), 0))

    def drop(self, reason: str, n: int = 1) -> None:
        """Count ``n`` packets dropped for ``reason`` (any short snake_case word)."""
        d = self.drops
        d[reason] = d.get(reason, 0) + n

    @property
    def dropped(self) -> int:
        """All drops, every reason."""
        return sum(self.drops.values())

    def snapshot(self) -> dict[str, int]:
        """Every counter by name; drops as ``drop_<reason>``."""
        out = {name: getattr(self, name) for name in HW_COUNTERS}
        out.update((name, getattr(self, name)) for name in IO_COUNTERS)
        out.update((f"drop_{r}", n) for r, n in self.drops.items())
        return out

    def hw_counters(self) -> dict[str, int]:
        """Only the counters kernel rxe also has (``ports/1/hw_counters`` in sysfs)."""
        return {name: getattr(self, name) for name in HW_COUNTERS}


def known_drop_reasons() -> tuple[str, ...]:
    """The codec's :class:`~ibal.providers.rxe.wire.DropReason` values and the socket layer's."""
    from ibal.wire.iba import DropReason

    return (*(r.value for r in DropReason), *IO_DROPS)
