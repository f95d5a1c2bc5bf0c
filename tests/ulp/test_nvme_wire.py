"""NVMe/RDMA wire formats (ibal.ulp.nvme.wire): the bytes Linux's nvme-rdma and
nvmet-rdma put on the wire, field by field (include/linux/nvme.h, nvme-rdma.h)."""

from __future__ import annotations

import uuid

import pytest

from ibal.ulp.nvme import wire as w
from ibal.ulp.nvme.table import RSV, B, LeTable, U
from ibal.wire.fields import FieldError


def test_cm_req_private_data_is_linux_layout() -> None:
    # an I/O queue 1 of 32 entries: hrqsize 32, hsqsize 31 (0's based)
    b = w.CM_REQ.encode(recfmt=0, qid=1, hrqsize=32, hsqsize=31)
    assert len(b) == 32
    assert b[:10] == bytes.fromhex("0000 0100 2000 1f00 0000")
    assert b[10:] == bytes(22)
    assert w.CM_REP.decode(bytes.fromhex("0000 2000") + bytes(28))["crqsize"] == 32
    assert w.CM_REJ.decode(bytes.fromhex("0000 0300"))["sts"] == w.CmRejStatus.INVALID_QID


def test_keyed_sgl_descriptor_bytes() -> None:
    sgl = w.Sgl.keyed_addr(0x1122334455667788, 0x1000, 0xAABBCCDD)
    b = sgl.encode()
    assert b == bytes.fromhex("8877665544332211 001000 ddccbbaa 40")
    assert w.Sgl.decode(b) == sgl and sgl.keyed
    inv = w.Sgl.keyed_addr(1, 2, 3, invalidate=True).encode()
    assert inv[15] == 0x4F
    with pytest.raises(FieldError):
        w.Sgl.keyed_addr(0, 1 << 24, 1)


def test_in_capsule_data_descriptor() -> None:
    sgl = w.Sgl(w.SglType.DATA_OFFSET, 0, 4096)
    b = sgl.encode()
    assert b == bytes(8) + (4096).to_bytes(4, "little") + bytes(3) + b"\x01"
    assert w.Sgl.decode(b) == sgl and not sgl.keyed


def test_read_command_layout() -> None:
    sgl = w.Sgl.keyed_addr(0x1000, 8192, 0x55)
    cmd = w.rw_command(w.IoOpcode.READ, 7, 1, 0x1_0000_0002, 2, sgl)
    assert len(cmd) == 64
    assert cmd[0] == 0x02 and cmd[1] == 0x40  # opcode, PSDT = SGL
    assert cmd[2:4] == b"\x07\x00" and cmd[4:8] == b"\x01\x00\x00\x00"
    assert cmd[24:40] == sgl.encode()
    assert cmd[40:48] == (0x1_0000_0002).to_bytes(8, "little")  # SLBA in cdw10/11
    assert cmd[48:50] == b"\x01\x00"  # NLB, 0's based
    with pytest.raises(FieldError):
        w.rw_command(w.IoOpcode.READ, 1, 1, 0, 0, sgl)


def test_fabrics_connect_and_data() -> None:
    sgl = w.Sgl.keyed_addr(0x2000, 1024, 9)
    cmd = w.connect_command(3, 2, 127, 5000, sgl)
    assert (cmd[0], cmd[1], cmd[4]) == (0x7F, 0x40, w.FabricsType.CONNECT)
    assert cmd[24:40] == sgl.encode()
    assert cmd[40:42] == b"\0\0"  # record format 0
    assert cmd[42:44] == b"\x02\x00" and cmd[44:46] == b"\x7f\x00"
    assert cmd[48:52] == (5000).to_bytes(4, "little")
    host = uuid.UUID(int=0x0102)
    data = w.connect_data(host, 0xFFFF, "nqn.sub", "nqn.host")
    assert len(data) == 1024 and data[:16] == host.bytes and data[16:18] == b"\xff\xff"
    assert data[256:263] == b"nqn.sub" and data[263] == 0
    assert data[512:520] == b"nqn.host"


