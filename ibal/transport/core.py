"""One QP's sans-IO transport core: requester, completer and responder together.

The driver (the provider's socket layer, or a test harness) calls:

* :meth:`QpCore.post_send` for each send WR (receive WRs stay in the
  provider's queue, reached through :class:`~ibal.transport.qp.RecvSource`);
* :meth:`QpCore.receive` for each packet whose destination QPN is this QP
  (ICRC, IP addresses and QPN lookup are the caller's);
* :meth:`QpCore.poll` to take the packets to send now (responses first);
* :meth:`QpCore.handle_timer` when :meth:`QpCore.next_deadline` has passed;

and empties ``core.out`` (completions, async events).  Nothing blocks, nothing
reads a clock: ``now`` is passed in, in seconds.  One thread drives a core.
Where the IBA text and kernel rxe differ, the core follows the
:class:`~ibal.transport.policy.TransportPolicy` it was built with.
"""

from __future__ import annotations

from collections.abc import Callable

from ibal.transport.completer import Completer
from ibal.transport.policy import RXE_POLICY, TransportPolicy
from ibal.transport.qp import Counters, MemoryAccess, Output, QpConfig, RecvSource
from ibal.transport.requester import Requester
from ibal.transport.responder import Responder
from ibal.transport.rules import pkey_match
from ibal.transport.uc import UcResponder
from ibal.transport.ud import UdResponder
from ibal.transport.wc import make_wc
from ibal.types import AsyncEvent, QpState, QpType, RecvOpt, SendWr, WcStatus, WcType
from ibal.wire import packet as P
from ibal.wire.packet import Packet, Train, WqeRun

_RTR = QpState.RTR
_RTS = QpState.RTS
_SQD = QpState.SQD
_SQERR = QpState.SQERR
_ERROR = QpState.ERROR
_REQUEST = P.REQUEST
_RESPONSE = P.RESPONSE

_TRANSPORT = {
    QpType.RC: P.TRANSPORT_RC,
    QpType.UC: P.TRANSPORT_UC,
    QpType.UD: P.TRANSPORT_UD,
    QpType.QP1: P.TRANSPORT_UD,
}

DEFAULT_BUDGET = 64


