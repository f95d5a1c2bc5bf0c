"""An SRP initiator: log in through ``ibal.cm.rdma``, SCSI commands, task management.

:class:`SrpInitiator` is one RDMA channel to an SRP target port: one RC QP with its
PD, CQ, receive slots for the target's IUs (``max_ti_iu_len`` each) and one registered
data area the target reads (WRITE) or writes (READ) through the descriptors of each
command.  The login request is the REQ's private data (``srp_login_req_rdma``: the
target port identifier the target expects, ours, the IU length and descriptor
formats we take); the target's SRP_LOGIN_RSP comes in the REP, an SRP_LOGIN_REJ in
the REJ (:class:`SrpLoginRejected`).  Commands are sent one at a time, within the
credits the target grants (``req_lim_delta``); data goes through one direct
descriptor, or an indirect table of several descriptors carried in the IU.
Logout is the disconnect (Linux's ``ib_srpt`` does not implement SRP_I_LOGOUT).
"""

from __future__ import annotations

import contextlib
import struct
import time
from dataclasses import dataclass

from ibal.al import AccessLayer, QpCreate
from ibal.cm import ConnectionRejected, rdma
from ibal.status import IbError, InvalidParameter, RemoteError
from ibal.types import AccessFlags, QpType, RecvWr, SendOpt, SendWr, Sge, WcStatus, WcType, WrType
from ibal.ulp.srp import wire as w

__all__ = ["ScsiError", "ScsiResult", "SrpError", "SrpInitiator", "SrpLoginRejected"]

IU_LEN = 4096  # the largest IU we send (a command with an indirect table)
RECVS = 16
_RECV, _SEND = 1 << 32, 2 << 32


class SrpError(RemoteError):
    """The channel failed (a transport error, a disconnect, no answer in time)."""


class SrpLoginRejected(SrpError):
    """The target refused the login: ``reason`` (SRP_LOGIN_REJ's), or the CM's reject."""

    def __init__(self, message: str, reason: int) -> None:
        super().__init__(message)
        self.reason = reason


class ScsiError(RemoteError):
    """A SCSI command ended with a status other than GOOD: ``scsi_status``, ``sense``."""

    def __init__(self, what: str, status: int, sense: bytes) -> None:
        key = sense[2] & 0xF if len(sense) > 2 else 0
        super().__init__(f"{what}: SCSI status {status:#x}, sense key {key:#x}")
        self.scsi_status, self.sense = status, sense
        self.sense_key = key


@dataclass(frozen=True)
class ScsiResult:
    status: int
    data: bytes
    sense: bytes
    resp: bytes
    residual: int


