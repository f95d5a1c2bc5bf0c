"""Building blocks for the conformance checks: waiting, addressing, connected pairs.

Waiting is always a poll against a deadline (never a sleep used as
synchronisation, never an assertion about how long something took); callbacks
are observed through :class:`CallbackLog`, which wakes waiters as entries arrive.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ibal.al import (
    ConnectOptions,
    connect_qp,
    default_access,
    endpoint,
    path_to,
    preferred_gid,
)
from ibal.status import Timeout
from ibal.types import (
    AccessFlags,
    AvAttr,
    Grh,
    LinkLayer,
    LinkState,
    Mtu,
    PortAttr,
    QpMod,
    QpState,
    QpType,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    UdDest,
    Wc,
    WcStatus,
    WcType,
    WrType,
)

if TYPE_CHECKING:
    from ibal.al import AccessLayer, Av, Ca, Cq, Mr, Pd, Qp
    from ibal.ci import Capabilities

DEFAULT_TIMEOUT = 10.0
"""Seconds a check waits for something that must happen (a deadline, not a delay)."""

UD_QKEY = 0x1BAD_CAFE & 0x7FFF_FFFF
"""Q_Key used by the datagram checks (high bit clear: not a controlled key)."""

GRH_BYTES = 40
"""Bytes a UD receive buffer reserves for the GRH (docs/decisions.md)."""

BUF_SIZE = 8192


# ------------------------------------------------------------------ waiting



ROOT_REASON = "needs root (rxe's raw sockets need CAP_NET_RAW)"


def need_root() -> None:
    """Skip a test that needs rxe's raw sockets without root; with ``IBAL_LAB_REQUIRED``
    set (CI), fail instead."""
    import pytest

    if os.geteuid() != 0:
        if os.environ.get("IBAL_LAB_REQUIRED", "") not in ("", "0"):
            pytest.fail(f"{ROOT_REASON} (IBAL_LAB_REQUIRED is set)", pytrace=False)
        pytest.skip(ROOT_REASON)


@contextmanager
def rxe_al(devices: str, *, timeout: float | None = None) -> Iterator[AccessLayer]:
    """An AL over a manager of its own with the rxe provider on ``devices``
    (``name=addr,...``); root is required (:func:`need_root`)."""
    need_root()
    from ibal.al import AlManager
    from ibal.providers.rxe.provider import RxeProvider

    mgr = AlManager()
    mgr.add_provider(RxeProvider({"devices": devices}))
    try:
        yield mgr.open_al()
    finally:
        mgr.close(timeout=timeout)


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Poll ``predicate`` until it holds; raise :class:`ibal.status.Timeout` naming ``what``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise Timeout(f"waited {timeout} s for {what}")
        time.sleep(0.0002)  # poll interval: yields the GIL to the dispatcher


def wait_wcs(cq: Cq, count: int = 1, timeout: float = DEFAULT_TIMEOUT) -> list[Wc]:
    """Poll ``cq`` until ``count`` completions arrived; return exactly those."""
    got: list[Wc] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        got.extend(cq.poll(count - len(got)))
        if len(got) < count:
            if time.monotonic() > deadline:
                raise Timeout(
                    f"{len(got)} of {count} completions after {timeout} s: "
                    + ", ".join(f"{w.wc_type.name}/{w.status.name}" for w in got)
                )
            time.sleep(0.0002)
    return got


def wait_wc(cq: Cq, timeout: float = DEFAULT_TIMEOUT) -> Wc:
    """The next completion on ``cq``."""
    return wait_wcs(cq, 1, timeout)[0]


def settle(ca: Ca, timeout: float = DEFAULT_TIMEOUT) -> None:
    """Let every access-layer callback queued so far run (completion, event, destroy...).

    A completion callback is queued on the manager's completion queue when the
    provider upcalls; flushing the queues is what proves one did not fire (a
    waited destroy only covers the teardown queue).
    """
    if not ca.al.manager.queues.flush(timeout):
        raise Timeout(f"waited {timeout} s for the access layer's callback queues to drain")


class ServerThread:
    """``serve(listening)`` on a thread of its own, for a server a test's client talks to:
    ``serve`` calls ``listening()`` once clients may come; :meth:`wait_listening` waits
    for that and :meth:`result` for its return value, raising what it raised instead."""

    def __init__(self, serve: Callable[[Callable[[], None]], Any]) -> None:
        self._listening = threading.Event()
        self._out: list[Any] = []
        self._err: list[BaseException] = []

        def main() -> None:
            try:
                self._out.append(serve(self._listening.set))
            except BaseException as exc:  # handed to the test's thread
                self._err.append(exc)
            finally:
                self._listening.set()

        self._thread = threading.Thread(target=main, name="test-server", daemon=True)
        self._thread.start()

    def wait_listening(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Until the server listens; what it raised before that, or ``Timeout``."""
        if not self._listening.wait(timeout):
            raise Timeout(f"the server did not listen within {timeout} s")
        if self._err:
            raise self._err[0]

    def result(self, timeout: float = DEFAULT_TIMEOUT) -> Any:
        """The server's return value once it ended; what it raised, or ``Timeout``."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise Timeout(f"the server did not end within {timeout} s")
        if self._err:
            raise self._err[0]
        return self._out[0]


def drain(cq: Cq) -> list[Wc]:
    """Every completion queued on ``cq`` now."""
    out: list[Wc] = []
    while True:
        batch = cq.poll(64)
        if not batch:
            return out
        out.extend(batch)


class CallbackLog:
    """Thread-safe record of callback invocations with waiting by count or predicate."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.entries: list[tuple[Any, ...]] = []
        self.threads: list[int] = []

    def __call__(self, *args: Any) -> None:
        self.add(*args)

    def add(self, *args: Any) -> None:
        with self._cond:
            self.entries.append(args)
            self.threads.append(threading.get_ident())
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self.entries)

    def snapshot(self) -> list[tuple[Any, ...]]:
        with self._cond:
            return list(self.entries)

    def wait(self, count: int = 1, timeout: float = DEFAULT_TIMEOUT, what: str = "") -> None:
        """Block until at least ``count`` entries were recorded."""
        self.wait_for(
            lambda entries: len(entries) >= count, what or f"{count} callback(s)", timeout
        )

    def wait_for(
        self,
        predicate: Callable[[list[tuple[Any, ...]]], bool],
        what: str,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.entries):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Timeout(f"waited {timeout} s for {what}; saw {self.entries!r}")
                self._cond.wait(remaining)


