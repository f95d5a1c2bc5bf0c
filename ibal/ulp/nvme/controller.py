"""The NVMe target's controller logic, sans-IO: subsystems, namespaces, command execution.

:class:`QueueMachine` is one submission queue of a controller.  It takes a
received command capsule (:meth:`QueueMachine.capsule`) and answers with a
:class:`Step`: :class:`Respond` (a completion), :class:`Fetch` (the host's data
must be read first through the keyed SGL; :meth:`QueueMachine.fetched` goes on
with it), :class:`Deliver` (data to write to the host, then the completion) or
:class:`Hold` (an Asynchronous Event Request, answered only when an event
comes).  The transport (:mod:`ibal.ulp.nvme.target`) carries the steps out with
RDMA READ, RDMA WRITE and SEND; nothing here touches a queue pair.

Bad capsules are answered with the status the NVMe base specification gives
and counted in ``stats``: a wrong SGL type or subtype, a data length that is not
the command's, an in-capsule offset past the data, a namespace that does not
exist, an LBA range past its end, an opcode nobody implements, a command on a
queue of a controller that is not enabled, a queue overrun.  A capsule shorter
than a command cannot be answered (its command id is unknown): it is dropped and
counted.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ibal.status import InvalidParameter
from ibal.ulp.nvme import wire as w

__all__ = ["Deliver", "Fetch", "Hold", "Namespace", "QueueMachine", "Respond", "Step",
           "Subsystem"]  # fmt: skip

MDTS = 5  # 2^5 4 KiB pages: 128 KiB per command
MAX_IO = 4096 << MDTS
INLINE_DATA = 4096  # in-capsule data an I/O queue's capsule may carry
AERL = 3  # 0's based: four Asynchronous Event Requests may be outstanding
MAX_QUEUE = 128
VS_1_3 = 0x00010300


class Namespace:
    """A namespace backed by a file (``path``) or by memory (``size`` bytes)."""

    def __init__(self, nsid: int = 1, *, path: str | None = None, size: int = 0,
                 block: int = 512) -> None:  # fmt: skip
        if block not in (512, 1024, 2048, 4096):
            raise InvalidParameter(f"block size {block}: 512, 1024, 2048 or 4096")
        self.nsid, self.block = nsid, block
        self.uuid = uuid.uuid4()
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._mem: bytearray | None = None
        if path is not None:
            self._fd = os.open(path, os.O_RDWR)
            size = os.fstat(self._fd).st_size
        else:
            self._mem = bytearray(size)
        self.blocks = size // block
        if not self.blocks:
            raise InvalidParameter(f"namespace {nsid}: {size} bytes is not one {block}-byte block")

    def read(self, slba: int, nblocks: int) -> bytes:
        off, n = slba * self.block, nblocks * self.block
        if self._fd is not None:
            return os.pread(self._fd, n, off)
        assert self._mem is not None
        return bytes(self._mem[off : off + n])

    def write(self, slba: int, data: bytes) -> None:
        off = slba * self.block
        if self._fd is not None:
            os.pwrite(self._fd, data, off)
            return
        assert self._mem is not None
        self._mem[off : off + len(data)] = data

    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@dataclass
class ControllerState:
    """One controller of a subsystem: what its admin queue's Connect created."""

    cntlid: int
    hostnqn: str
    kato_ms: int
    cc: int = 0
    csts: int = 0
    io_queues: set[int] = field(default_factory=set)
    aers: int = 0
    keep_alives: int = 0


class Subsystem:
    """An NVM subsystem: an NQN, its namespaces and the controllers hosts connected to."""

    def __init__(self, nqn: str, namespaces: list[Namespace], *, serial: str = "",
                 max_io_queues: int = 8) -> None:  # fmt: skip
        if len(nqn.encode()) > 223:
            raise InvalidParameter("an NQN is at most 223 bytes")
        self.nqn = nqn
        self.namespaces = {ns.nsid: ns for ns in namespaces}
        self.serial = serial or uuid.uuid4().hex[:20]
        self.max_io_queues = max_io_queues
        self.controllers: dict[int, ControllerState] = {}
        self.stats: Counter[str] = Counter()
        self._next = 1
        self._lock = threading.Lock()

    def new_controller(self, hostnqn: str, kato_ms: int) -> ControllerState:
        with self._lock:
            cntlid = self._next
            self._next = self._next % 0xFFEF + 1  # 0xFFF0.. are reserved
            ctrl = ControllerState(cntlid, hostnqn, kato_ms)
            self.controllers[cntlid] = ctrl
            return ctrl

    def drop_controller(self, cntlid: int) -> None:
        with self._lock:
            self.controllers.pop(cntlid, None)

    def close(self) -> None:
        for ns in self.namespaces.values():
            ns.close()


