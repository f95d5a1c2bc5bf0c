"""The data path of a queue pair: posting work requests and draining the queues.

:class:`QpWork` is the part of :class:`~ibal.al.qp.Qp` that moves work (``post_send``,
``post_recv``, ``drain``); ``Qp`` adds creation, attributes, the state machine, events
and multicast.  A provider sees only ``post_send``/``post_recv`` calls with its own
handles (AVs, windows, regions translated here).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ibal import qp_fsm
from ibal.al import ranges, wrcheck
from ibal.al.av import Av
from ibal.al.bases import QpBase
from ibal.al.cq import Cq
from ibal.al.obj import READY, is_handle_of
from ibal.status import (
    IbError,
    InvalidParameter,
    InvalidQpState,
    PostError,
    Status,
    Timeout,
    post_error,
)
from ibal.types import (
    INVALIDATE_WR_TYPES,
    AvAttr,
    BindWr,
    Grh,
    LinkLayer,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    UdDest,
    Wc,
    WrType,
)

if TYPE_CHECKING:
    from ibal.al.srq import Srq

__all__ = ["DRAIN_RECV_WR_ID", "DRAIN_SEND_WR_ID", "QpWork"]

DRAIN_SEND_WR_ID = 0xFFFF_FFFF_D4A1_0001
"""``wr_id`` of :meth:`Qp.drain`'s marker send (kept out of the completions it returns)."""
DRAIN_RECV_WR_ID = 0xFFFF_FFFF_D4A1_0002
"""``wr_id`` of :meth:`Qp.drain`'s marker receive."""

_POST_SEND_STATES = frozenset(s for s in QpState if qp_fsm.can_post_send(s))
_RECV_STATES = frozenset(s for s in QpState if qp_fsm.can_post_recv(s))
_RAW = (QpType.RAW_IPV6, QpType.RAW_ETHER)