# --------------------------------------------------------------- addressing


def active_port(attr_ports: Iterable[PortAttr]) -> PortAttr | None:
    """The first ACTIVE port, or ``None``."""
    for p in attr_ports:
        if p.link_state is LinkState.ACTIVE:
            return p
    return None


def is_roce(port: PortAttr) -> bool:
    return port.link_layer is LinkLayer.ETHERNET


def av_to(remote: PortAttr, local_port_num: int, *, sl: int = 0) -> AvAttr:
    """An address vector from ``local_port_num`` reaching ``remote`` (GRH on RoCE).

    The remote GID is the one :func:`ibal.al.connect.preferred_gid` picks; the
    source GID index is left 0 (the provider picks a matching one on RoCE).
    """
    grh = Grh(dgid=preferred_gid(remote).gid) if is_roce(remote) and remote.gids else None
    return AvAttr(port_num=local_port_num, dlid=remote.lid, sl=sl, grh=grh)


def common_mtu(a: PortAttr, b: PortAttr) -> Mtu:
    return Mtu(min(a.active_mtu, b.active_mtu))


def qp_access(caps: Capabilities) -> AccessFlags:
    """Remote rights for connected QPs: everything the CA supports."""
    return default_access(caps.atomics)


def mr_access(caps: Capabilities) -> AccessFlags:
    """Rights for test buffers: everything the CA supports."""
    acc = qp_access(caps)
    if caps.mw_types:
        acc |= AccessFlags.MW_BIND
    return acc


# ------------------------------------------------------------ connected QPs


@dataclass
class RcTiming:
    """Retry attributes for connected QPs (small so error paths finish fast)."""

    retry_cnt: int = 7
    rnr_retry_cnt: int = 7
    local_ack_timeout: int = 14
    rnr_nak_timeout: int = 1


def to_init(qp: Qp, port_num: int, access: AccessFlags, qkey: int = UD_QKEY) -> None:
    """RESET → INIT with the attributes the transport requires."""
    if qp.qp_type.is_datagram:
        qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=port_num, qkey=qkey))
    else:
        qp.modify(QpMod(QpState.INIT, pkey_index=0, port_num=port_num, access=access))


