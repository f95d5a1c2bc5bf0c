"""NVMe over Fabrics (RDMA transport) wire formats: tables, constants and codecs.

The facts come from the NVMe base, Fabrics and RDMA transport specifications as
Linux implements them (``include/linux/nvme.h``, ``include/linux/nvme-rdma.h``,
``drivers/nvme/host/rdma.c``, ``drivers/nvme/target/rdma.c``):

* the RDMA CM private data of a queue's connect (REQ, REP, REJ: record format 0,
  queue id, host receive and send queue sizes, the controller's receive queue size);
* the 64-byte command capsule (submission queue entry) whose data pointer is one
  SGL descriptor: keyed (address, 24-bit length, remote key; subtype 0 address, 0xF
  invalidate the key) or, for in-capsule data, an unkeyed data block at an offset;
* the 16-byte response capsule (completion queue entry, status shifted by the phase bit);
* the Fabrics commands (Connect with its 1024-byte data, Property Get/Set),
  Identify (controller, namespace, active namespace list, namespace descriptors),
  Get Log Page and the discovery log page, Get/Set Features, Keep Alive, and the NVM
  READ/WRITE/FLUSH.

Everything here is sans-IO: bytes in, values out, and back.
"""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass

from ibal.ulp.nvme.table import RSV, B, LeTable, U, Value
from ibal.wire.fields import FieldError

__all__ = [
    "CM_REJ", "CM_REP", "CM_REQ", "CONNECT_DATA", "CQE", "DATA_SGL", "DISCOVERY_NQN",
    "DISC_ENTRY", "DISC_HEADER", "ID_CTRL", "ID_NS", "KEYED_SGL", "SQE", "AdminOpcode",
    "CmRejStatus", "Completion", "FabricsType", "IoOpcode", "Property", "Sc", "Sgl",
    "SglType", "Value",
]  # fmt: skip

DISCOVERY_NQN = "nqn.2014-08.org.nvmexpress.discovery"
NVMF_PORT = 4420  # the IANA port for NVMe over Fabrics
AQ_DEPTH = 32  # NVME_AQ_DEPTH: the admin queue Linux's host asks for
SQE_SIZE, CQE_SIZE = 64, 16
MAX_KEYED_LEN = (1 << 24) - 1  # a keyed SGL's length is 3 bytes


# ------------------------------------------------------------ RDMA CM private data

CM_REQ = LeTable("nvme_rdma_cm_req", [U("recfmt", 2), U("qid", 2), U("hrqsize", 2),
                                      U("hsqsize", 2), U("cntlid", 2), RSV(22)])  # fmt: skip
"""The host's REQ private data: ``hsqsize`` is 0's based (the queue's size - 1),
``hrqsize`` is not (Linux sends the queue size)."""
CM_REP = LeTable("nvme_rdma_cm_rep", [U("recfmt", 2), U("crqsize", 2), RSV(28)])
CM_REJ = LeTable("nvme_rdma_cm_rej", [U("recfmt", 2), U("sts", 2)])


class CmRejStatus(enum.IntEnum):
    """``nvme_rdma_cm_status``: why a target refused a queue's connect."""

    INVALID_LEN = 0x01
    INVALID_RECFMT = 0x02
    INVALID_QID = 0x03
    INVALID_HSQSIZE = 0x04
    INVALID_HRQSIZE = 0x05
    NO_RSC = 0x06
    INVALID_IRD = 0x07
    INVALID_ORD = 0x08


# ------------------------------------------------------------ capsules

SQE = LeTable("nvme_command", [
    U("opcode", 1), U("flags", 1), U("command_id", 2), U("nsid", 4), U("cdw2", 4),
    U("cdw3", 4), U("metadata", 8), B("dptr", 16), U("cdw10", 4), U("cdw11", 4),
    U("cdw12", 4), U("cdw13", 4), U("cdw14", 4), U("cdw15", 4),
])  # fmt: skip
"""A submission queue entry; ``flags`` bits 7:6 (PSDT) are 01b for SGLs (``0x40``)."""
PSDT_SGL = 0x40  # NVME_CMD_SGL_METABUF: what Linux's fabrics hosts set

CQE = LeTable("nvme_completion", [U("result", 8), U("sq_head", 2), U("sq_id", 2),
                                  U("command_id", 2), U("status", 2)])  # fmt: skip

