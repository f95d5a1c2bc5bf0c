"""SRP information units (ibal.ulp.srp.wire): the layouts of Linux's include/scsi/srp.h."""

from __future__ import annotations

from ibal.ulp.srp import wire as w


def test_sizes_are_the_standards() -> None:
    assert (w.LOGIN_REQ_RDMA.size, w.LOGIN_RSP.size, w.LOGIN_REJ.size) == (56, 52, 32)
    assert (w.CMD.size, w.RSP.size, w.TSK_MGMT.size) == (48, 36, 48)
    assert (w.DIRECT_BUF.size, w.INDIRECT_HDR.size) == (16, 20)


def test_login_request_fits_the_rdma_cm_private_data() -> None:
    b = w.LOGIN_REQ_RDMA.encode(tag=1, req_buf_fmt=w.BUF_FORMAT_DIRECT | w.BUF_FORMAT_INDIRECT,
                                opcode=w.Opcode.LOGIN_REQ, req_it_iu_len=4096,
                                initiator_port_id_hi=0x0123456789ABCDEF,
                                target_port_id_lo=0x5054)  # fmt: skip
    assert len(b) == 56  # what 92 - 36 bytes of REQ private data leave
    assert b[8:10] == b"\x00\x06" and b[11] == 0x00 and b[12:16] == b"\x00\x00\x10\x00"
    assert b[16:24] == bytes.fromhex("0123456789abcdef") and b[46:48] == b"\x50\x54"


def test_command_and_descriptors() -> None:
    iu = w.CMD.encode(opcode=w.Opcode.CMD, buf_fmt=w.DESC_DIRECT << 4, data_out_desc_cnt=1,
                      tag=7, lun=0, **w.cdb_fields(w.write10(0x01020304, 8)))  # fmt: skip
    assert iu[0] == 0x02 and iu[5] == 0x10 and iu[6] == 1 and iu[8:16] == (7).to_bytes(8, "big")
    assert iu[32:42] == bytes.fromhex("2a00010203040000 0800")
    d = w.DIRECT_BUF.encode(va=0x1000, key=0xAB, len=4096)
    assert d == bytes.fromhex("0000000000001000 000000ab 00001000")


def test_response_decodes() -> None:
    raw = bytes([0xC1, 0, 0, 0]) + (1).to_bytes(4, "big") + (9).to_bytes(8, "big") + \
        bytes([0, 0, w.RSP_FLAG_SNSVALID, w.CHECK_CONDITION]) + bytes(8) + \
        (18).to_bytes(4, "big") + bytes(4)  # fmt: skip
    d = w.RSP.decode(raw)
    assert (d["req_lim_delta"], d["tag"], d["status"], d["sense_data_len"]) == (1, 9, 2, 18)
