"""The loopback transport: what the adapter does with posted work requests.

A real HCA driver writes each work request into a ring in memory and rings a
doorbell; the adapter then fetches the WQE, moves the data over the wire and
writes a completion entry, and the driver's interrupt handler (or a completion
thread) tells the access layer which CQ has news.

The sample has no wire and no adapter: both ends of every transfer are QPs on
its own port.  So "ringing the doorbell" is a call to :func:`run`, which
executes every runnable WQE at once, on the caller's thread, and upcalls from
there.  That is the simplest model the contract allows (upcalls may come from
any thread, even from inside ``post_send``), and it is deterministic.

Errors follow the IBA: a failed WQE completes with an error status and takes
its QP to ERROR (SQERR for a UD send), which flushes what is left; a responder
that refuses a request also goes to ERROR, with an async event when it refused
an RDMA.  The first message reaching a QP in RTR raises "communication
established" (``QP_COMM``) on it.
"""

from __future__ import annotations

import contextlib
import struct
from typing import TYPE_CHECKING

from ibal.types import (
    WC_TYPE_FOR_WR,
    AccessFlags,
    AsyncEvent,
    Grh,
    QpState,
    QpType,
    RecvOpt,
    SendOpt,
    Wc,
    WcStatus,
    WcType,
    WrType,
)

from ibal_sample_provider.memory import Fault
from ibal_sample_provider.queues import Qp, SendWqe

if TYPE_CHECKING:
    from ibal_sample_provider.ca import SampleCa

GRH_LENGTH = 40
"""A UD receive buffer starts with room for the global route header."""

RNR_RETRY_FOREVER = 7
"""The rnr_retry_cnt value that means "retry until the receiver is ready" (IBA)."""

USE_QP_QKEY = 0x8000_0000
"""A UD send whose Q_Key has this bit set uses the sending QP's own Q_Key (IBA)."""


def run(ca: SampleCa) -> None:
    """The doorbell: execute every send WQE that can run now, then flush failed QPs.

    Called after every verb that may let work proceed or fail (a post, a
    modify).  A WQE whose responder has no receive posted stays at the head of
    its queue (the IBA's "receiver not ready") and is retried on the next
    doorbell.
    """
    for qp in list(ca.qps.values()):
        while qp.sq and qp.state is QpState.RTS:
            wqe = qp.sq.popleft()
            try:
                length = _execute(ca, qp, wqe)
            except Fault as fault:
                ca.complete(qp.send_cq, _send_wc(qp, wqe, fault.status))
                # RC goes to ERROR; UD only stops its send queue (SQERR).
                qp.state = QpState.SQERR if qp.qp_type is QpType.UD else QpState.ERROR
                break
            if length is None:
                qp.sq.appendleft(wqe)  # receiver not ready: try again on the next doorbell
                break
            if qp.signaled(wqe):
                ca.complete(qp.send_cq, _send_wc(qp, wqe, WcStatus.SUCCESS, length))
    # Flushing last keeps completions in order: the WQE that failed first, then
    # those flushed behind it, even when a QP was its own responder.
    for qp in list(ca.qps.values()):
        _flush(ca, qp)


def _flush(ca: SampleCa, qp: Qp) -> None:
    """Complete what a failed QP still holds with ``WR_FLUSHED_ERR``, even unsignaled WQEs."""
    if qp.state in (QpState.ERROR, QpState.SQERR):
        while qp.sq:
            ca.complete(qp.send_cq, _send_wc(qp, qp.sq.popleft(), WcStatus.WR_FLUSHED_ERR))
    if qp.state is QpState.ERROR:
        while qp.rq:
            recv = qp.rq.popleft()
            wc = Wc(recv.wr_id, WcType.RECV, WcStatus.WR_FLUSHED_ERR, qp_num=qp.qp_num)
            ca.complete(qp.recv_cq, wc)


def _send_wc(qp: Qp, wqe: SendWqe, status: WcStatus, length: int = 0) -> Wc:
    return Wc(wqe.wr_id, WC_TYPE_FOR_WR[wqe.opcode], status, length, qp_num=qp.qp_num)