def test_property_commands() -> None:
    get_cap = w.property_get(1, w.Property.CAP)
    assert get_cap[4] == w.FabricsType.PROPERTY_GET and get_cap[40] == 1  # 8 bytes
    assert w.property_get(1, w.Property.CSTS)[44:48] == b"\x1c\0\0\0"
    put = w.property_set(2, w.Property.CC, 0x460001)
    assert put[4] == 0 and put[40] == 0 and put[44:48] == b"\x14\0\0\0"
    assert put[48:56] == (0x460001).to_bytes(8, "little")
    cap = w.cap_value(127)
    assert cap & 0xFFFF == 127 and cap >> 37 & 1 == 1 and cap >> 16 & 1 == 1


def test_completion_status_carries_the_phase_bit_shift() -> None:
    c = w.Completion(command_id=5, status=w.Sc.LBA_RANGE | w.DNR, sq_head=3, sq_id=1)
    b = c.encode()
    assert len(b) == 16
    assert b[12:14] == b"\x05\x00" and b[14:16] == ((0x4080 << 1) & 0xFFFF).to_bytes(2, "little")
    back = w.Completion.decode(b)
    assert back == c and not back.ok
    assert w.status_name(back.status) == "LBA_RANGE|DNR"
    assert w.Completion(1, 0, result=0x1234).encode()[:8] == (0x1234).to_bytes(8, "little")


def test_get_log_page_dwords() -> None:
    cmd = w.get_log_page(1, w.LogPage.DISCOVERY, 4096, w.NULL_SGL)
    cdw10 = int.from_bytes(cmd[40:44], "little")
    assert cdw10 & 0xFF == 0x70 and cdw10 >> 16 == 1023  # NUMDL, 0's based dwords


def test_identify_offsets() -> None:
    assert w.ID_CTRL.size == 4096 and w.ID_NS.size == 4096
    assert (w.ID_CTRL.offsets["cntlid"], w.ID_CTRL.offsets["kas"]) == (78, 320)
    assert (w.ID_CTRL.offsets["sqes"], w.ID_CTRL.offsets["maxcmd"]) == (512, 514)
    assert (w.ID_CTRL.offsets["nn"], w.ID_CTRL.offsets["sgls"]) == (516, 536)
    assert (w.ID_CTRL.offsets["subnqn"], w.ID_CTRL.offsets["ioccsz"]) == (768, 1792)
    assert w.ID_CTRL.offsets["cntrltype"] == 111
    assert w.ID_NS.offsets["nguid"] == 104 and w.ID_NS.offsets["lbaf0_ms"] == 128
    ns = w.ID_NS.encode(nsze=1024, ncap=1024, nuse=1024, lbaf0_lbads=12)
    assert ns[130] == 12 and w.ID_NS.decode(ns)["nsze"] == 1024


def test_discovery_log_round_trip() -> None:
    head = w.DISC_HEADER.encode(genctr=4, numrec=1, recfmt=0)
    entry = w.DISC_ENTRY.encode(trtype=1, adrfam=1, subtype=2, portid=1, cntlid=0xFFFF,
                                asqsz=32, trsvcid=b"4420", subnqn=b"nqn.x",
                                traddr=b"10.99.0.2")  # fmt: skip
    assert w.DISC_ENTRY.offsets["traddr"] == 512 and len(entry) == 1024
    gen, numrec, entries = w.parse_discovery_log(head + entry)
    assert (gen, numrec) == (4, 1)
    assert entries == [w.DiscoveryEntry("rdma", "ipv4", "nvme subsystem", 1, "4420", "nqn.x",
                                        "10.99.0.2")]  # fmt: skip
    # a header claiming more records than the page holds: only the whole ones
    _, numrec, entries = w.parse_discovery_log(w.DISC_HEADER.encode(numrec=3) + entry)
    assert numrec == 3 and len(entries) == 1


def test_le_table_checks() -> None:
    t = LeTable("t", [U("a", 2), U("b", 3), RSV(1), B("c", 4)])
    assert t.size == 10 and t.encode(a=1, b=0x030201, c=b"xy") == b"\x01\x00\x01\x02\x03\0xy\0\0"
    d = t.decode(t.encode(a=5))
    assert d["a"] == 5 and d["c"] == bytes(4)
    with pytest.raises(FieldError) as ei:
        t.encode(a=1 << 16)
    assert ei.value.reason == "range"
    with pytest.raises(FieldError):
        t.encode(z=1)
    with pytest.raises(FieldError):
        t.encode(c=b"12345")
    with pytest.raises(FieldError) as ei:
        t.decode(b"\0" * 9)
    assert ei.value.reason == "short"
    assert not t.reserved_clear(b"\0" * 5 + b"\x01" + b"\0" * 4)