KEYED_SGL = LeTable("nvme_keyed_sgl_desc", [U("addr", 8), U("length", 3), U("key", 4),
                                            U("type", 1)])  # fmt: skip
DATA_SGL = LeTable("nvme_sgl_desc", [U("addr", 8), U("length", 4), RSV(3), U("type", 1)])


class SglType(enum.IntEnum):
    """The descriptor's last byte: type in the high nibble, subtype in the low."""

    DATA_OFFSET = 0x01  # data block, in-capsule at an offset (NVME_SGL_FMT_OFFSET)
    KEYED_ADDRESS = 0x40  # keyed data block, remote address (NVME_KEY_SGL_FMT_DATA_DESC << 4)
    KEYED_INVALIDATE = 0x4F  # the same, and the target invalidates the key when done


@dataclass(frozen=True)
class Sgl:
    """One SGL descriptor as a command carries it."""

    type: int
    addr: int
    length: int
    key: int = 0

    @property
    def keyed(self) -> bool:
        return self.type >> 4 == 0x4

    def encode(self) -> bytes:
        if self.keyed:
            return KEYED_SGL.encode(addr=self.addr, length=self.length, key=self.key,
                                    type=self.type)  # fmt: skip
        return DATA_SGL.encode(addr=self.addr, length=self.length, type=self.type)

    @classmethod
    def decode(cls, b: bytes) -> Sgl:
        t = b[15]
        if t >> 4 == 0x4:
            d = KEYED_SGL.decode(b)
            return cls(t, int(d["addr"]), int(d["length"]), int(d["key"]))
        d = DATA_SGL.decode(b)
        return cls(t, int(d["addr"]), int(d["length"]))

    @classmethod
    def keyed_addr(cls, addr: int, length: int, key: int, *, invalidate: bool = False) -> Sgl:
        if not 0 <= length <= MAX_KEYED_LEN:
            raise FieldError("range", f"a keyed SGL carries at most {MAX_KEYED_LEN} bytes")
        t = SglType.KEYED_INVALIDATE if invalidate else SglType.KEYED_ADDRESS
        return cls(t, addr, length, key)


NULL_SGL = Sgl(SglType.KEYED_ADDRESS, 0, 0, 0)


class AdminOpcode(enum.IntEnum):
    GET_LOG_PAGE = 0x02
    IDENTIFY = 0x06
    ABORT = 0x08
    SET_FEATURES = 0x09
    GET_FEATURES = 0x0A
    ASYNC_EVENT = 0x0C
    KEEP_ALIVE = 0x18
    FABRICS = 0x7F


class IoOpcode(enum.IntEnum):
    FLUSH = 0x00
    WRITE = 0x01
    READ = 0x02


class FabricsType(enum.IntEnum):
    PROPERTY_SET = 0x00
    CONNECT = 0x01
    PROPERTY_GET = 0x04


class Cns(enum.IntEnum):
    """Identify's CNS (cdw10 bits 7:0)."""

    NAMESPACE = 0x00
    CONTROLLER = 0x01
    ACTIVE_NS_LIST = 0x02
    NS_DESC_LIST = 0x03
    CS_CONTROLLER = 0x06  # I/O command set specific (CSI in cdw11 bits 31:24)


class Feature(enum.IntEnum):
    NUM_QUEUES = 0x07
    ASYNC_EVENT = 0x0B
    KATO = 0x0F


class LogPage(enum.IntEnum):
    ERROR = 0x01
    SMART = 0x02
    DISCOVERY = 0x70


FABRICS_HEAD = [U("opcode", 1), U("flags", 1), U("command_id", 2), U("fctype", 1), RSV(19),
                B("dptr", 16)]  # fmt: skip
CONNECT_CMD = LeTable("nvmf_connect_command", [*FABRICS_HEAD, U("recfmt", 2), U("qid", 2),
                                               U("sqsize", 2), U("cattr", 1), RSV(1),
                                               U("kato", 4), RSV(12)])  # fmt: skip
"""``sqsize`` is 0's based; ``kato`` in milliseconds (0: no keep alive)."""
PROPERTY_SET_CMD = LeTable("nvmf_property_set_command", [
    *FABRICS_HEAD, U("attrib", 1), RSV(3), U("offset", 4), U("value", 8), RSV(8)])