# ----------------------------------------------------------------- executing one WQE


def _execute(ca: SampleCa, qp: Qp, wqe: SendWqe) -> int | None:
    """Carry out ``wqe``: the message length, ``None`` to wait, or ``Fault``."""
    if qp.qp_type is QpType.UD:
        return _send_datagram(ca, qp, wqe)
    peer = _connected_peer(ca, qp)
    if peer.state is QpState.RTR and not peer.established:
        # The first packet reaching a QP in RTR: the consumer may now move it to RTS.
        peer.established = True
        ca.async_event(AsyncEvent.QP_COMM, peer.context)
    if wqe.opcode is WrType.RDMA_READ:
        return _rdma_read(ca, qp, peer, wqe)
    data = ca.keys.gather(wqe.sg_list, qp.pd)
    uses_receive = wqe.opcode is WrType.SEND or bool(wqe.options & SendOpt.IMMEDIATE)
    if uses_receive and not peer.rq:
        # A real HCA retries rnr_retry_cnt times, rnr_nak_timeout apart.  The
        # sample has no clock, so a finite count runs out at once; 7 means
        # "retry forever", and the WQE waits for the next doorbell.
        if qp.attr.rnr_retry_cnt < RNR_RETRY_FOREVER:
            raise Fault(WcStatus.RNR_RETRY_ERR)
        return None
    if wqe.opcode is WrType.RDMA_WRITE:
        _check_peer_access(ca, peer, AccessFlags.RDMA_WRITE)
        target = _remote_memory(ca, peer, wqe, len(data), AccessFlags.RDMA_WRITE)
        target[:] = data
    if uses_receive:
        av = qp.attr.primary_av
        _deliver(ca, qp, peer, wqe, data, av.sl if av else 0)
    return len(data)


def _connected_peer(ca: SampleCa, qp: Qp) -> Qp:
    """The RC QP at the other end; ``TIMEOUT_RETRY_ERR`` when nothing answers."""
    av = qp.attr.primary_av
    peer = ca.qps.get(qp.attr.dest_qp)
    if (
        av is None
        or av.dlid != ca.port.lid  # the loopback port reaches only itself
        or peer is None
        or peer.qp_type is not QpType.RC
        or peer.attr.dest_qp != qp.qp_num
        or not peer.receiving
    ):
        raise Fault(WcStatus.TIMEOUT_RETRY_ERR)
    return peer


def _check_peer_access(ca: SampleCa, peer: Qp, access: AccessFlags) -> None:
    """The responder QP must allow the RDMA operation at all (its ``access`` attribute)."""
    if not peer.attr.access & access:
        _responder_error(ca, peer, AsyncEvent.WQ_REQ_ERROR)
        raise Fault(WcStatus.REM_INVALID_REQ_ERR)


def _remote_memory(
    ca: SampleCa, peer: Qp, wqe: SendWqe, length: int, access: AccessFlags
) -> memoryview:
    """The responder's memory an RDMA names by R_KEY; ``REM_ACCESS_ERR`` if refused."""
    if length == 0:
        # IBA C9-88: a zero-length READ or WRITE need not carry a valid R_Key or address,
        # so the responder checks neither (the QP's access rights were checked already).
        return memoryview(bytearray())
    try:
        return ca.keys.translate(
            wqe.rkey, peer.pd, wqe.remote_addr, length, access, WcStatus.REM_ACCESS_ERR
        )
    except Fault:
        _responder_error(ca, peer, AsyncEvent.WQ_ACCESS_ERROR)
        raise


def _responder_error(ca: SampleCa, peer: Qp, event: AsyncEvent) -> None:
    peer.state = QpState.ERROR  # flushed at the end of the doorbell
    ca.async_event(event, peer.context)


def _rdma_read(ca: SampleCa, qp: Qp, peer: Qp, wqe: SendWqe) -> int:
    _check_peer_access(ca, peer, AccessFlags.RDMA_READ)
    length = sum(s.length for s in wqe.sg_list)
    source = _remote_memory(ca, peer, wqe, length, AccessFlags.RDMA_READ)
    ca.keys.scatter(wqe.sg_list, qp.pd, bytes(source))
    return length