def to_rtr(
    qp: Qp,
    av: AvAttr,
    mtu: Mtu,
    remote_qpn: int,
    *,
    resp_res: int = 4,
    timing: RcTiming | None = None,
) -> None:
    """INIT → RTR towards ``remote_qpn``."""
    t = timing or RcTiming()
    if qp.qp_type is QpType.RC:
        qp.modify(
            QpMod(
                QpState.RTR,
                primary_av=av,
                path_mtu=mtu,
                dest_qp=remote_qpn,
                rq_psn=0,
                resp_res=resp_res,
                rnr_nak_timeout=t.rnr_nak_timeout,
            )
        )
    elif qp.qp_type is QpType.UC:
        qp.modify(QpMod(QpState.RTR, primary_av=av, path_mtu=mtu, dest_qp=remote_qpn, rq_psn=0))
    else:
        qp.modify(QpMod(QpState.RTR))


def to_rts(qp: Qp, *, init_depth: int = 4, timing: RcTiming | None = None) -> None:
    """RTR → RTS."""
    t = timing or RcTiming()
    if qp.qp_type is QpType.RC:
        qp.modify(
            QpMod(
                QpState.RTS,
                sq_psn=0,
                local_ack_timeout=t.local_ack_timeout,
                retry_cnt=t.retry_cnt,
                rnr_retry_cnt=t.rnr_retry_cnt,
                init_depth=init_depth,
            )
        )
    else:
        qp.modify(QpMod(QpState.RTS, sq_psn=0))


@dataclass
class Side:
    """One end of a pair: CA, port, PD, CQ, registered buffer and QP."""

    ca: Ca
    port: PortAttr
    pd: Pd
    cq: Cq
    buf: bytearray
    mr: Mr
    qp: Qp
    av: Av | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def sge(self, offset: int, length: int) -> Sge:
        return Sge(addr=self.mr.vaddr + offset, length=length, lkey=self.mr.lkey)

    def recv(self, wr_id: int, offset: int = 0, length: int = 1024) -> None:
        """Post one receive of ``length`` bytes at ``offset`` of the buffer."""
        self.qp.post_recv(RecvWr(wr_id=wr_id, sg_list=[self.sge(offset, length)]))

    def put(self, offset: int, data: bytes) -> None:
        self.buf[offset : offset + len(data)] = data

    def get(self, offset: int, length: int) -> bytes:
        return bytes(self.buf[offset : offset + length])

    def remote(self, offset: int = 0) -> int:
        """The remote address of ``offset`` in this side's buffer."""
        return self.mr.vaddr + offset


@dataclass
class Pair:
    """Two QPs of one transport that can reach each other, ready to move data."""

    qp_type: QpType
    a: Side
    b: Side
    caps: Capabilities

    def ud(self, to: Side, qkey: int = UD_QKEY) -> UdDest:
        """Datagram addressing from the other side towards ``to``."""
        src = self.a if to is self.b else self.b
        assert src.av is not None, "UD pair without AV"
        return UdDest(av=src.av, remote_qp=to.qp.num, remote_qkey=qkey)

    def send(
        self,
        payload: bytes,
        *,
        src_off: int = 0,
        dst_off: int = 0,
        opt: SendOpt = SendOpt.SIGNALED,
        imm: int = 0,
        wr_id: int = 1,
        recv_id: int = 100,
        recv_len: int = 1024,
    ) -> tuple[Wc, Wc]:
        """A → B SEND; returns (A's send completion, B's receive completion)."""
        grh = GRH_BYTES if self.qp_type.is_datagram else 0
        self.b.recv(recv_id, dst_off, recv_len + grh)
        self.a.put(src_off, payload)
        self.a.qp.post_send(
            SendWr(
                wr_id=wr_id,
                opcode=WrType.SEND,
                sg_list=[self.a.sge(src_off, len(payload))],
                send_opt=opt,
                imm=imm,
                ud=self.ud(self.b) if self.qp_type.is_datagram else None,
            )
        )
        return self.wait_pair()

    def wait_pair(self) -> tuple[Wc, Wc]:
        """A's next completion and B's next completion."""
        if self.a.cq is self.b.cq:
            wcs = wait_wcs(self.a.cq, 2)
            send = next(w for w in wcs if w.qp_num == self.a.qp.num)
            recv = next(w for w in wcs if w is not send)
            return send, recv
        return wait_wc(self.a.cq), wait_wc(self.b.cq)

    def write(
        self,
        payload: bytes,
        *,
        src_off: int = 0,
        dst_off: int = 0,
        rkey: int | None = None,
        remote_addr: int | None = None,
        opt: SendOpt = SendOpt.SIGNALED,
        imm: int = 0,
        wr_id: int = 2,
    ) -> None:
        """Post A → B RDMA WRITE (no wait)."""
        self.a.put(src_off, payload)
        self.a.qp.post_send(
            SendWr(
                wr_id=wr_id,
                opcode=WrType.RDMA_WRITE,
                sg_list=[self.a.sge(src_off, len(payload))],
                send_opt=opt,
                imm=imm,
                remote_addr=self.b.remote(dst_off) if remote_addr is None else remote_addr,
                rkey=self.b.mr.rkey if rkey is None else rkey,
            )
        )

    def read(
        self,
        length: int,
        *,
        src_off: int = 0,
        dst_off: int = 0,
        rkey: int | None = None,
        remote_addr: int | None = None,
        wr_id: int = 3,
    ) -> None:
        """Post A ← B RDMA READ of ``length`` bytes from B's ``src_off`` to A's ``dst_off``."""
        self.a.qp.post_send(
            SendWr(
                wr_id=wr_id,
                opcode=WrType.RDMA_READ,
                sg_list=[self.a.sge(dst_off, length)],
                remote_addr=self.b.remote(src_off) if remote_addr is None else remote_addr,
                rkey=self.b.mr.rkey if rkey is None else rkey,
            )
        )

    def atomic(
        self,
        opcode: WrType,
        *,
        remote_off: int,
        local_off: int,
        compare_add: int,
        swap: int = 0,
        wr_id: int = 4,
    ) -> Wc:
        """A atomic on B's 8 bytes at ``remote_off``; the old value lands at A's ``local_off``."""
        self.a.qp.post_send(
            SendWr(
                wr_id=wr_id,
                opcode=opcode,
                sg_list=[self.a.sge(local_off, 8)],
                remote_addr=self.b.remote(remote_off),
                rkey=self.b.mr.rkey,
                compare_add=compare_add,
                swap=swap,
            )
        )
        return wait_wc(self.a.cq)