# ------------------------------------------------------------ steps


@dataclass(frozen=True)
class Respond:
    completion: w.Completion


@dataclass(frozen=True)
class Fetch:
    """Read ``length`` bytes at the host's keyed ``sgl``, then :meth:`QueueMachine.fetched`."""

    sgl: w.Sgl
    length: int
    then: Callable[[bytes], Step]


@dataclass(frozen=True)
class Deliver:
    """RDMA WRITE ``data`` to the host's ``sgl``, then send ``completion``."""

    sgl: w.Sgl
    data: bytes
    completion: w.Completion


@dataclass(frozen=True)
class Hold:
    """No answer now (an Asynchronous Event Request)."""


Step = Respond | Fetch | Deliver | Hold


class _Bad(Exception):
    def __init__(self, status: int, counter: str) -> None:
        self.status, self.counter = status, counter


# ------------------------------------------------------------ one queue


class QueueMachine:
    """One submission queue (``qid``, ``size`` entries) of a controller of ``subsys``."""

    def __init__(self, subsys: Subsystem, qid: int, size: int, inline: int = 0) -> None:
        self.subsys, self.qid, self.size, self.inline = subsys, qid, size, inline
        self.ctrl: ControllerState | None = None
        self.sq_head = 0
        self.outstanding = 0  # commands taken and not answered (held AERs included)
        self.stats = subsys.stats

    def _count(self, what: str) -> None:
        self.stats[what] += 1

    def _done(self, cid: int, status: int = 0, result: int = 0) -> w.Completion:
        return w.Completion(cid, status, result, self.sq_head, self.qid)

    def arrived(self) -> bool:
        """A capsule was received (the transport calls this as it comes, before it is
        served); whether it overruns the queue: more commands than its size are
        submitted and not answered."""
        self.outstanding += 1
        return self.outstanding > self.size

    def answered(self) -> None:
        """The transport sent one response (or dropped a capsule)."""
        self.outstanding = max(0, self.outstanding - 1)

    def capsule(self, raw: bytes, overrun: bool = False) -> Step | None:
        """The step for one received capsule (``overrun``: what :meth:`arrived` said);
        ``None`` when it cannot be answered."""
        if len(raw) < w.SQE_SIZE:
            self._count("dropped: short capsule")
            self.answered()
            return None
        self.sq_head = (self.sq_head + 1) % self.size
        cmd = w.SQE.decode(raw)
        cid = int(cmd["command_id"])
        if overrun:
            self._count("bad: queue overrun")
            return Respond(self._done(cid, w.Sc.CMD_SEQ_ERROR | w.DNR))
        try:
            return self._execute(cmd, raw)
        except _Bad as bad:
            self._count(bad.counter)
            return Respond(self._done(cid, bad.status))

    # ------------------------------------------------------------ data pointers

    def _sgl(self, cmd: dict[str, w.Value], raw: bytes, length: int, *,
             to_host: bool) -> w.Sgl | bytes:  # fmt: skip
        """The host's keyed descriptor of ``length`` bytes, or the in-capsule data."""
        if int(cmd["flags"]) & 0xC0 != w.PSDT_SGL:
            raise _Bad(w.Sc.INVALID_FIELD | w.DNR, "bad: not an SGL command")
        dptr = cmd["dptr"]
        assert isinstance(dptr, bytes)
        sgl = w.Sgl.decode(dptr)
        if sgl.keyed:
            if sgl.type not in (w.SglType.KEYED_ADDRESS, w.SglType.KEYED_INVALIDATE):
                raise _Bad(w.Sc.SGL_INVALID_SUBTYPE | w.DNR, "bad: SGL subtype")
            if sgl.length != length:
                raise _Bad(w.Sc.SGL_INVALID_DATA | w.DNR, "bad: SGL length")
            return sgl
        if sgl.type == w.SglType.DATA_OFFSET:
            if to_host:
                raise _Bad(w.Sc.INVALID_FIELD | w.DNR, "bad: in-capsule data for a read")
            have = len(raw) - w.SQE_SIZE
            if sgl.addr + sgl.length > min(have, self.inline):
                raise _Bad(w.Sc.SGL_INVALID_OFFSET | w.DNR, "bad: in-capsule offset")
            if sgl.length != length:
                raise _Bad(w.Sc.SGL_INVALID_DATA | w.DNR, "bad: SGL length")
            start = w.SQE_SIZE + sgl.addr
            return raw[start : start + sgl.length]
        raise _Bad(w.Sc.SGL_INVALID_TYPE | w.DNR, "bad: SGL type")

    def _to_host(self, cmd: dict[str, w.Value], raw: bytes, data: bytes,
                 result: int = 0) -> Step:  # fmt: skip
        cid = int(cmd["command_id"])
        if len(data) > MAX_IO:
            raise _Bad(w.Sc.INVALID_FIELD | w.DNR, "bad: transfer too long")
        sgl = self._sgl(cmd, raw, len(data), to_host=True)
        assert isinstance(sgl, w.Sgl)
        return Deliver(sgl, data, self._done(cid, 0, result))

    def _from_host(self, cmd: dict[str, w.Value], raw: bytes, length: int,
                   then: Callable[[bytes], w.Completion]) -> Step:  # fmt: skip
        src = self._sgl(cmd, raw, length, to_host=False)
        cid = int(cmd["command_id"])

        def go(data: bytes) -> Step:
            try:
                return Respond(then(data))
            except _Bad as bad:
                self._count(bad.counter)
                return Respond(self._done(cid, bad.status))

        if isinstance(src, bytes):
            self._count("in-capsule data")
            return go(src)
        return Fetch(src, length, go)

    # ------------------------------------------------------------ commands

    def _execute(self, cmd: dict[str, w.Value], raw: bytes) -> Step:
        op = int(cmd["opcode"])
        cid = int(cmd["command_id"])
        if op == w.AdminOpcode.FABRICS:
            return self._fabrics(raw, cid)
        if self.ctrl is None:
            raise _Bad(w.Sc.CMD_SEQ_ERROR | w.DNR, "bad: command before Connect")
        if self.qid == 0:
            return self._admin(op, cmd, raw, cid)
        if not self.ctrl.cc & w.CC_EN:
            raise _Bad(w.Sc.CMD_SEQ_ERROR | w.DNR, "bad: controller not enabled")
        return self._io(op, cmd, raw, cid)

    def _fabrics(self, raw: bytes, cid: int) -> Step:
        fctype = raw[4]
        if fctype == w.FabricsType.CONNECT:
            c = w.CONNECT_CMD.decode(raw)
            return self._from_host(w.SQE.decode(raw), raw, w.CONNECT_DATA.size,
                                   lambda data: self._connect(c, data, cid))  # fmt: skip
        if self.ctrl is None:
            raise _Bad(w.Sc.CMD_SEQ_ERROR | w.DNR, "bad: command before Connect")
        if fctype == w.FabricsType.PROPERTY_GET:
            g = w.PROPERTY_GET_CMD.decode(raw)
            return Respond(self._done(cid, 0, self._property(int(g["offset"]), int(g["attrib"]))))
        if fctype == w.FabricsType.PROPERTY_SET:
            s = w.PROPERTY_SET_CMD.decode(raw)
            if int(s["offset"]) != w.Property.CC:
                raise _Bad(w.Sc.INVALID_FIELD | w.DNR, "bad: property")
            self._set_cc(int(s["value"]) & 0xFFFFFFFF)
            return Respond(self._done(cid))
        raise _Bad(w.Sc.INVALID_OPCODE | w.DNR, "bad: fabrics command type")

    def _connect(self, c: dict[str, w.Value], data: bytes, cid: int) -> w.Completion:
        d = w.CONNECT_DATA.decode(data)
        if int(c["recfmt"]) != 0:
            raise _Bad(w.Sc.CONNECT_FORMAT | w.DNR, "bad: connect format")
        if w.nstr(d["subsysnqn"]) != self.subsys.nqn:
            raise _Bad(w.Sc.CONNECT_INVALID_HOST | w.DNR, "bad: connect subsystem")
        qid, sqsize = int(c["qid"]), int(c["sqsize"])
        if qid != self.qid or sqsize + 1 > self.size:
            raise _Bad(w.Sc.CONNECT_INVALID_PARAM | w.DNR, "bad: connect queue")
        if self.ctrl is not None:
            raise _Bad(w.Sc.CMD_SEQ_ERROR | w.DNR, "bad: second connect")
        if qid == 0:
            if int(d["cntlid"]) != w.CNTLID_DYNAMIC:
                raise _Bad(w.Sc.CONNECT_INVALID_PARAM | w.DNR, "bad: connect cntlid")
            self.ctrl = self.subsys.new_controller(w.nstr(d["hostnqn"]), int(c["kato"]))
        else:
            ctrl = self.subsys.controllers.get(int(d["cntlid"]))
            if ctrl is None or ctrl.hostnqn != w.nstr(d["hostnqn"]) or not ctrl.cc & w.CC_EN:
                raise _Bad(w.Sc.CONNECT_INVALID_PARAM | w.DNR, "bad: connect controller")
            if qid in ctrl.io_queues or qid > self.subsys.max_io_queues:
                raise _Bad(w.Sc.CONNECT_INVALID_PARAM | w.DNR, "bad: connect qid")
            ctrl.io_queues.add(qid)
            self.ctrl = ctrl
        self._count("connects")
        return self._done(cid, 0, self.ctrl.cntlid)

    def _property(self, offset: int, attrib: int) -> int:
        assert self.ctrl is not None
        if offset == w.Property.CAP:
            return w.cap_value(MAX_QUEUE - 1)
        if offset == w.Property.VS:
            return VS_1_3
        if offset == w.Property.CC:
            return self.ctrl.cc
        if offset == w.Property.CSTS:
            return self.ctrl.csts
        raise _Bad(w.Sc.INVALID_FIELD | w.DNR, "bad: property")

    def _set_cc(self, cc: int) -> None:
        ctrl = self.ctrl
        assert ctrl is not None
        ctrl.cc = cc
        if cc & w.CC_SHN_MASK:
            ctrl.csts = (ctrl.csts & ~(3 << 2)) | w.CSTS_SHST_CMPLT
        if cc & w.CC_EN:
            ctrl.csts |= w.CSTS_RDY
        else:
            ctrl.csts &= ~w.CSTS_RDY

    # ------------------------------------------------------------ admin

    def _admin(self, op: int, cmd: dict[str, w.Value], raw: bytes, cid: int) -> Step:
        ctrl = self.ctrl
        assert ctrl is not None
        cdw10, cdw11 = int(cmd["cdw10"]), int(cmd["cdw11"])
        if op == w.AdminOpcode.IDENTIFY:
            return self._to_host(cmd, raw, self._identify(cdw10 & 0xFF, int(cmd["nsid"]),
                                                          cdw11 >> 24))  # fmt: skip
        if op == w.AdminOpcode.KEEP_ALIVE:
            ctrl.keep_alives += 1
            return Respond(self._done(cid))
        if op == w.AdminOpcode.SET_FEATURES or op == w.AdminOpcode.GET_FEATURES:
            return Respond(self._done(cid, 0, self._feature(cdw10 & 0xFF, cdw11,
                                                            op == w.AdminOpcode.SET_FEATURES)))
        if op == w.AdminOpcode.GET_LOG_PAGE:
            lid = cdw10 & 0xFF
            numd = ((cdw10 >> 16) | (cdw11 & 0xFFFF) << 16) + 1
            offset = int(cmd["cdw12"]) | int(cmd["cdw13"]) << 32
            if lid not in (w.LogPage.ERROR, w.LogPage.SMART):
                raise _Bad(w.Sc.INVALID_LOG_PAGE | w.DNR, "bad: log page")
            if numd * 4 > MAX_IO:  # before anything is made of that size
                raise _Bad(w.Sc.INVALID_FIELD | w.DNR, "bad: transfer too long")
            page = bytes(512 if lid == w.LogPage.SMART else 64)
            data = page[offset : offset + numd * 4].ljust(numd * 4, b"\0")
            return self._to_host(cmd, raw, data)
        if op == w.AdminOpcode.ASYNC_EVENT:
            if ctrl.aers > AERL:
                raise _Bad(0x105 | w.DNR, "bad: too many AERs")  # Asynchronous Event Limit
            ctrl.aers += 1
            return Hold()
        if op == w.AdminOpcode.ABORT:
            return Respond(self._done(cid, 0, 1))  # bit 0: the command was not aborted
        raise _Bad(w.Sc.INVALID_OPCODE | w.DNR, "bad: admin opcode")

    def _feature(self, fid: int, value: int, set_: bool) -> int:
        ctrl = self.ctrl
        assert ctrl is not None
        if fid == w.Feature.NUM_QUEUES:
            n = self.subsys.max_io_queues - 1
            return n | n << 16
        if fid == w.Feature.KATO:
            if set_:
                ctrl.kato_ms = value
            return ctrl.kato_ms
        if fid == w.Feature.ASYNC_EVENT:
            return 0
        raise _Bad(w.Sc.INVALID_FIELD | w.DNR, "bad: feature")

    def _identify(self, cns: int, nsid: int, csi: int) -> bytes:
        ctrl = self.ctrl
        assert ctrl is not None
        if cns == w.Cns.CONTROLLER:
            return w.ID_CTRL.encode(
                vid=0, ssvid=0, sn=self.subsys.serial.encode().ljust(20), cntrltype=1,
                mn=b"ibal NVMe/RDMA target".ljust(40), fr=b"ibal".ljust(8), mdts=MDTS,
                cntlid=ctrl.cntlid, ver=VS_1_3, aerl=AERL, lpa=0, elpe=0, kas=10, sqes=0x66,
                cqes=0x44, maxcmd=MAX_QUEUE, nn=max(self.subsys.namespaces, default=0),
                vwc=1, sgls=w.SGLS_SUPPORTED | w.SGLS_KEYED | w.SGLS_OFFSET,
                subnqn=self.subsys.nqn.encode(), ioccsz=(w.SQE_SIZE + INLINE_DATA) // 16,
                iorcsz=w.CQE_SIZE // 16, icdoff=0, msdbd=1,
            )  # fmt: skip
        if cns == w.Cns.NAMESPACE:
            ns = self.subsys.namespaces.get(nsid)
            if ns is None:
                if nsid == 0 or nsid == 0xFFFFFFFF:
                    raise _Bad(w.Sc.INVALID_NS | w.DNR, "bad: namespace")
                return bytes(4096)  # an inactive namespace: all zero
            return w.ID_NS.encode(nsze=ns.blocks, ncap=ns.blocks, nuse=ns.blocks,
                                  nguid=ns.uuid.bytes, lbaf0_lbads=ns.block.bit_length() - 1)
        if cns == w.Cns.ACTIVE_NS_LIST:
            ids = sorted(n for n in self.subsys.namespaces if n > nsid)[:1024]
            return b"".join(n.to_bytes(4, "little") for n in ids).ljust(4096, b"\0")
        if cns == w.Cns.NS_DESC_LIST:
            ns = self.subsys.namespaces.get(nsid)
            if ns is None:
                raise _Bad(w.Sc.INVALID_NS | w.DNR, "bad: namespace")
            desc = w.NS_DESC.encode(nidt=w.NIDT_UUID, nidl=16) + ns.uuid.bytes
            return desc.ljust(4096, b"\0")
        if cns == w.Cns.CS_CONTROLLER and csi == 0:
            return bytes(4096)  # the NVM command set's limits: zero, none of its own
        raise _Bad(w.Sc.INVALID_FIELD | w.DNR, f"bad: identify CNS {cns:#x}")

    # ------------------------------------------------------------ I/O

    def _io(self, op: int, cmd: dict[str, w.Value], raw: bytes, cid: int) -> Step:
        if op not in (w.IoOpcode.READ, w.IoOpcode.WRITE, w.IoOpcode.FLUSH):
            raise _Bad(w.Sc.INVALID_OPCODE | w.DNR, "bad: I/O opcode")
        ns = self.subsys.namespaces.get(int(cmd["nsid"]))
        if ns is None:
            raise _Bad(w.Sc.INVALID_NS | w.DNR, "bad: namespace")
        if op == w.IoOpcode.FLUSH:
            ns.flush()
            return Respond(self._done(cid))
        slba = int(cmd["cdw10"]) | int(cmd["cdw11"]) << 32
        nblocks = (int(cmd["cdw12"]) & 0xFFFF) + 1
        length = nblocks * ns.block
        if slba + nblocks > ns.blocks:
            raise _Bad(w.Sc.LBA_RANGE | w.DNR, "bad: LBA range")
        if length > MAX_IO:
            raise _Bad(w.Sc.INVALID_FIELD | w.DNR, "bad: transfer too long")
        if op == w.IoOpcode.READ:
            self._count("reads")
            return self._to_host(cmd, raw, ns.read(slba, nblocks))

        def write(data: bytes) -> w.Completion:
            ns.write(slba, data)
            self._count("writes")
            return self._done(cid)

        return self._from_host(cmd, raw, length, write)
