"""One end of the RMPP exchange of tests/mad/test_rmpp_kernel_lab.py (host and guest alike).

An SA-class (0x03, version 2) server that answers GetTable with a
multi-segment GetTableResp (``table(seed)``) and an RMPP Set with a single
GetResp carrying the length and SHA-256 of what it reassembled, and a client
that asks the other end for both.  The host runs it over ibal's own RMPP
(``enable_rmpp`` on the rxe provider's QP1), the guest over the kernel's
(rdma_core provider, umad agents registered with ``rmpp_version`` 1).
"""

from __future__ import annotations

import hashlib
import queue
from typing import Any

from ibal.al import AliasQp
from ibal.mad import MadElement, MadService, MadSvc, enable_rmpp, put_mad, reg_mad_svc, transact
from ibal.types import QP1_WELL_KNOWN_QKEY, Gid, Grh, MadAddr

SA, SA_VERSION = 0x03, 2
GET_RESP, SET, GET_TABLE, GET_TABLE_RESP = 0x81, 0x02, 0x12, 0x92
DATA = 56  # common header 24, RMPP header 12, SA header 20
SA_HEADER = 20
TABLE_BYTES, SET_BYTES = 4321, 3333  # 22 and 17 segments of 200 bytes
WAIT = 60.0


def pattern(n: int, seed: int) -> bytes:
    return bytes((i * 7 + seed * 31 + (i >> 8)) & 0xFF for i in range(n))


def digest(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + hashlib.sha256(data).digest()


class RmppPeer:
    """Server and client SA services on one QP1 alias."""

    def __init__(self, alias: AliasQp, seed: int, timers: Any = None) -> None:
        self.seed = seed
        self.served: list[str] = []
        self.server = reg_mad_svc(alias, MadSvc(SA, SA_VERSION, self._answer, put_mad,
                                                methods=frozenset({GET_TABLE, SET}),
                                                support_unsol=True))  # fmt: skip
        self.client = reg_mad_svc(alias, MadSvc(SA, SA_VERSION, self._unexpected, put_mad))
        self.unexpected: queue.Queue[MadElement] = queue.Queue()
        if timers is not None:  # no RMPP in the transport: ibal's own
            enable_rmpp(self.server, timers, class_header_size=SA_HEADER)
            enable_rmpp(self.client, timers, class_header_size=SA_HEADER)

    @property
    def services(self) -> tuple[MadService, MadService]:
        return self.server, self.client

    def _unexpected(self, e: MadElement) -> None:
        self.unexpected.put(e)

    def _answer(self, req: MadElement) -> None:
        """Misc queue: GetTable -> the table in segments; Set -> what arrived, as a digest."""
        method = req.mad[3]
        if method == GET_TABLE:
            data = pattern(TABLE_BYTES, self.seed)
            resp = self.server.pool_key.get_mad(DATA + len(data))
            resp.mad[DATA:] = data
            resp.rmpp_version = 1
            self.served.append(f"get_table:{len(req.mad)}")
        else:
            got = bytes(req.mad[DATA:])
            resp = self.server.pool_key.get_mad()
            resp.mad[DATA : DATA + 36] = digest(got)
            self.served.append(f"set:{len(got)}")
        resp.mad[:24] = req.mad[:24]
        resp.mad[3] = GET_TABLE_RESP if method == GET_TABLE else GET_RESP
        resp.mad[36:DATA] = req.mad[36:DATA]  # the SA header back
        resp.addr = req.addr
        put_mad(req)
        self.server.send(resp)

    def _request(self, method: int, data: bytes, to: MadAddr) -> MadElement:
        e = self.client.pool_key.get_mad(max(256, DATA + len(data)))
        e.mad[0:4] = bytes([1, SA, SA_VERSION, method])
        e.mad[16:18] = (0x0011).to_bytes(2, "big")  # a record attribute, for the looks
        e.mad[DATA : DATA + len(data)] = data
        e.rmpp_version = 1 if len(data) > 200 else 0
        e.addr, e.timeout_ms, e.retry_cnt = to, 4000, 3
        return e

    def ask(self, to: MadAddr) -> dict[str, Any]:
        """Ask the other end: its table (multi-segment answer), then an RMPP Set."""
        out: dict[str, Any] = {}
        req = self._request(GET_TABLE, b"", to)
        resp = transact(self.client, req, timeout=WAIT)
        out["table_method"] = resp.mad[3]
        out["table_len"] = len(resp.mad) - DATA
        out["table_rmpp_area"] = bytes(resp.mad[24:36]).hex()
        out["table_sha"] = hashlib.sha256(bytes(resp.mad[DATA:])).hexdigest()
        # The low half is the service's (the high half is the kernel's on umad).
        out["table_tid_match"] = bytes(resp.mad[12:16]) == bytes(req.mad[12:16])
        out["table_linked"] = resp.request is req
        put_mad([resp, req])
        body = pattern(SET_BYTES, self.seed + 100)
        req = self._request(SET, body, to)
        resp = transact(self.client, req, timeout=WAIT)
        out["set_method"] = resp.mad[3]
        out["set_reply"] = bytes(resp.mad[DATA : DATA + 36]).hex()
        out["set_expected"] = digest(body).hex()
        put_mad([resp, req])
        return out


def qp1(gid: Gid, sgid_index: int) -> MadAddr:
    return MadAddr(remote_qp=1, remote_qkey=QP1_WELL_KNOWN_QKEY,
                   grh=Grh(dgid=gid, sgid_index=sgid_index))  # fmt: skip