def make_side(
    ca: Ca,
    port: PortAttr,
    qp_type: QpType,
    *,
    cq_size: int = 256,
    buf_size: int = BUF_SIZE,
    access: AccessFlags | None = None,
    **create: Any,
) -> Side:
    """PD, CQ, buffer, MR and a QP in RESET on ``ca``."""
    from ibal.al import QpCreate

    caps = ca.capabilities
    pd = ca.alloc_pd()
    cq = ca.create_cq(cq_size)
    buf = bytearray(buf_size)
    mr = pd.reg_mem(buf, mr_access(caps) if access is None else access)
    qp = pd.create_qp(QpCreate(qp_type, send_cq=cq, recv_cq=cq, **create))
    return Side(ca=ca, port=port, pd=pd, cq=cq, buf=buf, mr=mr, qp=qp)


def connect(
    a: Side,
    b: Side,
    caps: Capabilities,
    *,
    timing: RcTiming | None = None,
    connect_b: bool = True,
) -> None:
    """Bring both QPs to RTS towards each other (UD: ready, with AVs both ways).

    With ``connect_b=False`` B stays in INIT (RESET for UD), silently dropping
    what A sends.  The work is :func:`ibal.connect_qp`'s.
    """
    qp_type = a.qp.qp_type
    ea = endpoint(a.qp, a.port.port_num, psn=0, qkey=UD_QKEY)
    eb = endpoint(b.qp, b.port.port_num, psn=0, qkey=UD_QKEY)
    if qp_type.is_datagram:
        a.av = a.pd.create_av(connect_qp(a.qp, ea, eb))
        if connect_b:
            b.av = b.pd.create_av(connect_qp(b.qp, eb, ea))
        else:
            b.av = b.pd.create_av(path_to(b.port, ea))
        return
    t = timing or RcTiming()
    attr = a.ca.query()
    depth = max(1, min(4, attr.max_qp_init_depth or 4, attr.max_qp_resp_res or 4))
    opts = ConnectOptions(
        access=qp_access(caps),
        local_ack_timeout=t.local_ack_timeout,
        retry_cnt=t.retry_cnt,
        rnr_retry_cnt=t.rnr_retry_cnt,
        rnr_nak_timeout=t.rnr_nak_timeout,
        resp_res=depth,
        init_depth=depth,
    )
    connect_qp(a.qp, ea, eb, options=opts)
    if connect_b:
        connect_qp(b.qp, eb, ea, options=opts)
    else:
        to_init(b.qp, b.port.port_num, opts.access or qp_access(caps))