PROPERTY_GET_CMD = LeTable("nvmf_property_get_command", [
    *FABRICS_HEAD, U("attrib", 1), RSV(3), U("offset", 4), RSV(16)])
CONNECT_DATA = LeTable("nvmf_connect_data", [B("hostid", 16), U("cntlid", 2), RSV(238),
                                             B("subsysnqn", 256), B("hostnqn", 256),
                                             RSV(256)])  # fmt: skip
CNTLID_DYNAMIC = 0xFFFF  # an admin queue's Connect asks for any controller


class Property(enum.IntEnum):
    """Controller properties (the PCIe registers), by offset; CAP is 8 bytes."""

    CAP = 0x00
    VS = 0x08
    CC = 0x14
    CSTS = 0x1C


CC_EN = 1
CC_SHN_MASK = 3 << 14
CSTS_RDY = 1
CSTS_SHST_CMPLT = 2 << 2


def cap_value(mqes: int, timeout_500ms: int = 30) -> int:
    """CAP: MQES (0's based), contiguous queues required, the ready timeout, the NVM
    command set, 4 KiB pages."""
    return (mqes & 0xFFFF) | 1 << 16 | (timeout_500ms & 0xFF) << 24 | 1 << 37


# ------------------------------------------------------------ status


class Sc(enum.IntEnum):
    """Status codes as Linux spells them: status code type in bits 10:8 (0 generic,
    1 command specific, 2 media), code in 7:0; :data:`DNR` is ORed in."""

    SUCCESS = 0x00
    INVALID_OPCODE = 0x01
    INVALID_FIELD = 0x02
    CMDID_CONFLICT = 0x03
    DATA_XFER_ERROR = 0x04
    INTERNAL = 0x06
    ABORT_REQ = 0x07
    ABORT_QUEUE = 0x08
    INVALID_NS = 0x0B
    CMD_SEQ_ERROR = 0x0C
    SGL_INVALID_LAST = 0x0D
    SGL_INVALID_COUNT = 0x0E
    SGL_INVALID_DATA = 0x0F
    SGL_INVALID_METADATA = 0x10
    SGL_INVALID_TYPE = 0x11
    SGL_INVALID_OFFSET = 0x16
    SGL_INVALID_SUBTYPE = 0x17
    LBA_RANGE = 0x80
    CAP_EXCEEDED = 0x81
    QID_INVALID = 0x101
    QUEUE_SIZE = 0x102
    INVALID_LOG_PAGE = 0x109
    CONNECT_FORMAT = 0x180
    CONNECT_CTRL_BUSY = 0x181
    CONNECT_INVALID_PARAM = 0x182
    CONNECT_RESTART_DISC = 0x183
    CONNECT_INVALID_HOST = 0x184
    ACCESS_DENIED = 0x286


DNR = 0x4000


def status_name(status: int) -> str:
    """``LBA_RANGE|DNR``-style text for a status (without the phase bit)."""
    code = status & 0x7FF
    try:
        name = Sc(code).name
    except ValueError:
        name = f"{code:#x}"
    return name + ("|DNR" if status & DNR else "")


@dataclass(frozen=True)
class Completion:
    """A decoded response capsule; ``status`` without the phase bit (Linux's view)."""

    command_id: int
    status: int
    result: int = 0
    sq_head: int = 0
    sq_id: int = 0

    def encode(self) -> bytes:
        return CQE.encode(result=self.result, sq_head=self.sq_head, sq_id=self.sq_id,
                          command_id=self.command_id, status=(self.status << 1) & 0xFFFF)

    @classmethod
    def decode(cls, b: bytes) -> Completion:
        d = CQE.decode(b)
        return cls(int(d["command_id"]), int(d["status"]) >> 1, int(d["result"]),
                   int(d["sq_head"]), int(d["sq_id"]))  # fmt: skip

    @property
    def ok(self) -> bool:
        return self.status & 0x7FF == 0


# ------------------------------------------------------------ command builders