class SrpInitiator:
    """A logged-in SRP channel to ``addr``:``port`` (rdma_cm, TCP port space)."""

    def __init__(self, al: AccessLayer, addr: str, port: int, target_port_id: bytes,
                 initiator_port_id: bytes, *, src: str | None = None, max_io: int = 128 * 1024,
                 timeout: float = 15.0) -> None:  # fmt: skip
        if len(target_port_id) != 16 or len(initiator_port_id) != 16:
            raise InvalidParameter("SRP port identifiers are 16 bytes")
        self.timeout, self.max_io = timeout, max_io
        self.route = rdma.resolve_route(al, addr, src=src)
        self.ca = al.open_ca(self.route.ca_guid)
        self._tag = 0
        self.stats: dict[str, int] = {"commands": 0, "task management": 0}
        try:
            self.pd = self.ca.alloc_pd()
            self.cq = self.ca.create_cq(4 * RECVS)
            self.qp = self.pd.create_qp(QpCreate(QpType.RC, self.cq, self.cq, sq_depth=RECVS,
                                                 rq_depth=RECVS))  # fmt: skip
            self.iu = bytearray(IU_LEN)
            self.rbuf = bytearray(RECVS * IU_LEN)
            self.data = bytearray(max_io)
            self.iu_mr = self.pd.reg_mem(self.iu, AccessFlags.LOCAL_WRITE)
            self.rmr = self.pd.reg_mem(self.rbuf, AccessFlags.LOCAL_WRITE)
            self.dmr = self.pd.reg_mem(self.data, AccessFlags.LOCAL_WRITE
                                       | AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE)
            rdma.init_qp(self.qp, self.route)
            for i in range(RECVS):
                self._post_recv(i)
            req = w.LOGIN_REQ_RDMA.encode(
                tag=self._next_tag(), req_buf_fmt=w.BUF_FORMAT_DIRECT | w.BUF_FORMAT_INDIRECT,
                req_flags=w.MULTICHAN_SINGLE, opcode=w.Opcode.LOGIN_REQ, req_it_iu_len=IU_LEN,
                initiator_port_id_hi=int.from_bytes(initiator_port_id[:8], "big"),
                initiator_port_id_lo=int.from_bytes(initiator_port_id[8:], "big"),
                target_port_id_hi=int.from_bytes(target_port_id[:8], "big"),
                target_port_id_lo=int.from_bytes(target_port_id[8:], "big"),
            )  # fmt: skip
            try:
                self.conn = rdma.connect(al, self.route.dst, port, self.qp, req, route=self.route,
                                         timeout=timeout, resp_res=4, init_depth=1,
                                         retry_cnt=7, rnr_retry_cnt=7)  # fmt: skip
            except ConnectionRejected as exc:
                pd = exc.private_data
                if len(pd) >= w.LOGIN_REJ.size and pd[0] == w.Opcode.LOGIN_REJ:
                    reason = int(w.LOGIN_REJ.decode(pd)["reason"])
                    try:
                        why = w.LoginRejReason(reason).name
                    except ValueError:
                        why = f"{reason:#010x}"
                    raise SrpLoginRejected(f"SRP_LOGIN_REJ {why}", reason) from exc
                raise SrpLoginRejected(str(exc), 0) from exc
            rsp = w.LOGIN_RSP.decode(self.conn.private_data.ljust(w.LOGIN_RSP.size, b"\0"))
            if rsp["opcode"] != w.Opcode.LOGIN_RSP:
                raise SrpError(f"the REP carries IU {rsp['opcode']!r}, not SRP_LOGIN_RSP")
            self.login = rsp
            self.credits = int(rsp["req_lim_delta"])
            self.max_it_iu = int(rsp["max_it_iu_len"])
        except BaseException:
            self.close()
            raise

    def _next_tag(self) -> int:
        self._tag += 1
        return self._tag

    def _post_recv(self, i: int) -> None:
        self.qp.post_recv(RecvWr(wr_id=_RECV | i, sg_list=[
            Sge(addr=self.rmr.vaddr + i * IU_LEN, length=IU_LEN, lkey=self.rmr.lkey)]))

    # ------------------------------------------------------------ IUs

    def _exchange(self, iu: bytes, tag: int) -> dict[str, int | bytes]:
        """Send ``iu``, wait for the SRP_RSP with ``tag``; the decoded response (and its
        ``raw`` bytes)."""
        if len(iu) > self.max_it_iu:
            raise InvalidParameter(f"an IU of {len(iu)} bytes: the target takes {self.max_it_iu}")
        if self.credits <= 0:
            raise SrpError("no request credit left")
        self.credits -= 1
        self.iu[: len(iu)] = iu
        self.qp.post_send(SendWr(wr_id=_SEND, opcode=WrType.SEND, send_opt=SendOpt.SIGNALED,
                                 sg_list=[Sge(addr=self.iu_mr.vaddr, length=len(iu),
                                              lkey=self.iu_mr.lkey)]))  # fmt: skip
        deadline = time.monotonic() + self.timeout
        sent = False
        got: dict[str, int | bytes] | None = None
        while not (sent and got is not None):
            left = deadline - time.monotonic()
            if left <= 0:
                raise SrpError(f"no SRP_RSP in {self.timeout} s")
            wcs = self.cq.wait(min(left, 0.25), max_entries=8)
            if not wcs and self.conn.connection.closed.done:
                raise SrpError("the target disconnected")
            for wc in wcs:
                if wc.status is not WcStatus.SUCCESS:
                    raise SrpError(f"{wc.wc_type.name} completion {wc.status.name}")
                if wc.wc_type is WcType.SEND:
                    sent = True
                elif wc.wc_type is WcType.RECV:
                    i = wc.wr_id & 0xFFFFFFFF
                    raw = bytes(self.rbuf[i * IU_LEN : i * IU_LEN + wc.length])
                    self._post_recv(i)
                    if raw[:1] == bytes([w.Opcode.RSP]) and len(raw) >= w.RSP.size:
                        d: dict[str, int | bytes] = dict(w.RSP.decode(raw))
                        self.credits += int(d["req_lim_delta"])
                        if d["tag"] == tag:
                            d["raw"] = raw
                            got = d
                    # other target IUs (credit or AER requests) carry nothing we wait for
        assert got is not None
        return got

    def command(self, cdb: bytes, *, data_in: int = 0, data_out: bytes = b"",
                descriptors: int = 1, lun: int = 0) -> ScsiResult:
        """One SCSI command: ``data_in`` bytes to read, or ``data_out`` to write, through
        one direct descriptor or (``descriptors`` > 1) an indirect table of that many."""
        n = data_in or len(data_out)
        if data_in and data_out:
            raise InvalidParameter("bidirectional commands are not supported")
        if n > self.max_io:
            raise InvalidParameter(f"{n} bytes: the data area holds {self.max_io}")
        if not 1 <= descriptors <= 16 or (n and descriptors > n):
            raise InvalidParameter("1..16 descriptors, none empty")
        tag = self._next_tag()
        descs = b""
        fmt = 0
        if n:
            self.data[: len(data_out)] = data_out
            step = -(-n // descriptors)
            parts = [(off, min(step, n - off)) for off in range(0, n, step)]
            table = b"".join(w.DIRECT_BUF.encode(va=self.dmr.vaddr + off, key=self.dmr.rkey,
                                                 len=ln) for off, ln in parts)  # fmt: skip
            if len(parts) == 1:
                kind, descs = w.DESC_DIRECT, table
            else:
                # the whole table rides in the IU, so the target never fetches it: the
                # table's own descriptor names where it lies, with no remote key
                table_at = w.CMD.size + w.INDIRECT_HDR.size
                descs = w.INDIRECT_HDR.encode(va=self.iu_mr.vaddr + table_at, key=0,
                                              table_len=len(table), len=n) + table  # fmt: skip
                kind = w.DESC_INDIRECT
            fmt = kind << 4 if data_out else kind
            count = len(parts)
        else:
            count = 0
        iu = w.CMD.encode(opcode=w.Opcode.CMD, buf_fmt=fmt,
                          data_out_desc_cnt=count if data_out else 0,
                          data_in_desc_cnt=count if data_in else 0, tag=tag, lun=lun << 48,
                          add_cdb_len=0, **w.cdb_fields(cdb)) + descs  # fmt: skip
        self.stats["commands"] += 1
        d = self._exchange(iu, tag)
        raw = d["raw"]
        assert isinstance(raw, bytes)
        flags = int(d["flags"])
        rlen = int(d["resp_data_len"]) if flags & w.RSP_FLAG_RSPVALID else 0
        slen = int(d["sense_data_len"]) if flags & w.RSP_FLAG_SNSVALID else 0
        resp = raw[w.RSP.size : w.RSP.size + rlen]
        sense = raw[w.RSP.size + rlen : w.RSP.size + rlen + slen]
        resid = int(d["data_in_res_cnt"]) if flags & w.RSP_FLAG_DIUNDER else 0
        got = bytes(self.data[: max(0, data_in - resid)]) if data_in else b""
        return ScsiResult(int(d["status"]), got, sense, resp, resid)

    def scsi(self, what: str, cdb: bytes, **kw: object) -> ScsiResult:
        """:meth:`command`, retried once past a UNIT ATTENTION, raising :class:`ScsiError`."""
        for attempt in (0, 1):
            r = self.command(cdb, **kw)  # type: ignore[arg-type]
            if r.status == w.GOOD:
                return r
            if attempt == 0 and r.status == w.CHECK_CONDITION and r.sense[2:3] == b"\x06":
                continue  # a new session's unit attention: the command may be repeated
            raise ScsiError(what, r.status, r.sense)
        raise AssertionError("unreachable")

    def inquiry(self) -> tuple[str, str]:
        """(vendor, product) from standard INQUIRY data."""
        d = self.scsi("INQUIRY", w.INQUIRY, data_in=36).data
        return d[8:16].decode(errors="replace").strip(), d[16:32].decode(errors="replace").strip()

    def read_capacity(self) -> tuple[int, int]:
        """(number of blocks, block size) from READ CAPACITY(10)."""
        last, size = struct.unpack(">II", self.scsi("READ CAPACITY", w.READ_CAPACITY10,
                                                    data_in=8).data)  # fmt: skip
        return last + 1, size

    def read(self, lba: int, nblocks: int, block: int, descriptors: int = 1) -> bytes:
        return self.scsi(f"READ {lba}+{nblocks}", w.read10(lba, nblocks),
                         data_in=nblocks * block, descriptors=descriptors).data  # fmt: skip

    def write(self, lba: int, data: bytes, block: int, descriptors: int = 1) -> None:
        self.scsi(f"WRITE {lba}+{len(data) // block}", w.write10(lba, len(data) // block),
                  data_out=data, descriptors=descriptors)  # fmt: skip

    def task_management(self, function: int, task_tag: int = 0, lun: int = 0) -> int:
        """A task management function; the response code (0: function complete)."""
        tag = self._next_tag()
        iu = w.TSK_MGMT.encode(opcode=w.Opcode.TSK_MGMT, tag=tag, lun=lun << 48,
                               tsk_mgmt_func=function, task_tag=task_tag)  # fmt: skip
        self.stats["task management"] += 1
        d = self._exchange(iu, tag)
        raw = d["raw"]
        assert isinstance(raw, bytes)
        if int(d["flags"]) & w.RSP_FLAG_RSPVALID and int(d["resp_data_len"]) >= 4:
            return raw[w.RSP.size + 3]
        return 0

    # ------------------------------------------------------------ teardown

    def owned(self) -> list[object]:
        objs = (getattr(self, n, None) for n in ("qp", "iu_mr", "rmr", "dmr", "cq", "pd"))
        return [o for o in objs if o is not None and o.alive]

    def close(self) -> None:
        """Log out (disconnect) and release everything registered."""
        conn = getattr(self, "conn", None)
        if conn is not None:
            if not conn.connection.closed.done:
                with contextlib.suppress(IbError):
                    conn.disconnect(timeout=min(self.timeout, 5.0))
            conn.connection.close()
        for name in ("qp", "iu_mr", "rmr", "dmr", "cq", "pd"):
            obj = getattr(self, name, None)
            if obj is None or not obj.alive:
                continue
            with contextlib.suppress(IbError):
                if name in ("qp", "cq"):
                    obj.destroy(wait=True)
                elif name == "pd":
                    obj.dealloc(wait=True)
                else:
                    obj.dereg()
        if self.ca.alive:
            self.ca.close(wait=True)

    def __enter__(self) -> SrpInitiator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