def make_pair(
    ca_a: Ca,
    port_a: PortAttr,
    ca_b: Ca,
    port_b: PortAttr,
    qp_type: QpType,
    *,
    timing: RcTiming | None = None,
    connect_b: bool = True,
    do_connect: bool = True,
    access: AccessFlags | None = None,
    **create: Any,
) -> Pair:
    """Two sides with QPs of ``qp_type``, connected unless ``do_connect=False``."""
    a = make_side(ca_a, port_a, qp_type, access=access, **create)
    b = make_side(ca_b, port_b, qp_type, access=access, **create)
    caps = ca_a.capabilities
    if do_connect:
        connect(a, b, caps, timing=timing, connect_b=connect_b)
    return Pair(qp_type, a, b, caps)


# ------------------------------------------------------------------- misc


def send_wr(
    side: Side,
    offset: int,
    length: int,
    *,
    wr_id: int = 1,
    opt: SendOpt = SendOpt.SIGNALED,
    ud: UdDest | None = None,
) -> SendWr:
    return SendWr(
        wr_id=wr_id, opcode=WrType.SEND, sg_list=[side.sge(offset, length)], send_opt=opt, ud=ud
    )


def statuses(wcs: Sequence[Wc]) -> list[WcStatus]:
    return [w.status for w in wcs]


def types_(wcs: Sequence[Wc]) -> list[WcType]:
    return [w.wc_type for w in wcs]


def atomic_result_ok(init: bytes, fetched: bytes, after: bytes, op: Callable[[int], int]) -> bool:
    """Whether an atomic did ``op`` on the 8 bytes ``init`` in one byte order.

    IBA leaves the byte order of atomic operands to the HCA (host order on
    soft-RoCE, big-endian on some adapters), so either order is accepted as
    long as the fetched value and the result agree with it.
    """
    for fmt in ("<Q", ">Q"):
        (start,) = struct.unpack(fmt, init)
        (old,) = struct.unpack(fmt, fetched)
        (new,) = struct.unpack(fmt, after)
        if old == start and new == op(start) % (1 << 64):
            return True
    return False


def al_of(ca: Ca) -> AccessLayer | None:
    """The AL a CA handle was opened through, when the handle says so."""
    al = getattr(ca, "al", None)
    return al


class Source:
    """Makes completions on demand: QP A sends to QP B (UD if supported, else RC).

    A's sends complete on ``send_cq`` and B's receives on ``recv_cq`` (each gets
    a private CQ when not given).
    """

    def __init__(
        self,
        ca: Ca,
        port: PortAttr,
        *,
        send_cq: Cq | None = None,
        recv_cq: Cq | None = None,
        qp_type: QpType | None = None,
    ) -> None:
        from ibal.al import QpCreate

        caps = ca.capabilities
        if qp_type is None:
            qp_type = QpType.UD if QpType.UD in caps.qp_types else QpType.RC
        self.qp_type = qp_type
        self.pd = ca.alloc_pd()
        self.send_cq = send_cq if send_cq is not None else ca.create_cq(256)
        self.recv_cq = recv_cq if recv_cq is not None else ca.create_cq(256)
        self.buf = bytearray(4096)
        self.mr = self.pd.reg_mem(self.buf, mr_access(caps))
        qa = self.pd.create_qp(
            QpCreate(qp_type, send_cq=self.send_cq, recv_cq=self.send_cq, sq_depth=64, rq_depth=64)
        )
        qb = self.pd.create_qp(
            QpCreate(qp_type, send_cq=self.recv_cq, recv_cq=self.recv_cq, sq_depth=64, rq_depth=64)
        )
        self.a = Side(ca, port, self.pd, self.send_cq, self.buf, self.mr, qa)
        self.b = Side(ca, port, self.pd, self.recv_cq, self.buf, self.mr, qb)
        connect(self.a, self.b, caps)
        self._next = 0

    def fire(self, n: int = 1, opt: SendOpt = SendOpt.SIGNALED, imm: int = 0) -> list[int]:
        """Post ``n`` sends (each with a receive at B); return their wr_ids."""
        ids = []
        for _ in range(n):
            self._next += 1
            wr_id = self._next
            self.b.qp.post_recv(RecvWr(wr_id=wr_id, sg_list=[self.b.sge(2048, 256)]))
            ud = None
            if self.qp_type.is_datagram:
                assert self.a.av is not None
                ud = UdDest(av=self.a.av, remote_qp=self.b.qp.num, remote_qkey=UD_QKEY)
            self.a.qp.post_send(
                SendWr(wr_id=wr_id, sg_list=[self.a.sge(0, 16)], send_opt=opt, imm=imm, ud=ud)
            )
            ids.append(wr_id)
        return ids