def command(opcode: int, command_id: int, *, nsid: int = 0, sgl: Sgl = NULL_SGL,
            cdw10: int = 0, cdw11: int = 0, cdw12: int = 0, cdw13: int = 0,
            cdw14: int = 0, cdw15: int = 0) -> bytes:  # fmt: skip
    """A 64-byte admin or I/O command with one SGL descriptor."""
    return SQE.encode(opcode=opcode, flags=PSDT_SGL, command_id=command_id, nsid=nsid,
                      dptr=sgl.encode(), cdw10=cdw10, cdw11=cdw11, cdw12=cdw12, cdw13=cdw13,
                      cdw14=cdw14, cdw15=cdw15)  # fmt: skip


def rw_command(opcode: IoOpcode, command_id: int, nsid: int, slba: int, nblocks: int,
               sgl: Sgl) -> bytes:  # fmt: skip
    """READ or WRITE of ``nblocks`` (1..65536) from ``slba``."""
    if not 1 <= nblocks <= 0x10000:
        raise FieldError("range", f"a READ/WRITE moves 1..65536 blocks, not {nblocks}")
    return command(opcode, command_id, nsid=nsid, sgl=sgl, cdw10=slba & 0xFFFFFFFF,
                   cdw11=slba >> 32, cdw12=nblocks - 1)  # fmt: skip


def connect_command(command_id: int, qid: int, sqsize: int, kato_ms: int, sgl: Sgl) -> bytes:
    return CONNECT_CMD.encode(opcode=AdminOpcode.FABRICS, flags=PSDT_SGL, command_id=command_id,
                              fctype=FabricsType.CONNECT, dptr=sgl.encode(), recfmt=0, qid=qid,
                              sqsize=sqsize, kato=kato_ms)  # fmt: skip


def connect_data(hostid: uuid.UUID, cntlid: int, subsysnqn: str, hostnqn: str) -> bytes:
    return CONNECT_DATA.encode(hostid=hostid.bytes, cntlid=cntlid,
                               subsysnqn=subsysnqn.encode(), hostnqn=hostnqn.encode())


def property_get(command_id: int, offset: Property) -> bytes:
    attrib = 1 if offset is Property.CAP else 0  # 1: an 8-byte property
    return PROPERTY_GET_CMD.encode(opcode=AdminOpcode.FABRICS, flags=PSDT_SGL,
                                   command_id=command_id, fctype=FabricsType.PROPERTY_GET,
                                   attrib=attrib, offset=offset,
                                   dptr=NULL_SGL.encode())  # fmt: skip


def property_set(command_id: int, offset: Property, value: int) -> bytes:
    return PROPERTY_SET_CMD.encode(opcode=AdminOpcode.FABRICS, flags=PSDT_SGL,
                                   command_id=command_id, fctype=FabricsType.PROPERTY_SET,
                                   attrib=0, offset=offset,
                                   value=value, dptr=NULL_SGL.encode())  # fmt: skip


def get_log_page(command_id: int, lid: int, nbytes: int, sgl: Sgl, offset: int = 0) -> bytes:
    numd = nbytes // 4 - 1  # 0's based dwords
    return command(AdminOpcode.GET_LOG_PAGE, command_id, sgl=sgl,
                   cdw10=lid | (numd & 0xFFFF) << 16, cdw11=numd >> 16,
                   cdw12=offset & 0xFFFFFFFF, cdw13=offset >> 32)  # fmt: skip


def nstr(b: bytes | int) -> str:
    """A space- or NUL-padded ASCII field as text."""
    assert isinstance(b, bytes)
    return b.split(b"\0", 1)[0].decode("ascii", "replace").rstrip()


# ------------------------------------------------------------ Identify, log pages

ID_CTRL = LeTable("nvme_id_ctrl", [
    U("vid", 2), U("ssvid", 2), B("sn", 20), B("mn", 40), B("fr", 8), U("rab", 1),
    B("ieee", 3), U("cmic", 1), U("mdts", 1), U("cntlid", 2), U("ver", 4), U("rtd3r", 4),
    U("rtd3e", 4), U("oaes", 4), U("ctratt", 4), RSV(11), U("cntrltype", 1), B("fguid", 16),
    RSV(128), U("oacs", 2), U("acl", 1), U("aerl", 1), U("frmw", 1), U("lpa", 1),
    U("elpe", 1), U("npss", 1), U("avscc", 1), U("apsta", 1), U("wctemp", 2), U("cctemp", 2),
    RSV(50), U("kas", 2), RSV(190), U("sqes", 1), U("cqes", 1), U("maxcmd", 2), U("nn", 4),
    U("oncs", 2), U("fuses", 2), U("fna", 1), U("vwc", 1), U("awun", 2), U("awupf", 2),
    U("nvscc", 1), U("nwpc", 1), U("acwu", 2), RSV(2), U("sgls", 4), U("mnan", 4), RSV(224),
    B("subnqn", 256), RSV(768), U("ioccsz", 4), U("iorcsz", 4), U("icdoff", 2), U("fcatt", 1),
    U("msdbd", 1), U("ofcs", 2),
], size=4096)  # fmt: skip
SGLS_SUPPORTED = 1  # bits 1:0: SGLs, no alignment needed
SGLS_KEYED = 1 << 2
SGLS_OFFSET = 1 << 20  # the data block's address is an offset into the capsule

