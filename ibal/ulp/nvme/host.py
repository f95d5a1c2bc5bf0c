"""The NVMe over Fabrics RDMA host: queues, a controller, and a block device.

A :class:`HostQueue` is one NVMe queue pair carried by one RC QP that
``ibal.cm.rdma`` connects to the target (service ``(TCP << 16) + 4420``, the
NVMe/RDMA REQ private data after the CMA header).  It owns everything it
registers: a CA handle, a PD, a CQ, the QP and three registered buffers (the
64-byte command slots, the 16-byte response slots its receives land in, and
one data area per command slot that the target reads or writes through a keyed
SGL descriptor).  Commands are identified by their slot, so queue depth is the
number of slots; completions are matched to their command by the command id.

:class:`Controller` is the NVMe controller seen through those queues: the
admin queue's Fabrics Connect, Property Get/Set to enable it, Identify, Get
Log Page (the discovery log page), Get/Set Features, Keep Alive (a thread sends
it every half KATO), then I/O queues and READ/WRITE/FLUSH.  :class:`BlockDevice`
wraps one namespace as an ``io.RawIOBase``.

A command that fails raises :class:`NvmeStatusError` (``status`` as Linux
encodes it); a target that goes away (a DREQ, a flushed or failed work
request, no response in time) raises :class:`ControllerLost`, and the queue's
resources are released whatever happens: :meth:`Controller.close` always runs
its teardown.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ibal.al import AccessLayer, QpCreate
from ibal.cm import ConnectionRejected, rdma
from ibal.status import IbError, InvalidParameter, InvalidState, RemoteError, Timeout
from ibal.types import (
    AccessFlags,
    BindWr,
    QpType,
    RecvOpt,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    WcStatus,
    WcType,
    WrType,
)
from ibal.ulp.nvme import wire as w

__all__ = ["BlockDevice", "Controller", "ControllerLost", "HostOptions", "HostQueue",
           "NvmeStatusError", "discover", "fabrics_connect"]  # fmt: skip

_RECV = 1 << 32  # wr_id tag of a receive (low bits: its response slot)
_SEND = 2 << 32
_BIND = 3 << 32
_LINV = 4 << 32


def _next_key(rkey: int) -> int:
    """The R_Key a window's next bind gives it: the same index, the next key byte."""
    return (rkey & ~0xFF) | ((rkey + 1) & 0xFF)


class NvmeStatusError(RemoteError):
    """A command completed with an error: ``nvme_status`` (Linux's encoding, DNR
    included) and ``code`` (type and code without DNR, an :class:`ibal.ulp.nvme.wire.Sc`)."""

    def __init__(self, what: str, status: int) -> None:
        super().__init__(f"{what}: {w.status_name(status)}")
        self.nvme_status = status
        self.code = status & 0x7FF


class ControllerLost(RemoteError):
    """The target went away (disconnect, transport error, no response in time)."""


def host_nqn(hostid: uuid.UUID) -> str:
    """The NQN of a host named by UUID, as the NVMe base specification forms it."""
    return f"nqn.2014-08.org.nvmexpress:uuid:{hostid}"


@dataclass
class HostOptions:
    """What ``nvme connect`` takes: host identity, queue count and size, KATO, timeout."""

    hostid: uuid.UUID = field(default_factory=uuid.uuid4)
    hostnqn: str = ""
    io_queues: int = 1
    queue_size: int = 32
    kato_ms: int = 5000
    max_io: int = 128 * 1024
    timeout: float = 15.0
    port: int = w.NVMF_PORT
    remote_invalidate: bool = False
    """Each command's data through a type 2 memory window bound for it alone, its keyed
    descriptor asking the target to invalidate the key (SEND with invalidate): what
    Linux's host does with fast-registered regions.  Without it the data areas are one
    region the target may reach for the queue's life."""
    in_capsule: bool = True
    """Writes that fit go in the command capsule where the controller offers it."""

    def __post_init__(self) -> None:
        if not self.hostnqn:
            self.hostnqn = host_nqn(self.hostid)
        if not 2 <= self.queue_size <= 1024:
            raise InvalidParameter(f"queue size {self.queue_size}: 2..1024")
        if not 0 <= self.io_queues <= 64:
            raise InvalidParameter(f"I/O queues {self.io_queues}: 0..64")
        if not 512 <= self.max_io <= w.MAX_KEYED_LEN:
            raise InvalidParameter(f"max I/O {self.max_io}: 512..{w.MAX_KEYED_LEN}")


