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
import ipaddress
import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ibal.al import AccessLayer, QpCreate
from ibal.cm import Connection, ConnectionRejected, rdma, simple
from ibal.cm.rdma import port_with_gid
from ibal.status import IbError, InvalidParameter, RemoteError
from ibal.types import (
    AccessFlags,
    Gid,
    IocInfo,
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
from ibal.ulp.owned import live_owned, release_owned
from ibal.ulp.srp import wire as w
from ibal.wire.mad.sa import PATH_RECORD

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


_OWNED = ("qp", "iu_mr", "rmr", "dmr", "cq", "pd")
"""What an initiator holds, in release order."""


class SrpInitiator:
    """A logged-in SRP channel.  Either through the RDMA CM to ``addr``:``port`` (TCP port
    space, ``srp_login_req_rdma``: as Linux's ``ib_srp`` over RoCE), or through the IB CM
    on ``path`` to ``service_id`` (the full ``srp_login_req``: as an IOC's service entry
    names it, see :meth:`from_ioc`)."""

    def __init__(self, al: AccessLayer, target_port_id: bytes, initiator_port_id: bytes, *,
                 addr: str | None = None, port: int = 0, src: str | None = None,
                 path: Mapping[str, object] | None = None, service_id: int = 0,
                 max_io: int = 128 * 1024, timeout: float = 15.0) -> None:  # fmt: skip
        if len(target_port_id) != 16 or len(initiator_port_id) != 16:
            raise InvalidParameter("SRP port identifiers are 16 bytes")
        if (addr is None) == (path is None):
            raise InvalidParameter("give an address (RDMA CM) or a path (IB CM)")
        self.timeout, self.max_io = timeout, max_io
        self._tag = 0
        self.stats: dict[str, int] = {"commands": 0, "task management": 0}
        route = None
        if addr is not None:
            route = rdma.resolve_route(al, addr, src=src)
            ca_guid = route.ca_guid
        else:
            assert path is not None
            sgid = path["sgid"]
            assert isinstance(sgid, (bytes, Gid))
            ca_guid, port_num = port_with_gid(al, sgid if isinstance(sgid, Gid) else Gid(sgid))
        self.ca = al.open_ca(ca_guid)
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
            ids = {
                "tag": self._next_tag(), "req_buf_fmt": w.BUF_FORMAT_DIRECT | w.BUF_FORMAT_INDIRECT,
                "req_flags": w.MULTICHAN_SINGLE, "opcode": w.Opcode.LOGIN_REQ,
                "req_it_iu_len": IU_LEN,
                "initiator_port_id_hi": int.from_bytes(initiator_port_id[:8], "big"),
                "initiator_port_id_lo": int.from_bytes(initiator_port_id[8:], "big"),
                "target_port_id_hi": int.from_bytes(target_port_id[:8], "big"),
                "target_port_id_lo": int.from_bytes(target_port_id[8:], "big"),
            }  # fmt: skip
            opts = {"timeout": timeout, "resp_res": 4, "init_depth": 1, "retry_cnt": 7,
                    "rnr_retry_cnt": 7}  # fmt: skip
            if route is not None:
                rdma.init_qp(self.qp, route)
                self._post_all()
                req = w.LOGIN_REQ_RDMA.encode(ids)
                self._login(lambda: rdma.connect(al, route.dst, port, self.qp, req, route=route,
                                                 **opts).connection)  # type: ignore[arg-type]
            else:
                assert path is not None
                self.qp.modify(QpMod(QpState.INIT, port_num=port_num, pkey_index=0,
                                     access=AccessFlags.RDMA_READ | AccessFlags.RDMA_WRITE))
                self._post_all()
                req = w.LOGIN_REQ.encode(ids)
                self._login(lambda: simple.connect(al, self.qp, path, service_id, req,
                                                   **opts))  # type: ignore[arg-type]
        except BaseException:
            self.close()
            raise

    @classmethod
    def from_ioc(cls, al: AccessLayer, ioc: IocInfo, path: bytes, initiator_port_id: bytes,
                 *, rdma_port: int | None = None, **kw: object) -> SrpInitiator:  # fmt: skip
        """Log in to the SRP service of an IOC that IOC discovery reported (its
        ``IOC_ADD``'s ``ioc`` and an ``IOC_PATH_ADD``'s 64-byte ``path``): the target port
        identifier from the service entry and the IOC GUID; through the IB CM to the
        service ID the entry gives, or, with ``rdma_port``, through the RDMA CM to the
        path's destination address (a RoCE GID is an IP address) at that port: Linux's
        ``ib_srpt`` listens on the IB CM on InfiniBand ports only, so on RoCE its
        ``rdma_cm_port`` (configfs, not in any DM attribute) is the way in."""
        svc = next((e for e in ioc.svc_entries if e.name.startswith("SRP.T10:")), None)
        if svc is None:
            raise InvalidParameter(f"IOC {ioc.profile.ioc_guid:#x} has no SRP service entry")
        tport = w.target_port_id(svc.name, ioc.profile.ioc_guid)
        rec = dict(PATH_RECORD.decode(path))
        if rdma_port is not None:
            dgid = ipaddress.IPv6Address(bytes(rec["dgid"]))
            addr = str(dgid.ipv4_mapped or dgid)
            return cls(al, tport, initiator_port_id, addr=addr, port=rdma_port,
                       **kw)  # type: ignore[arg-type]
        return cls(al, tport, initiator_port_id, path=rec, service_id=svc.id,
                   **kw)  # type: ignore[arg-type]

    def _post_all(self) -> None:
        for i in range(RECVS):
            self._post_recv(i)

    def _login(self, connect: Callable[[], Connection]) -> None:
        try:
            self.conn = connect()
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
        rsp = w.LOGIN_RSP.decode(bytes(self.conn.private_data).ljust(w.LOGIN_RSP.size, b"\0"))
        if rsp["opcode"] != w.Opcode.LOGIN_RSP:
            raise SrpError(f"the REP carries IU {rsp['opcode']!r}, not SRP_LOGIN_RSP")
        self.login = rsp
        self.credits = int(rsp["req_lim_delta"])
        self.max_it_iu = int(rsp["max_it_iu_len"])

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
            if not wcs and self.conn.closed.done:
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
        return live_owned(self, _OWNED)

    def close(self) -> None:
        """Log out (disconnect) and release everything registered."""
        conn = getattr(self, "conn", None)
        if conn is not None:
            if not conn.closed.done:
                with contextlib.suppress(IbError):
                    conn.disconnect(timeout=min(self.timeout, 5.0))
            conn.close()
        release_owned(self, _OWNED)

    def __enter__(self) -> SrpInitiator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