class QpWork(QpBase):
    """Posting and draining (the base of :class:`~ibal.al.qp.Qp`, which sets these)."""

    _send_cq: Cq
    _recv_cq: Cq
    _srq: Srq | None
    _num: int
    _port_num: int | None
    _translate: bool
    _drain_av: Av | None

    def modify(self, mod: QpMod) -> None:
        """``ib_modify_qp`` (:meth:`ibal.al.qp.Qp.modify`)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ posting
    def post_send(self, wrs: SendWr | Sequence[SendWr]) -> None:
        """``ib_post_send``; ``PostError.failed_index`` is IBAL's ``pp_failed``.

        Accepted in RTS and SQD, and in SQE and ERROR, where the provider
        completes every WR with ``WR_FLUSHED_ERR`` (IBA 10.8.3, 11.4.1.1).
        """
        if self._state is not READY:
            self._check()
        if self._qp_state not in _POST_SEND_STATES:
            raise post_error(Status.INVALID_QP_STATE, 0, f"QP is {self._qp_state.name}")
        wrs, bad, careful = wrcheck.send_list(wrs)
        if careful:
            wrs = self._prepare_ext(wrs)
        if self._translate:
            wrs = self._translate_avs(wrs)
        if bad is None or wrs:
            self._ci.post_send(self._h, wrs)
        if bad is not None:
            raise bad

    def _prepare_ext(self, wrs: Sequence[SendWr]) -> Sequence[SendWr]:
        """``wrs`` with invalidate/bind requests checked against the CA and bound to its handles.

        An opcode the CA does not list raises ``Unsupported`` (IBAL's
        IB_UNSUPPORTED) at its index, after posting the ones before it.
        """
        if not any(isinstance(wr, SendWr) and wr.opcode in INVALIDATE_WR_TYPES for wr in wrs):
            return wrs
        caps = self._cica.capabilities
        out: list[SendWr] = []
        for i, wr in enumerate(wrs):
            op = wr.opcode
            if op not in INVALIDATE_WR_TYPES:
                out.append(wr)
                continue
            why = None
            if not caps.supports_opcode(self._qp_type, WrType(op)):
                why = post_error(Status.UNSUPPORTED, i, f"{WrType(op).name}: "
                                 f"{caps.reason('opcodes')}")  # fmt: skip
            elif op == WrType.BIND_MW:
                why, wr = self._bind_wr(wr, i)
            if why is not None:
                if out:
                    self._ci.post_send(self._h, out)
                raise why
            out.append(wr)
        return out

    def _bind_wr(self, wr: SendWr, i: int) -> tuple[PostError | None, SendWr]:
        """A type 2 BIND_MW naming the provider's window and region handles."""
        from ibal.al.mr import Mr, Mw

        mw, bind = wr.mw, wr.bind
        assert bind is not None  # wrcheck saw to it
        if not is_handle_of(mw, Mw, None, self._cica):
            return post_error(Status.INVALID_MW_HANDLE, i, "BIND_MW: bad window"), wr
        if mw.mw_type != 2:
            return post_error(Status.INVALID_PARAMETER, i, "BIND_MW binds type 2 windows; "
                              "type 1 ones are bound with mw.bind()"), wr  # fmt: skip
        mr = bind.mr
        if not is_handle_of(mr, Mr, None, self._cica):
            return post_error(Status.INVALID_MR_HANDLE, i, "BIND_MW: bad region"), wr
        b = BindWr(mr.ci_handle, bind.addr, bind.length, bind.access, bind.current_rkey,
                   bind.wr_id, bind.send_opt)  # fmt: skip
        return None, dataclasses.replace(wr, mw=mw.ci_handle, bind=b)

    def _translate_avs(self, wrs: Sequence[SendWr]) -> Sequence[SendWr]:
        """Copies of ``wrs`` naming the provider's AV handles (the consumer's are untouched).

        A bad AV at index ``i`` posts the ``i`` before it and raises
        ``InvalidAvHandle`` with ``failed_index == i`` (the post contract).
        """
        out: list[SendWr] = []
        for i, wr in enumerate(wrs):
            ud = wr.ud if isinstance(wr, SendWr) else None
            if ud is None:
                out.append(wr)
                continue
            av = ud.av
            if not is_handle_of(av, Av, self._al, self._cica):
                if i:
                    self._ci.post_send(self._h, out)
                raise post_error(Status.INVALID_AV_HANDLE, i, "bad AV in the work request")
            out.append(
                SendWr(
                    wr.wr_id,
                    wr.opcode,
                    wr.sg_list,
                    wr.send_opt,
                    wr.imm,
                    wr.remote_addr,
                    wr.rkey,
                    wr.compare_add,
                    wr.swap,
                    UdDest(av.ci_handle, ud.remote_qp, ud.remote_qkey, ud.pkey_index),
                )
            )
        return out

    def post_recv(self, wrs: RecvWr | Sequence[RecvWr]) -> None:
        """``ib_post_recv``: accepted from INIT on; in ERROR each WR completes flushed."""
        if self._state is not READY:
            self._check()
        if self._qp_state not in _RECV_STATES:
            raise post_error(Status.INVALID_QP_STATE, 0, f"QP is {self._qp_state.name}")
        wrs, bad = wrcheck.recv_list(wrs)
        if bad is None or wrs:
            self._ci.post_recv(self._h, wrs)
        if bad is not None:
            raise bad

    # ------------------------------------------------------------------ drain
    def drain(
        self, timeout: float | None = None, *, send: bool = True, recv: bool = True
    ) -> list[Wc]:
        """Move to ERROR (again) and wait until every posted WR has completed (IBA drain).

        Posts a marker send and a marker receive (``DRAIN_SEND_WR_ID`` /
        ``DRAIN_RECV_WR_ID``) behind everything outstanding and polls this QP's
        CQs until both come out flushed; since a queue completes in order,
        everything posted before has completed then.  Returns every other
        completion polled meanwhile (this QP's flushes and those of other QPs
        sharing the CQs; the send CQ's first, each CQ's in order), so none is
        lost.  It waits with ``cq.wait`` (which rearms the CQ: a ``comp_cb``
        may see an extra notification).

        Contract (as Linux ``ib_drain_qp``): nobody else polls these CQs or
        posts to this QP while ``drain`` runs, or a marker may be taken by
        another poller and ``drain`` times out.  A QP on an SRQ has no receive
        marker (its ``SRQ_QP_LAST_WQE_REACHED`` event says when the SRQ stops
        feeding it).  ``Timeout`` if the markers are not back in ``timeout``
        seconds (``None``: wait as long as it takes).
        """
        self._check()
        timeout = ranges.check_timeout(timeout)
        if self._qp_state is QpState.RESET:
            raise InvalidQpState("a QP in RESET has nothing to drain")
        # Always (as Linux does): ERROR -> ERROR is legal, and it makes a CA that flushes
        # lazily (kernel rxe's responder) look at its queues again.
        self.modify(QpMod(QpState.ERROR))
        want: dict[int, Cq] = {}
        if send:
            self.post_send(self._drain_send_wr())
            want[DRAIN_SEND_WR_ID] = self._send_cq
        if recv and self._srq is None:
            self.post_recv(RecvWr(wr_id=DRAIN_RECV_WR_ID))
            want[DRAIN_RECV_WR_ID] = self._recv_cq
        return self._wait_markers(want, timeout)

    def _drain_send_wr(self) -> SendWr:
        if not (self._qp_type.is_datagram or self._qp_type in _RAW):
            # A zero-length RDMA WRITE, as Linux's drain posts: RC and UC take it.
            return SendWr(DRAIN_SEND_WR_ID, WrType.RDMA_WRITE, send_opt=SendOpt.SIGNALED)
        # A datagram send needs a destination; it is flushed, so any valid AV will do.
        port = self._cica.port(self._port_num or 1) or (
            self._cica.attr.ports[0] if self._cica.attr.ports else None
        )
        if port is None:
            raise InvalidParameter("the QP's CA reports no port to address the marker to")
        roce = port.link_layer is LinkLayer.ETHERNET and port.gids
        grh = Grh(dgid=port.gids[0]) if roce else None
        av = self._pd.create_av(AvAttr(port_num=port.port_num, dlid=port.lid, grh=grh))
        self._drain_av = av
        return SendWr(DRAIN_SEND_WR_ID, WrType.SEND, send_opt=SendOpt.SIGNALED,
                      ud=UdDest(av, self._num, 0))  # fmt: skip

    def _wait_markers(self, want: dict[int, Cq], timeout: float | None) -> list[Wc]:
        """``cq.wait`` on each CQ until its markers are back (no spinning, no sleeps)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        got: list[Wc] = []
        try:
            for cq in list({id(c): c for c in want.values()}.values()):
                while any(c is cq for c in want.values()):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise Timeout(
                            f"drain: {[hex(w) for w in want]} not flushed in {timeout} s "
                            "(is another thread polling the CQ?)"
                        )
                    for wc in cq.wait(remaining, 64):
                        if wc.wr_id in want and wc.qp_num == self._num:
                            del want[wc.wr_id]
                        else:
                            got.append(wc)
        finally:
            av, self._drain_av = self._drain_av, None
            if av is not None:
                with contextlib.suppress(IbError):
                    av.destroy()
        return got