class HostQueue:
    """One NVMe/RDMA queue: its own PD, CQ, RC QP and registered slots (see the module)."""

    def __init__(self, al: AccessLayer, route: rdma.RdmaRoute, qid: int, size: int,
                 max_io: int, opts: HostOptions, *, claim: int | None = None) -> None:  # fmt: skip
        """``claim``: the queue size the connect request states, if not ``size`` (a host
        that overruns its queue, for testing targets)."""
        self.qid, self.size, self.max_io, self.timeout = qid, size, max_io, opts.timeout
        self.lost: str | None = None
        self.inline = 0  # in-capsule data bytes the controller takes (set after Identify)
        self.remote_invalidations = self.local_invalidations = self.in_capsule_writes = 0
        self._bound: dict[int, int] = {}  # slot -> the R_Key its window is bound with
        self._free = list(range(size - 1, -1, -1))
        self._sent: set[int] = set()  # slots whose command SEND has not completed
        self._done: dict[int, w.Completion] = {}
        self._lock = threading.Lock()
        self._owned: list[object] = []
        self.ca = al.open_ca(route.ca_guid)
        try:
            self.pd = self.ca.alloc_pd()
            self.cq = self.ca.create_cq(5 * size + 4)
            self.qp = self.pd.create_qp(QpCreate(QpType.RC, self.cq, self.cq,
                                                 sq_depth=3 * size + 1, rq_depth=size,
                                                 sq_sge=2))  # fmt: skip
            self.cmds = bytearray(size * w.SQE_SIZE)
            self.rsps = bytearray(size * w.CQE_SIZE)
            self.data = bytearray(size * max_io)
            self.cmd_mr = self.pd.reg_mem(self.cmds, AccessFlags.LOCAL_WRITE)
            self.rsp_mr = self.pd.reg_mem(self.rsps, AccessFlags.LOCAL_WRITE)
            remote = AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE
            windows = opts.remote_invalidate
            self.data_mr = self.pd.reg_mem(self.data, AccessFlags.LOCAL_WRITE | (
                AccessFlags.MW_BIND if windows else remote))  # fmt: skip
            self.windows = [self.pd.create_mw(2) for _ in range(size)] if windows else []
            self._keys = [mw.rkey for mw in self.windows]
            rdma.init_qp(self.qp, route)
            for i in range(size):
                self._post_recv(i)
            said = self.claimed = size if claim is None else claim
            pdata = w.CM_REQ.encode(recfmt=0, qid=qid, hrqsize=said, hsqsize=said - 1)
            try:
                self.conn = rdma.connect(al, route.dst, opts.port, self.qp, pdata, route=route,
                                         timeout=opts.timeout, resp_res=4, init_depth=1,
                                         retry_cnt=7, rnr_retry_cnt=7)  # fmt: skip
            except ConnectionRejected as exc:
                raise ControllerLost(f"queue {qid}: the target refused the connect "
                                     f"({_rej_text(exc)})") from exc  # fmt: skip
            rep = w.CM_REP.decode(self.conn.private_data.ljust(w.CM_REP.size, b"\0"))
            if rep["recfmt"] != 0:
                raise ControllerLost(f"queue {qid}: REP record format {rep['recfmt']!r}")
            self.crqsize = int(rep["crqsize"])
        except BaseException:
            self._release()
            raise

    def _post_recv(self, slot: int) -> None:
        sge = Sge(addr=self.rsp_mr.vaddr + slot * w.CQE_SIZE, length=w.CQE_SIZE,
                  lkey=self.rsp_mr.lkey)  # fmt: skip
        self.qp.post_recv(RecvWr(wr_id=_RECV | slot, sg_list=[sge]))

    # ------------------------------------------------------------ commands

    def data_sgl(self, slot: int, length: int) -> w.Sgl:
        """The keyed descriptor of ``slot``'s data area (``length`` bytes of it)."""
        if length == 0:
            return w.NULL_SGL
        if length > self.max_io:
            raise InvalidParameter(f"{length} bytes: this queue moves at most {self.max_io}")
        return w.Sgl.keyed_addr(self.data_mr.vaddr + slot * self.max_io, length,
                                self.data_mr.rkey)  # fmt: skip

    def submit(self, build: Callable[[int, w.Sgl], bytes], length: int = 0,
               data: bytes | None = None) -> int:  # fmt: skip
        """Send the command ``build(command_id, sgl)`` makes; ``data`` (a write's) goes to
        the slot's data area first.  Returns the command id; waits for a free slot."""
        self._check()
        if data is not None:
            length = len(data)
        deadline = time.monotonic() + self.timeout
        while True:
            with self._lock:
                if self._free:
                    slot = self._free.pop()
                    break
            self._reap(deadline)
        off = slot * self.max_io
        inline = data is not None and 0 < length <= self.inline
        wrs: list[SendWr] = []
        try:
            if inline:
                sgl = w.Sgl(w.SglType.DATA_OFFSET, 0, length)
            elif self.windows and length:
                sgl, bind = self._bind(slot, length)
                wrs.append(bind)
            else:
                sgl = self.data_sgl(slot, length)
            if data is not None:
                self.data[off : off + length] = data
            cmd = build(slot, sgl)
        except BaseException:
            with self._lock:
                self._free.append(slot)
            raise
        self.cmds[slot * w.SQE_SIZE : (slot + 1) * w.SQE_SIZE] = cmd
        with self._lock:
            self._sent.add(slot)
        sges = [Sge(addr=self.cmd_mr.vaddr + slot * w.SQE_SIZE, length=w.SQE_SIZE,
                    lkey=self.cmd_mr.lkey)]  # fmt: skip
        if inline:
            sges.append(Sge(addr=self.data_mr.vaddr + off, length=length, lkey=self.data_mr.lkey))
            self.in_capsule_writes += 1
        wrs.append(SendWr(wr_id=_SEND | slot, opcode=WrType.SEND, sg_list=sges,
                          send_opt=SendOpt.SIGNALED))  # fmt: skip
        try:
            self.qp.post_send(wrs)
        except IbError as exc:
            self._lose(f"posting a command failed: {exc}")
            raise ControllerLost(self.lost or "") from exc
        return slot

    def _bind(self, slot: int, length: int) -> tuple[w.Sgl, SendWr]:
        """The BIND_MW that opens ``slot``'s window on ``length`` bytes of its data area
        under a new key, and the descriptor that asks the target to invalidate it."""
        if length > self.max_io:
            raise InvalidParameter(f"{length} bytes: this queue moves at most {self.max_io}")
        old, new = self._keys[slot], _next_key(self._keys[slot])
        addr = self.data_mr.vaddr + slot * self.max_io
        bind = SendWr(wr_id=_BIND | slot, opcode=WrType.BIND_MW, rkey=new, mw=self.windows[slot],
                      bind=BindWr(self.data_mr, addr, length,
                                  AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE, old),
                      send_opt=SendOpt.SIGNALED)  # fmt: skip
        self._keys[slot] = new
        self._bound[slot] = new
        return w.Sgl.keyed_addr(addr, length, new, invalidate=True), bind

    def wait(self, cid: int) -> w.Completion:
        """The completion of command ``cid``; its slot is free again (its data area keeps
        what a read brought until the slot is reused).  A window the target did not
        invalidate is invalidated here before the slot is reused (the send queue keeps
        the LOCAL_INV before the slot's next bind)."""
        deadline = time.monotonic() + self.timeout
        while True:
            with self._lock:
                if cid in self._done and cid not in self._sent:
                    c = self._done.pop(cid)
                    key = self._bound.pop(cid, None)
                    if key is None:
                        self._free.append(cid)
                        return c
                    break
            self._reap(deadline)
        self.local_invalidations += 1
        try:
            self.qp.post_send(SendWr(wr_id=_LINV | cid, opcode=WrType.LOCAL_INV,
                                     invalidate_rkey=key, send_opt=SendOpt.SIGNALED))
        except IbError as exc:
            self._lose(f"posting a local invalidate failed: {exc}")
            raise ControllerLost(self.lost or "") from exc
        with self._lock:
            self._free.append(cid)
        return c

    def slot_data(self, cid: int, length: int) -> bytes:
        off = cid * self.max_io
        return bytes(self.data[off : off + length])

    def call(self, build: Callable[[int, w.Sgl], bytes], what: str, length: int = 0,
             data: bytes | None = None) -> tuple[w.Completion, bytes]:  # fmt: skip
        """Submit, wait, raise :class:`NvmeStatusError` on an error status; returns the
        completion and the ``length`` bytes of data the target wrote."""
        cid = self.submit(build, length, data)
        c = self.wait(cid)
        if not c.ok:
            raise NvmeStatusError(what, c.status)
        return c, self.slot_data(cid, length) if data is None and length else b""

    def _reap(self, deadline: float) -> None:
        """Poll the CQ once (blocking up to a short while) and take what came."""
        self._check()
        left = deadline - time.monotonic()
        if left <= 0:
            self._lose(f"no response in {self.timeout} s")
            raise ControllerLost(f"queue {self.qid}: {self.lost}")
        wcs = self.cq.wait(min(left, 0.25), max_entries=16)
        if not wcs and self.conn.connection.closed.done:
            self._lose("the target disconnected")
        for wc in wcs:
            if wc.status is not WcStatus.SUCCESS:
                self._lose(f"{wc.wc_type.name} completion {wc.status.name}")
                continue
            slot = wc.wr_id & 0xFFFFFFFF
            if wc.wc_type is WcType.RECV:
                raw = bytes(self.rsps[slot * w.CQE_SIZE : (slot + 1) * w.CQE_SIZE])
                self._post_recv(slot)
                c = w.Completion.decode(raw)
                with self._lock:
                    if c.command_id < self.size and c.command_id not in self._free:
                        self._done[c.command_id] = c
                        if (wc.recv_opt & RecvOpt.INVALIDATE and wc.invalidated_rkey is not None
                                and self._bound.get(c.command_id) == wc.invalidated_rkey):
                            del self._bound[c.command_id]  # the target invalidated it
                            self.remote_invalidations += 1
            elif wc.wc_type is WcType.SEND:
                with self._lock:
                    self._sent.discard(slot)
        self._check()

    def _check(self) -> None:
        if self.lost is not None:
            raise ControllerLost(f"queue {self.qid}: {self.lost}")

    def _lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why

    # ------------------------------------------------------------ teardown

    def owned(self) -> Iterator[object]:
        """The AL objects this queue made that are still alive."""
        for name in ("qp", "cmd_mr", "rsp_mr", "data_mr", "cq", "pd"):
            obj = getattr(self, name, None)
            if obj is not None and obj.alive:
                yield obj
        yield from (mw for mw in getattr(self, "windows", []) if mw.alive)

    def close(self) -> None:
        """Disconnect (if still connected) and release everything this queue registered."""
        conn = getattr(self, "conn", None)
        if conn is not None and not conn.connection.closed.done and self.lost is None:
            with contextlib.suppress(IbError):  # the peer is gone: the teardown still runs
                conn.disconnect(timeout=min(self.timeout, 5.0))
        self._release()

    def _release(self) -> None:
        conn = getattr(self, "conn", None)
        if conn is not None:
            conn.connection.close()
        if getattr(self, "qp", None) is not None and self.qp.alive:
            with contextlib.suppress(IbError):
                self.qp.destroy(wait=True)
        for mw in getattr(self, "windows", []):
            with contextlib.suppress(IbError):
                mw.destroy()
        for name in ("qp", "cmd_mr", "rsp_mr", "data_mr", "cq", "pd"):
            obj = getattr(self, name, None)
            if obj is None or not obj.alive:
                continue
            try:
                if name == "qp":
                    obj.destroy(wait=True)
                elif name.endswith("_mr"):
                    obj.dereg()
                elif name == "cq":
                    obj.destroy(wait=True)
                else:
                    obj.dealloc(wait=True)
            except IbError:
                pass  # already going with its parent
        if self.ca.alive:
            self.ca.close(wait=True)


