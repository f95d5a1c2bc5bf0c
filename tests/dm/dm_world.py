"""Helpers of the DM tests: a DM client (a plain MAD service on another port's QP1)."""

from __future__ import annotations

from ibal.al import AccessLayer, Ca
from ibal.mad import MadService, MadSvc, put_mad, reg_mad_svc, transact
from ibal.types import MadAddr, QpType
from ibal.wire.mad import header as H
from ibal.wire.mad.consts import Method, MgmtClass

WAIT = 10.0


class DmClient:
    """Sends DM requests from one local port and returns the raw 256-byte answers."""

    def __init__(self, al: AccessLayer, ca_guid: int, port_num: int = 1) -> None:
        self.ca: Ca = al.open_ca(ca_guid)
        self.port = self.ca.query_port(port_num)
        alias = self.ca.alloc_pd().get_spl_qp(self.port.port_guid, QpType.QP1_ALIAS)
        self.service: MadService = reg_mad_svc(
            alias, MadSvc(MgmtClass.DEV_MGT, 1, recv_cb=put_mad, send_cb=put_mad)
        )
        self._tid = 0x100

    def raw(self, mad: bytes, addr: MadAddr) -> bytes:
        """Send ``mad`` (a request) to ``addr`` and return its response's bytes."""
        e = self.service.pool_key.get_mad()
        e.mad[:] = mad
        e.addr = addr
        e.resp_expected, e.timeout_ms, e.retry_cnt = True, 2000, 2
        resp = transact(self.service, e, timeout=WAIT)
        try:
            return bytes(resp.mad)
        finally:
            put_mad([resp, e])

    def get(self, attr: int, addr: MadAddr, mod: int = 0, method: int = Method.GET) -> bytes:
        self._tid += 1
        mad = H.build(MgmtClass.DEV_MGT, method, attr, tid=self._tid, attr_mod=mod)
        out = self.raw(bytes(mad), addr)
        assert out[1] == MgmtClass.DEV_MGT and out[3] == Method.GET_RESP
        assert int.from_bytes(out[16:18], "big") == attr
        assert int.from_bytes(out[20:24], "big") == mod
        return out


def status(mad: bytes) -> int:
    return int.from_bytes(mad[4:6], "big")