ID_NS = LeTable("nvme_id_ns", [
    U("nsze", 8), U("ncap", 8), U("nuse", 8), U("nsfeat", 1), U("nlbaf", 1), U("flbas", 1),
    U("mc", 1), U("dpc", 1), U("dps", 1), U("nmic", 1), U("rescap", 1), U("fpi", 1),
    U("dlfeat", 1), U("nawun", 2), U("nawupf", 2), U("nacwu", 2), U("nabsn", 2), U("nabo", 2),
    U("nabspf", 2), U("noiob", 2), B("nvmcap", 16), RSV(40), B("nguid", 16), B("eui64", 8),
    U("lbaf0_ms", 2), U("lbaf0_lbads", 1), U("lbaf0_rp", 1),
], size=4096)  # fmt: skip
"""Only LBA format 0 is described: ``lbaf0_lbads`` is log2 of the block size."""

NS_DESC = LeTable("nvme_ns_id_desc", [U("nidt", 1), U("nidl", 1), RSV(2)])
NIDT_UUID = 3

DISC_HEADER = LeTable("nvmf_disc_rsp_page_hdr", [U("genctr", 8), U("numrec", 8),
                                                 U("recfmt", 2), RSV(1006)])  # fmt: skip
DISC_ENTRY = LeTable("nvmf_disc_rsp_page_entry", [
    U("trtype", 1), U("adrfam", 1), U("subtype", 1), U("treq", 1), U("portid", 2),
    U("cntlid", 2), U("asqsz", 2), U("eflags", 2), RSV(20), B("trsvcid", 32), RSV(192),
    B("subnqn", 256), B("traddr", 256), U("rdma_qptype", 1), U("rdma_prtype", 1),
    U("rdma_cms", 1), RSV(5), U("rdma_pkey", 2), RSV(246),
])  # fmt: skip
TRTYPE = {1: "rdma", 2: "fc", 3: "tcp", 254: "loop"}
ADRFAM = {1: "ipv4", 2: "ipv6", 3: "ib", 4: "fc"}
SUBTYPE = {1: "referral", 2: "nvme subsystem", 3: "current discovery subsystem"}


@dataclass(frozen=True)
class DiscoveryEntry:
    """One record of the discovery log page."""

    trtype: str
    adrfam: str
    subtype: str
    portid: int
    trsvcid: str
    subnqn: str
    traddr: str

    @classmethod
    def decode(cls, b: bytes, off: int = 0) -> DiscoveryEntry:
        d = DISC_ENTRY.decode(b, off)
        return cls(TRTYPE.get(int(d["trtype"]), str(d["trtype"])),
                   ADRFAM.get(int(d["adrfam"]), str(d["adrfam"])),
                   SUBTYPE.get(int(d["subtype"]), str(d["subtype"])), int(d["portid"]),
                   nstr(d["trsvcid"]), nstr(d["subnqn"]), nstr(d["traddr"]))  # fmt: skip


def parse_discovery_log(b: bytes) -> tuple[int, int, list[DiscoveryEntry]]:
    """(generation counter, number of records, the records ``b`` holds in full)."""
    h = DISC_HEADER.decode(b)
    numrec = int(h["numrec"])
    have = max(0, (len(b) - DISC_HEADER.size) // DISC_ENTRY.size)
    entries = [DiscoveryEntry.decode(b, DISC_HEADER.size + i * DISC_ENTRY.size)
               for i in range(min(numrec, have))]  # fmt: skip
    return int(h["genctr"]), numrec, entries
