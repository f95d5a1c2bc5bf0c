"""The NVMe over Fabrics RDMA target: ``ibal nvme serve``.

:class:`Target` listens through ``ibal.cm.rdma`` on the NVMe/RDMA port.  Each
connect request is one queue: its private data (record format, queue id, host
queue sizes) is checked, and refused with the NVMe/RDMA REJ private data
(``nvme_rdma_cm_rej``) when wrong; else the queue gets its own PD, CQ, RC QP,
receive slots (a 64-byte command capsule and up to 4 KiB of in-capsule data on
I/O queues), a data buffer and response slots, and a thread that serves it: it
runs the queue's :class:`~ibal.ulp.nvme.controller.QueueMachine` and carries its
steps out (RDMA READ the host's data, RDMA WRITE a read's data, SEND the
response, with invalidate when the host's descriptor asked for it).  A
disconnect, or a transport error such as a wrong remote key (the RDMA READ or
WRITE fails and the QP goes to the error state, so no response can be sent),
ends the queue: it is counted and everything it registered is released.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, deque

from ibal.al import AccessLayer, QpCreate
from ibal.cm import rdma
from ibal.cm.rdma import port_with_gid
from ibal.status import IbError, Timeout
from ibal.types import (
    AccessFlags,
    Gid,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    WcStatus,
    WcType,
    WrType,
)
from ibal.ulp.nvme import wire as w
from ibal.ulp.nvme.controller import (
    INLINE_DATA,
    MAX_IO,
    MAX_QUEUE,
    Deliver,
    Fetch,
    Hold,
    QueueMachine,
    Respond,
    Step,
    Subsystem,
)
from ibal.ulp.owned import live_owned, release_owned

__all__ = ["Target", "TargetQueue"]

_RECV, _SEND, _READ, _WRITE = 1 << 32, 2 << 32, 3 << 32, 4 << 32
_OWNED = ("qp", "rmr", "smr", "dmr", "cq", "pd")
POLL_S = 0.25  # how soon a queue's thread sees a disconnect or the target's stop
BUFFERS = 32  # commands of a queue whose responses may be in flight at once


class TargetQueue:
    """One connected queue: its resources and the thread serving it."""

    def __init__(self, target: Target, inc: rdma.RdmaIncoming, qid: int, size: int) -> None:
        self.target, self.qid, self.size = target, qid, size
        self.stats = target.stats
        inline = INLINE_DATA if qid else 0
        self.slot = w.SQE_SIZE + inline
        self.recvs = size + size // 2 + 1  # a host that overruns is heard and answered
        self.machine = QueueMachine(target.subsystem, qid, size, inline)
        ours = Gid(bytes(inc.incoming.fields["primary_remote_gid"]))
        ca_guid, port_num = port_with_gid(target.al, ours)
        self.ca = target.al.open_ca(ca_guid)
        self.done = threading.Event()
        self._pending: deque[tuple[int, int, bool]] = deque()  # (slot, length, overrun)
        try:
            self.pd = self.ca.alloc_pd()
            self.cq = self.ca.create_cq(self.recvs + 3 * size + 8)
            self.qp = self.pd.create_qp(QpCreate(QpType.RC, self.cq, self.cq,
                                                 sq_depth=2 * size + 2,
                                                 rq_depth=self.recvs))  # fmt: skip
            # a data buffer and a response slot per command in flight: a response's SEND
            # (and the RDMA WRITE before it) completes while the next commands are served
            self.nbuf = min(size, BUFFERS)
            self._free = list(range(self.nbuf))
            self.rbuf = bytearray(self.recvs * self.slot)
            self.sbuf = bytearray(self.nbuf * w.CQE_SIZE)
            self.dbuf = bytearray(self.nbuf * MAX_IO)
            self.rmr = self.pd.reg_mem(self.rbuf, AccessFlags.LOCAL_WRITE)
            self.smr = self.pd.reg_mem(self.sbuf, AccessFlags.LOCAL_WRITE)
            self.dmr = self.pd.reg_mem(self.dbuf, AccessFlags.LOCAL_WRITE)
            self.qp.modify(QpMod(QpState.INIT, port_num=port_num, pkey_index=0,
                                 access=AccessFlags.LOCAL_WRITE))  # fmt: skip
            for i in range(self.recvs):
                self._post_recv(i)
            rep = w.CM_REP.encode(recfmt=0, crqsize=size)
            self.conn = inc.accept(self.qp, rep, timeout=target.timeout)
        except BaseException:
            self._release()
            raise
        self.thread = threading.Thread(target=self._serve, name=f"nvmet-q{qid}", daemon=True)
        self.thread.start()

    def _post_recv(self, i: int) -> None:
        sge = Sge(addr=self.rmr.vaddr + i * self.slot, length=self.slot, lkey=self.rmr.lkey)
        self.qp.post_recv(RecvWr(wr_id=_RECV | i, sg_list=[sge]))

    # ------------------------------------------------------------ serving

    def _serve(self) -> None:
        try:
            while not self.target.stopping.is_set():
                if not self._pending:
                    self._poll(None)
                    if self.conn.connection.closed.done and not self._pending:
                        break
                    continue
                i, length, over = self._pending.popleft()
                raw = bytes(self.rbuf[i * self.slot : i * self.slot + length])
                self._post_recv(i)
                self._run(self.machine.capsule(raw, over))
        except _QueueEnded as end:
            self.stats[f"queue ended: {end}"] += 1
        except IbError as exc:
            self.stats[f"queue ended: {type(exc).__name__}"] += 1
        finally:
            self._end()

    def _run(self, step: Step | None) -> None:
        if step is None or isinstance(step, Hold):
            return
        b = self._take()
        fetched: w.Sgl | None = None  # the key a write's data came by: its response frees it
        while isinstance(step, Fetch):
            self.qp.post_send(self._rdma(WrType.RDMA_READ, b, step.sgl, step.length, _READ | b))
            self._await(_READ | b)
            fetched = step.sgl
            off = b * MAX_IO
            step = step.then(bytes(self.dbuf[off : off + step.length]))
        if isinstance(step, Hold):
            self._free.append(b)
            return
        if isinstance(step, Respond):
            self.qp.post_send(self._response(b, step.completion, fetched))
            return
        assert isinstance(step, Deliver)
        n = len(step.data)
        self.dbuf[b * MAX_IO : b * MAX_IO + n] = step.data
        # the WRITE unsignaled: on an RC QP the data is placed before the SEND arrives,
        # and the SEND's completion says the buffer is free again
        write = self._rdma(WrType.RDMA_WRITE, b, step.sgl, n, _WRITE | b, signaled=False)
        self.qp.post_send([write, self._response(b, step.completion, step.sgl)])

    def _rdma(self, op: WrType, b: int, sgl: w.Sgl, n: int, wr_id: int, *,
              signaled: bool = True) -> SendWr:  # fmt: skip
        return SendWr(wr_id=wr_id, opcode=op, remote_addr=sgl.addr, rkey=sgl.key,
                      send_opt=SendOpt.SIGNALED if signaled else SendOpt.NONE,
                      sg_list=[Sge(addr=self.dmr.vaddr + b * MAX_IO, length=n,
                                   lkey=self.dmr.lkey)])  # fmt: skip

    def _response(self, b: int, c: w.Completion, sgl: w.Sgl | None) -> SendWr:
        self.sbuf[b * w.CQE_SIZE : (b + 1) * w.CQE_SIZE] = c.encode()
        # answered before the SEND goes: the host may submit again before its completion
        self.machine.answered()
        if not c.ok:
            self.stats["error responses"] += 1
        inv = sgl is not None and sgl.type == w.SglType.KEYED_INVALIDATE
        return SendWr(wr_id=_SEND | b, opcode=WrType.SEND_WITH_INV if inv else WrType.SEND,
                      invalidate_rkey=sgl.key if inv and sgl else 0, send_opt=SendOpt.SIGNALED,
                      sg_list=[Sge(addr=self.smr.vaddr + b * w.CQE_SIZE, length=w.CQE_SIZE,
                                   lkey=self.smr.lkey)])  # fmt: skip

    def _take(self) -> int:
        """A free buffer (waiting for a response's SEND to complete if none is)."""
        deadline = time.monotonic() + self.target.timeout
        while not self._free:
            self._poll(None)
            if time.monotonic() > deadline:
                raise _QueueEnded("no completion in time")
        return self._free.pop()

    def _await(self, tag: int) -> None:
        """Poll until the work request ``tag`` completes; receives meanwhile are queued."""
        deadline = time.monotonic() + self.target.timeout
        while not self._poll(tag):
            if time.monotonic() > deadline:
                raise _QueueEnded("no completion in time")

    def _poll(self, tag: int | None) -> bool:
        wcs = self.cq.wait(POLL_S, max_entries=16)
        seen = False
        for wc in wcs:
            if wc.status is not WcStatus.SUCCESS:
                if wc.status is WcStatus.WR_FLUSHED_ERR:
                    raise _QueueEnded("flushed")
                what = "wrong remote key" if wc.status is WcStatus.REM_ACCESS_ERR else \
                    wc.status.name  # fmt: skip
                raise _QueueEnded(f"{wc.wc_type.name} {what}")
            if wc.wc_type is WcType.RECV:
                self._pending.append((wc.wr_id & 0xFFFFFFFF, wc.length, self.machine.arrived()))
            elif wc.wr_id >> 32 == _SEND >> 32:
                self._free.append(wc.wr_id & 0xFFFFFFFF)
            if tag is not None and wc.wr_id == tag:
                seen = True
        return seen

    # ------------------------------------------------------------ teardown

    def _end(self) -> None:
        ctrl = self.machine.ctrl
        if ctrl is not None:
            if self.qid == 0:
                self.target.subsystem.drop_controller(ctrl.cntlid)
            else:
                ctrl.io_queues.discard(self.qid)
        if not self.conn.connection.closed.done:
            with contextlib.suppress(IbError):
                self.conn.disconnect(timeout=5.0)
        self._release()
        self.done.set()
        self.target._gone(self)

    def owned(self) -> list[object]:
        return live_owned(self, _OWNED)

    def _release(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            conn.connection.close()
        release_owned(self, _OWNED)


class _QueueEnded(Exception):
    pass


class Target:
    """An NVMe/RDMA target serving ``subsystem`` at ``addr``:``port`` until :meth:`close`."""

    def __init__(self, al: AccessLayer, subsystem: Subsystem, addr: str | None = None,
                 port: int = w.NVMF_PORT, *, timeout: float = 15.0) -> None:  # fmt: skip
        self.al, self.subsystem, self.timeout = al, subsystem, timeout
        self.stats: Counter[str] = subsystem.stats
        self.stopping = threading.Event()
        self.queues: list[TargetQueue] = []
        self._lock = threading.Lock()
        self.listener = rdma.listen(al, port, addr=addr)
        self._thread = threading.Thread(target=self._accept_loop, name="nvmet-listen",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                inc = self.listener.get(POLL_S)  # bounded, to see the stop
            except Timeout:
                continue
            except IbError:
                return
            try:
                self._incoming(inc)
            except IbError as exc:
                self.stats[f"connect failed: {type(exc).__name__}"] += 1

    def _incoming(self, inc: rdma.RdmaIncoming) -> None:
        pd = inc.private_data
        status: w.CmRejStatus | None = None
        if len(pd) < w.CM_REQ.size:
            status = w.CmRejStatus.INVALID_LEN
        else:
            req = w.CM_REQ.decode(pd)
            qid, hsq, hrq = int(req["qid"]), int(req["hsqsize"]) + 1, int(req["hrqsize"])
            if req["recfmt"] != 0:
                status = w.CmRejStatus.INVALID_RECFMT
            elif qid > self.subsystem.max_io_queues:
                status = w.CmRejStatus.INVALID_QID
            elif hsq < 2 or hsq > (w.AQ_DEPTH if qid == 0 else MAX_QUEUE):
                status = w.CmRejStatus.INVALID_HSQSIZE
            elif hrq < 1 or hrq > MAX_QUEUE:
                status = w.CmRejStatus.INVALID_HRQSIZE
        if status is not None:
            self.stats[f"rejected: {status.name}"] += 1
            inc.reject(w.CM_REJ.encode(recfmt=0, sts=status))
            return
        q = TargetQueue(self, inc, qid, hsq)
        with self._lock:
            self.queues.append(q)

    def _gone(self, q: TargetQueue) -> None:
        with self._lock:
            if q in self.queues:
                self.queues.remove(q)

    def registered(self) -> list[object]:
        """The AL objects of live queues (none once every host disconnected)."""
        with self._lock:
            qs = list(self.queues)
        return [o for q in qs for o in q.owned()]

    def close(self) -> None:
        self.stopping.set()
        self.listener.close()
        self._thread.join(5)
        with self._lock:
            qs = list(self.queues)
        for q in qs:
            q.thread.join(self.timeout)

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