def _deliver(
    ca: SampleCa, sender: Qp, receiver: Qp, wqe: SendWqe, data: bytes, sl: int,
    grh: bytes | None = None,
) -> None:
    """Consume ``receiver``'s next receive for a SEND or an RDMA WRITE with immediate.

    A receive that cannot take the message fails on the receiver's side and
    takes the receiver to ERROR; the sender sees the IBA's remote error.
    """
    recv = receiver.rq.popleft()
    wc_type = WcType.RECV if wqe.opcode is WrType.SEND else WcType.RECV_RDMA_WRITE
    options = RecvOpt.NONE
    length = len(data)
    try:
        if wqe.opcode is WrType.SEND and receiver.qp_type is QpType.UD:
            # UD receives start with 40 bytes of GRH, valid only if one was sent.
            if grh is None:
                ca.keys.scatter(recv.sg_list, receiver.pd, data, skip=GRH_LENGTH)
            else:
                ca.keys.scatter(recv.sg_list, receiver.pd, grh + data)
                options |= RecvOpt.GRH_VALID
            length += GRH_LENGTH
        elif wqe.opcode is WrType.SEND:
            ca.keys.scatter(recv.sg_list, receiver.pd, data)
    except Fault as fault:
        ca.complete(receiver.recv_cq, Wc(recv.wr_id, wc_type, fault.status, qp_num=receiver.qp_num))
        receiver.state = QpState.ERROR
        if fault.status is WcStatus.LOCAL_LEN_ERR:
            raise Fault(WcStatus.REM_INVALID_REQ_ERR) from fault
        raise Fault(WcStatus.REM_OP_ERR) from fault
    imm = None
    if wqe.options & SendOpt.IMMEDIATE:
        imm = wqe.imm
        options |= RecvOpt.IMMEDIATE
    wc = Wc(
        recv.wr_id,
        wc_type,
        WcStatus.SUCCESS,
        length,
        imm=imm,
        recv_opt=options,
        qp_num=receiver.qp_num,
        src_qp=sender.qp_num,
        slid=ca.port.lid,
        sl=sl,
        pkey_index=receiver.attr.pkey_index,
        grh=grh,
    )
    ca.complete(receiver.recv_cq, wc, solicited=bool(wqe.options & SendOpt.SOLICITED))


def _send_datagram(ca: SampleCa, qp: Qp, wqe: SendWqe) -> int:
    """A UD SEND: delivered if a matching QP is there to take it, else silently lost."""
    data = ca.keys.gather(wqe.sg_list, qp.pd)
    if len(data) > ca.port.active_mtu.bytes:
        raise Fault(WcStatus.LOCAL_LEN_ERR)  # a datagram is one packet
    assert wqe.av is not None  # post_send checked it
    av = wqe.av.attr
    qkey = qp.attr.qkey if wqe.remote_qkey & USE_QP_QKEY else wqe.remote_qkey
    peer = ca.qps.get(wqe.remote_qp)
    if (
        av.dlid == ca.port.lid
        and peer is not None
        and peer.qp_type is QpType.UD
        and peer.receiving
        and peer.attr.qkey == qkey
        and peer.rq
    ):
        grh = _grh(ca, av.grh, len(data)) if av.grh else None
        with contextlib.suppress(Fault):  # the receiver's failure: UD senders never hear of it
            _deliver(ca, qp, peer, wqe, data, av.sl, grh)
    return len(data)


def _grh(ca: SampleCa, grh: Grh, length: int) -> bytes:
    """The global route header as it arrives (IBA 8.3; PayLen simplified to ``length``)."""
    sgid = ca.port.gids[grh.sgid_index]
    word0 = 6 << 28 | grh.traffic_class << 20 | grh.flow_label
    next_header = 0x1B  # "an IBA transport header follows"
    return struct.pack(
        ">IHBB16s16s", word0, length, next_header, grh.hop_limit, sgid.packed, grh.dgid.packed
    )