def _rej_text(exc: ConnectionRejected) -> str:
    if len(exc.private_data) >= w.CM_REJ.size:
        d = w.CM_REJ.decode(exc.private_data)
        try:
            return f"{w.CmRejStatus(int(d['sts'])).name}"
        except ValueError:
            return f"status {d['sts']!r}"
    return str(exc)



def fabrics_connect(q: HostQueue, opts: HostOptions, subnqn: str, cntlid: int,
                    kato_ms: int) -> int:  # fmt: skip
    """The Fabrics Connect of queue ``q`` (``cntlid`` 0xFFFF for a new controller on an
    admin queue); returns the controller ID."""
    data = w.connect_data(opts.hostid, cntlid, subnqn, opts.hostnqn)
    c, _ = q.call(lambda cid, sgl: w.connect_command(cid, q.qid, q.claimed - 1, kato_ms, sgl),
                  f"Connect (queue {q.qid})", data=data)  # fmt: skip
    return c.result & 0xFFFF


class Controller:
    """An NVMe controller on a target, through an admin queue and ``io_queues`` I/O queues."""

    def __init__(self, al: AccessLayer, addr: str, subnqn: str,
                 opts: HostOptions | None = None, *, src: str | None = None) -> None:  # fmt: skip
        self.opts = opts or HostOptions()
        self.subnqn = subnqn
        self.discovery = subnqn == w.DISCOVERY_NQN
        self.route = rdma.resolve_route(al, addr, src=src)
        self._al = al
        self.io: list[HostQueue] = []
        self.cntlid = 0
        self._admin_lock = threading.Lock()
        self._stop = threading.Event()
        self._ka: threading.Thread | None = None
        self.keep_alives = 0
        self.admin = HostQueue(al, self.route, 0, w.AQ_DEPTH, 4096, self.opts)
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        kato = 0 if self.discovery else self.opts.kato_ms
        self.cntlid = self._connect(self.admin, w.CNTLID_DYNAMIC, kato)
        self.cap = self.property_get(w.Property.CAP)
        self.vs = self.property_get(w.Property.VS)
        cc = w.CC_EN | 6 << 16 | 4 << 20  # 64-byte SQEs, 16-byte CQEs, 4 KiB pages
        self.property_set(w.Property.CC, cc)
        deadline = time.monotonic() + self.opts.timeout
        while not self.property_get(w.Property.CSTS) & w.CSTS_RDY:
            if time.monotonic() > deadline:
                raise Timeout("the controller did not become ready")
            time.sleep(0.05)  # CSTS.RDY has no event: the specification polls it
        self.id_ctrl = self.identify(w.Cns.CONTROLLER)
        if kato:
            self._ka = threading.Thread(target=self._keep_alive_loop, args=(kato / 2000.0,),
                                        name=f"nvme-ka-{self.cntlid}", daemon=True)  # fmt: skip
            self._ka.start()
        if self.discovery or not self.opts.io_queues:
            return
        want = self.opts.io_queues - 1
        got = self.set_features(w.Feature.NUM_QUEUES, want | want << 16)
        nq = min(self.opts.io_queues, (got & 0xFFFF) + 1, (got >> 16) + 1)
        mqes = (self.cap & 0xFFFF) + 1
        size = min(self.opts.queue_size, mqes, int(self.id_ctrl["maxcmd"]) or mqes)
        ic = int(self.id_ctrl["ioccsz"]) * 16 - w.SQE_SIZE
        offers = int(self.id_ctrl["sgls"]) & w.SGLS_OFFSET and ic > 0
        for qid in range(1, nq + 1):
            q = HostQueue(self._al, self.route, qid, size, self.opts.max_io, self.opts)
            self.io.append(q)
            self._connect(q, self.cntlid, kato)
            if offers and self.opts.in_capsule:  # after Connect: its data stays keyed
                q.inline = min(ic, self.opts.max_io)

    def _connect(self, q: HostQueue, cntlid: int, kato: int) -> int:
        return fabrics_connect(q, self.opts, self.subnqn, cntlid, kato)

    # ------------------------------------------------------------ admin commands

    def admin_call(self, build: Callable[[int, w.Sgl], bytes], what: str,
                   length: int = 0) -> tuple[w.Completion, bytes]:  # fmt: skip
        with self._admin_lock:
            return self.admin.call(build, what, length)

    def property_get(self, prop: w.Property) -> int:
        c, _ = self.admin_call(lambda cid, _: w.property_get(cid, prop),
                               f"Property Get {prop.name}")  # fmt: skip
        return c.result

    def property_set(self, prop: w.Property, value: int) -> None:
        self.admin_call(lambda cid, _: w.property_set(cid, prop, value),
                        f"Property Set {prop.name}")  # fmt: skip

    def identify(self, cns: w.Cns, nsid: int = 0) -> dict[str, w.Value]:
        """Identify controller or namespace, decoded; the raw 4 KiB with ``identify_raw``."""
        table = w.ID_CTRL if cns is w.Cns.CONTROLLER else w.ID_NS
        return table.decode(self.identify_raw(cns, nsid))

    def identify_raw(self, cns: w.Cns, nsid: int = 0) -> bytes:
        _, data = self.admin_call(lambda cid, sgl: w.command(w.AdminOpcode.IDENTIFY, cid,
                                                             nsid=nsid, sgl=sgl, cdw10=cns),
                                  f"Identify {cns.name}", 4096)  # fmt: skip
        return data

    def active_namespaces(self) -> list[int]:
        raw = self.identify_raw(w.Cns.ACTIVE_NS_LIST)
        ids = [int.from_bytes(raw[i : i + 4], "little") for i in range(0, 4096, 4)]
        return [n for n in ids if n]

    def get_log_page(self, lid: int, nbytes: int, offset: int = 0) -> bytes:
        _, data = self.admin_call(lambda cid, sgl: w.get_log_page(cid, lid, nbytes, sgl, offset),
                                  f"Get Log Page {lid:#x}", nbytes)  # fmt: skip
        return data

    def discovery_log(self) -> list[w.DiscoveryEntry]:
        """The discovery log page: the header, then every record, read in pieces the
        admin queue's data slots hold (by log page offset), until the generation
        counter holds still, as ``nvme discover`` does."""
        step = self.admin.max_io
        for _ in range(5):
            head = self.get_log_page(w.LogPage.DISCOVERY, w.DISC_HEADER.size)
            gen, numrec, _ = w.parse_discovery_log(head)
            if numrec > 1024:
                raise InvalidState(f"the discovery log claims {numrec} records")
            size = w.DISC_HEADER.size + numrec * w.DISC_ENTRY.size
            page = b"".join(self.get_log_page(w.LogPage.DISCOVERY, min(step, size - off), off)
                            for off in range(0, size, step))  # fmt: skip
            gen2, _, entries = w.parse_discovery_log(page)
            if gen2 == gen:
                return entries
        raise InvalidState("the discovery log kept changing")

    def get_features(self, fid: int) -> int:
        c, _ = self.admin_call(lambda cid, _: w.command(w.AdminOpcode.GET_FEATURES, cid,
                                                        cdw10=fid),
                               f"Get Features {fid:#x}")  # fmt: skip
        return c.result

    def set_features(self, fid: int, value: int) -> int:
        c, _ = self.admin_call(lambda cid, _: w.command(w.AdminOpcode.SET_FEATURES, cid,
                                                        cdw10=fid, cdw11=value),
                               f"Set Features {fid:#x}")  # fmt: skip
        return c.result

    def keep_alive(self) -> None:
        self.admin_call(lambda cid, _: w.command(w.AdminOpcode.KEEP_ALIVE, cid), "Keep Alive")
        self.keep_alives += 1

    def _keep_alive_loop(self, period: float) -> None:
        while not self._stop.wait(period):
            try:
                self.keep_alive()
            except IbError:
                return  # the next command says why

    # ------------------------------------------------------------ I/O

    def queue(self, qid: int = 1) -> HostQueue:
        if not 1 <= qid <= len(self.io):
            raise InvalidParameter(f"I/O queue {qid}: this controller has {len(self.io)}")
        return self.io[qid - 1]

    def submit_read(self, nsid: int, slba: int, nblocks: int, block: int, qid: int = 1) -> int:
        q = self.queue(qid)
        return q.submit(lambda cid, sgl: w.rw_command(w.IoOpcode.READ, cid, nsid, slba, nblocks,
                                                      sgl), nblocks * block)  # fmt: skip

    def submit_write(self, nsid: int, slba: int, data: bytes, block: int, qid: int = 1) -> int:
        if not data or len(data) % block:
            raise InvalidParameter(f"a write is whole {block}-byte blocks, not {len(data)} bytes")
        q = self.queue(qid)
        n = len(data) // block
        return q.submit(lambda cid, sgl: w.rw_command(w.IoOpcode.WRITE, cid, nsid, slba, n, sgl),
                        data=data)  # fmt: skip

    def complete(self, cid: int, qid: int = 1, length: int = 0, what: str = "I/O") -> bytes:
        """Wait for I/O command ``cid``; a read's ``length`` bytes."""
        q = self.queue(qid)
        c = q.wait(cid)
        if not c.ok:
            raise NvmeStatusError(what, c.status)
        return q.slot_data(cid, length) if length else b""

    def read(self, nsid: int, slba: int, nblocks: int, block: int, qid: int = 1) -> bytes:
        cid = self.submit_read(nsid, slba, nblocks, block, qid)
        return self.complete(cid, qid, nblocks * block, f"READ {slba}+{nblocks}")

    def write(self, nsid: int, slba: int, data: bytes, block: int, qid: int = 1) -> None:
        cid = self.submit_write(nsid, slba, data, block, qid)
        self.complete(cid, qid, 0, f"WRITE {slba}+{len(data) // block}")

    def flush(self, nsid: int, qid: int = 1) -> None:
        self.queue(qid).call(lambda cid, _: w.command(w.IoOpcode.FLUSH, cid, nsid=nsid), "FLUSH")

    def namespace(self, nsid: int = 1) -> BlockDevice:
        return BlockDevice(self, nsid)

    # ------------------------------------------------------------ teardown

    def registered(self) -> list[object]:
        """The AL objects of this controller still alive (none after :meth:`close`)."""
        return [o for q in (self.admin, *self.io) for o in q.owned()]

    def close(self) -> None:
        """Shut the controller down (CC.SHN) if it still answers, then disconnect and
        release every queue."""
        self._stop.set()
        if self._ka is not None:
            self._ka.join(5)
        try:
            if self.admin.lost is None and getattr(self, "id_ctrl", None) is not None:
                self.property_set(w.Property.CC, 1 << 14 | 6 << 16 | 4 << 20)
        except IbError:
            pass  # going away anyway
        finally:
            for q in reversed(self.io):
                q.close()
            self.admin.close()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class BlockDevice(io.RawIOBase):
    """Namespace ``nsid`` as a seekable raw binary stream (reads and writes of any size
    and offset; partial blocks are read, merged and written back)."""

    def __init__(self, ctrl: Controller, nsid: int = 1, qid: int = 1) -> None:
        super().__init__()
        self.ctrl, self.nsid, self.qid = ctrl, nsid, qid
        ns = ctrl.identify(w.Cns.NAMESPACE, nsid)
        self.block = 1 << int(ns["lbaf0_lbads"])
        self.blocks = int(ns["nsze"])
        if not self.blocks:
            raise InvalidParameter(f"namespace {nsid} is not active")
        self.size = self.blocks * self.block
        self._pos = 0
        self._chunk = ctrl.queue(qid).max_io // self.block

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def read_blocks(self, slba: int, nblocks: int) -> bytes:
        out = bytearray()
        while nblocks:
            n = min(nblocks, self._chunk)
            out += self.ctrl.read(self.nsid, slba, n, self.block, self.qid)
            slba, nblocks = slba + n, nblocks - n
        return bytes(out)

    def write_blocks(self, slba: int, data: bytes) -> None:
        step = self._chunk * self.block
        for off in range(0, len(data), step):
            self.ctrl.write(self.nsid, slba + off // self.block, data[off : off + step],
                            self.block, self.qid)  # fmt: skip

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = min(len(b), max(0, self.size - self._pos))
        if not n:
            return 0
        first, last = self._pos // self.block, (self._pos + n - 1) // self.block
        data = self.read_blocks(first, last - first + 1)
        skip = self._pos - first * self.block
        b[:n] = data[skip : skip + n]
        self._pos += n
        return n

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        data = bytes(b)
        if self._pos + len(data) > self.size:
            raise InvalidParameter(f"a write of {len(data)} bytes at {self._pos} passes the "
                                   f"end of the namespace ({self.size} bytes)")  # fmt: skip
        if not data:
            return 0
        first, last = self._pos // self.block, (self._pos + len(data) - 1) // self.block
        skip = self._pos - first * self.block
        span = (last - first + 1) * self.block
        if skip or len(data) != span:  # partial blocks: read, merge, write back
            old = bytearray(self.read_blocks(first, last - first + 1))
            old[skip : skip + len(data)] = data
            data = bytes(old)
        self.write_blocks(first, data)
        self._pos += len(b)
        return len(b)

    def flush(self) -> None:
        if not self.closed:
            self.ctrl.flush(self.nsid, self.qid)


def discover(al: AccessLayer, addr: str, opts: HostOptions | None = None,
             *, src: str | None = None) -> list[w.DiscoveryEntry]:  # fmt: skip
    """``nvme discover``: the discovery controller's log page records."""
    with Controller(al, addr, w.DISCOVERY_NQN, opts, src=src) as ctrl:
        return ctrl.discovery_log()