class QpCore:
    """Transport state machine of one RC, UC, UD or GSI QP."""

    def __init__(self, cfg: QpConfig, mem: MemoryAccess, rq: RecvSource,
                 counters: Counters | None = None,
                 policy: TransportPolicy = RXE_POLICY) -> None:
        if cfg.qp_type not in _TRANSPORT:
            raise ValueError(f"rxe has no {cfg.qp_type.name} QPs")
        self.cfg = cfg
        self.policy = policy
        self.mem = mem
        self.rq = rq
        self.counters = counters if counters is not None else Counters()
        self.out = Output()
        self.transport = _TRANSPORT[cfg.qp_type]
        self._build()

    def _build(self) -> None:
        """Fresh requester, completer and responder state (creation and RESET)."""
        cfg = self.cfg
        mem = self.mem
        rq = self.rq
        policy = self.policy
        self.comm_est = False
        self.req = Requester(cfg, mem, self.out, self.counters, self._fatal, policy)
        self.comp: Completer | None = None
        self.resp: Responder | UdResponder
        if cfg.qp_type is QpType.RC:
            self.resp = Responder(cfg, mem, rq, self.out, self.counters, self.to_error, policy)
            self.comp = Completer(self.req, cfg, self.counters, policy)
        elif cfg.qp_type is QpType.UC:
            self.resp = UcResponder(cfg, mem, rq, self.out, self.counters, self.to_error,
                                    policy)
        else:
            self.resp = UdResponder(cfg, mem, rq, self.out, self.counters)

    # ------------------------------------------------------------------ verbs
    def set_state(self, state: QpState) -> None:
        """``modify_qp`` moved the QP (already validated against the IBA table)."""
        old = self.cfg.state
        if state is old:
            return
        if state is _ERROR:
            self.to_error()
            return
        if state is QpState.RESET:
            # IBA: RESET empties the queues without completions
            self.req.sq.clear()
            self.rq.drain()
            self.cfg.state = state
            self._build()
            return
        self.cfg.state = state
        if state is _RTS:
            self.req.reset_retries()
        elif state is _SQD:
            self.req.sqd_notify = True
            self.req.check_drained()

    def set_psns(self, sq_psn: int | None = None, rq_psn: int | None = None) -> None:
        if sq_psn is not None:
            self.cfg.sq_psn = sq_psn
            self.req.set_psn(sq_psn)
        if rq_psn is not None:
            self.cfg.rq_psn = rq_psn
            if isinstance(self.resp, Responder):
                self.resp.set_psn(rq_psn)

    def post_send(self, wr: SendWr, inline: bytes | None = None,
                  inv_rkey: int | None = None,
                  local: Callable[[], WcStatus] | None = None) -> None:
        """Queue a send WR; in ERROR it completes WR_FLUSHED_ERR at once."""
        self.req.post(wr, inline, inv_rkey, local)
        if self.cfg.state is _ERROR or self.cfg.state is _SQERR:
            self.req.flush()

    def recv_posted(self) -> None:
        """A receive WR was posted: in ERROR it is flushed at once."""
        if self.cfg.state is _ERROR:
            self._flush_recv()

    # ---------------------------------------------------------------- packets
    def receive(self, pkt: Packet, now: float) -> None:
        """Process one packet addressed to this QP."""
        counters = self.counters
        counters.rcvd_pkts += 1
        op = pkt.opcode
        flags = P.OP_FLAGS[op] if 0 <= op < 256 else 0
        if not flags:
            counters.drop("bad_opcode")
            return
        if op & P.TRANSPORT_MASK != self.transport:
            counters.drop("wrong_transport")
            return
        cfg = self.cfg
        state = cfg.state
        if state is not _RTS and state is not _RTR and state is not _SQD and state is not _SQERR:
            counters.drop("qp_state")
            return
        if pkt.pkey != cfg.pkey and not pkey_match(pkt.pkey, cfg.pkey):
            counters.drop("pkey")
            return
        if state is _RTR and not self.comm_est:
            self.comm_est = True
            self.out.events.append(AsyncEvent.QP_COMM)
        if flags & _RESPONSE:
            comp = self.comp
            if comp is None:
                counters.drop("wrong_transport")
                return
            comp.receive(pkt, now)
        else:
            self.resp.receive(pkt)

    def poll(self, now: float, budget: int = DEFAULT_BUDGET) -> list[Packet]:
        """The packets to send now, at most ``budget``: responses, then requests."""
        out: list[Packet | Train | WqeRun] = []
        self._poll(now, budget, out, False)
        return out  # type: ignore[return-value]  # no Train without ``trains``

    def poll_trains(
        self, now: float, budget: int = DEFAULT_BUDGET, runs: bool = False
    ) -> tuple[list[Packet | Train | WqeRun], int]:
        """:meth:`poll`, with runs of MIDDLE request packets as one :class:`Train`
        each (``runs``: a SEND/WRITE's packets as one :class:`WqeRun`); (what to
        send, how many packets that is)."""
        out: list[Packet | Train | WqeRun] = []
        return out, self._poll(now, budget, out, True, runs)

    def _poll(self, now: float, budget: int, out: list[Packet | Train | WqeRun], trains: bool,
              runs: bool = False) -> int:
        resp = self.resp
        got = 0
        if isinstance(resp, Responder) and len(resp.responses):
            got = resp.responses.poll(budget, out, trains)
        if got < budget and self.cfg.state is not _ERROR:
            got += self.req.poll(now, budget - got, out, trains, runs)
        self.counters.sent_pkts += got
        return got

    # ----------------------------------------------------------------- timers
    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` must next run (None: no timer armed)."""
        a = self.req.ack_deadline
        r = self.req.rnr_deadline
        if a is None:
            return r
        if r is None:
            return a
        return min(a, r)

    def handle_timer(self, now: float) -> None:
        if self.comp is not None:
            self.comp.handle_timer(now)

    # ----------------------------------------------------------------- errors
    def _fatal(self) -> None:
        if self.cfg.qp_type is QpType.RC:
            self.to_error()
        else:
            self.to_sq_error()

    def to_error(self) -> None:
        """Enter ERROR: complete what finished, flush every other send and receive WQE."""
        if self.cfg.state is _ERROR:
            return
        self.cfg.state = _ERROR
        self.req.flush()
        if isinstance(self.resp, Responder):
            wr_id = self.resp.flush_target()
            if wr_id is not None:
                self._flush_one(wr_id)
        self._flush_recv()

    def to_sq_error(self) -> None:
        """UC/UD send-queue error: SQE state, sends flushed, receives go on."""
        if self.cfg.state is _ERROR or self.cfg.state is _SQERR:
            return
        self.cfg.state = _SQERR
        self.req.flush()

    def _flush_recv(self) -> None:
        for wr_id in self.rq.drain():
            self._flush_one(wr_id)

    def _flush_one(self, wr_id: int) -> None:
        self.out.recv_wcs.append((make_wc(wr_id, WcType.RECV, WcStatus.WR_FLUSHED_ERR, 0, None,
                                          RecvOpt.NONE, self.cfg.qpn), False))
