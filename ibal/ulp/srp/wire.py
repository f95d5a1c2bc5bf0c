"""SRP information units (T10 SRP, as Linux's ``include/scsi/srp.h`` lays them out), big
endian, as :mod:`ibal.wire.fields` tables; and the few SCSI CDBs the initiator sends.

Over the RDMA CM the login request travels in the REQ's private data in its short
form (``srp_login_req_rdma``: the 56 bytes the CMA header leaves), the login response
in the REP's and a login reject in the REJ's.
"""

from __future__ import annotations

import enum
import struct

from ibal.wire.fields import F, R, Table

__all__ = ["CMD", "DIRECT_BUF", "INDIRECT_HDR", "LOGIN_REJ", "LOGIN_REQ", "LOGIN_REQ_RDMA",
           "LOGIN_RSP", "RSP", "TSK_MGMT", "LoginRejReason", "Opcode", "read10",
           "target_port_id", "write10"]  # fmt: skip


class Opcode(enum.IntEnum):
    LOGIN_REQ = 0x00
    TSK_MGMT = 0x01
    CMD = 0x02
    I_LOGOUT = 0x03
    LOGIN_RSP = 0xC0
    RSP = 0xC1
    LOGIN_REJ = 0xC2
    T_LOGOUT = 0x80
    CRED_REQ = 0x81
    AER_REQ = 0x82


class LoginRejReason(enum.IntEnum):
    """SRP_LOGIN_REJ's reason."""

    NO_REASON = 0x00010000
    INSUFFICIENT_RESOURCES = 0x00010001
    REQ_IT_IU_LENGTH_TOO_LARGE = 0x00010002
    UNABLE_ASSOCIATE_CHANNEL = 0x00010003
    UNSUPPORTED_DESCRIPTOR_FMT = 0x00010004
    MULTI_CHANNEL_UNSUPPORTED = 0x00010005
    CHANNEL_LIMIT_REACHED = 0x00010006


BUF_FORMAT_DIRECT = 1 << 1  # the login's req_buf_fmt bits
BUF_FORMAT_INDIRECT = 1 << 2
DESC_DIRECT, DESC_INDIRECT = 1, 2  # a command's data-out / data-in descriptor formats
MULTICHAN_SINGLE = 0
RSP_FLAG_RSPVALID, RSP_FLAG_SNSVALID = 1 << 0, 1 << 1
RSP_FLAG_DOUNDER, RSP_FLAG_DIUNDER = 1 << 3, 1 << 5
TSK_ABORT_TASK, TSK_LUN_RESET = 0x01, 0x08

LOGIN_REQ_RDMA = Table("srp_login_req_rdma", [
    F("tag", 64, hex=True), F("req_buf_fmt", 16), F("req_flags", 8), F("opcode", 8),
    F("req_it_iu_len", 32), F("initiator_port_id_hi", 64, hex=True),
    F("initiator_port_id_lo", 64, hex=True),
    F("target_port_id_hi", 64, hex=True), F("target_port_id_lo", 64, hex=True),
    F("imm_data_offset", 16), R(48),
])  # fmt: skip
LOGIN_REQ = Table("srp_login_req", [
    F("opcode", 8), R(56), F("tag", 64, hex=True), F("req_it_iu_len", 32), R(32),
    F("req_buf_fmt", 16), F("req_flags", 8), R(8), F("imm_data_offset", 16), R(16),
    F("initiator_port_id_hi", 64, hex=True), F("initiator_port_id_lo", 64, hex=True),
    F("target_port_id_hi", 64, hex=True), F("target_port_id_lo", 64, hex=True),
])  # fmt: skip
"""The full 64-byte login request: what an IB CM REQ carries (its 92 bytes hold it)."""
LOGIN_RSP = Table("srp_login_rsp", [
    F("opcode", 8), R(24), F("req_lim_delta", 32), F("tag", 64, hex=True),
    F("max_it_iu_len", 32), F("max_ti_iu_len", 32), F("buf_fmt", 16), F("rsp_flags", 8),
    R(200),
])  # fmt: skip
LOGIN_REJ = Table("srp_login_rej", [
    F("opcode", 8), R(24), F("reason", 32, hex=True), F("tag", 64, hex=True), R(64),
    F("buf_fmt", 16), R(48),
])  # fmt: skip
CMD = Table("srp_cmd", [
    F("opcode", 8), F("sol_not", 8), R(24), F("buf_fmt", 8), F("data_out_desc_cnt", 8),
    F("data_in_desc_cnt", 8), F("tag", 64, hex=True), R(32), F("lun", 64, hex=True), R(8),
    F("task_attr", 8), R(8), F("add_cdb_len", 8), F("cdb_hi", 64, hex=True),
    F("cdb_lo", 64, hex=True),
])  # fmt: skip
"""48 bytes; the data descriptors follow (a direct one, or an indirect header and table)."""
DIRECT_BUF = Table("srp_direct_buf", [F("va", 64, hex=True), F("key", 32, hex=True),
                                      F("len", 32)])  # fmt: skip
INDIRECT_HDR = Table("srp_indirect_buf", [F("va", 64, hex=True), F("key", 32, hex=True),
                                          F("table_len", 32), F("len", 32)])  # fmt: skip
"""The table's own descriptor (where it lies, its length), then the total data length;
the table's direct descriptors follow in the IU."""
RSP = Table("srp_rsp", [
    F("opcode", 8), F("sol_not", 8), R(16), F("req_lim_delta", 32), F("tag", 64, hex=True),
    R(16), F("flags", 8), F("status", 8), F("data_out_res_cnt", 32), F("data_in_res_cnt", 32),
    F("sense_data_len", 32), F("resp_data_len", 32),
])  # fmt: skip
TSK_MGMT = Table("srp_tsk_mgmt", [
    F("opcode", 8), F("sol_not", 8), R(48), F("tag", 64, hex=True), R(32),
    F("lun", 64, hex=True), R(16), F("tsk_mgmt_func", 8), R(8), F("task_tag", 64, hex=True),
    R(64),
])  # fmt: skip

# SCSI
INQUIRY = bytes([0x12, 0, 0, 0, 36, 0])
READ_CAPACITY10 = bytes([0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0])
TEST_UNIT_READY = bytes(6)
GOOD, CHECK_CONDITION = 0x00, 0x02


def read10(lba: int, nblocks: int) -> bytes:
    return struct.pack(">BBIBHB", 0x28, 0, lba, 0, nblocks, 0)


def write10(lba: int, nblocks: int) -> bytes:
    return struct.pack(">BBIBHB", 0x2A, 0, lba, 0, nblocks, 0)


def cdb_fields(cdb: bytes) -> dict[str, int]:
    """``cdb_hi`` / ``cdb_lo`` of a CDB of up to 16 bytes."""
    raw = cdb.ljust(16, b"\0")
    return {"cdb_hi": int.from_bytes(raw[:8], "big"), "cdb_lo": int.from_bytes(raw[8:], "big")}


def target_port_id(service_name: str, ioc_guid: int) -> bytes:
    """The SRP target port identifier of an IOC's SRP service: the identifier extension
    its service entry names (``SRP.T10:<id_ext>``), then the IOC GUID."""
    prefix = "SRP.T10:"
    if not service_name.startswith(prefix):
        raise ValueError(f"{service_name!r} is not an SRP service entry")
    return int(service_name[len(prefix):], 16).to_bytes(8, "big") + ioc_guid.to_bytes(8, "big")
