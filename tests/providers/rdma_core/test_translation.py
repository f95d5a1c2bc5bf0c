"""Work request and completion translation, with fakes standing in for pyverbs and libibverbs.

Both data paths are covered: the pyverbs one (``wr.SendQueue`` / ``RecvQueue``
over pooled pyverbs objects) and the ctypes one (``fastpath``), whose
``ibv_send_wr``/``ibv_recv_wr`` chains are read back from memory here exactly
as a provider library would walk them.
"""

from __future__ import annotations

import ctypes
import errno
import struct
from typing import Any

import pytest

from ibal.providers.rdma_core import abi
from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core.fastpath import (
    WC_SIZE,
    FastPoller,
    FastRecvQueue,
    FastSendQueue,
)
from ibal.providers.rdma_core.wr import (
    POOL_MAX,
    SEND_WC_CACHE_MAX,
    PyverbsApi,
    RecvQueue,
    RecvTokens,
    SendQueue,
    build_send_table,
    convert_wcs,
    flush_tuples,
    imm_from_verbs,
    imm_to_verbs,
)
from ibal.status import (
    InsufficientResources,
    InvalidAvHandle,
    InvalidMaxSge,
    InvalidMwHandle,
    InvalidParameter,
    InvalidWrType,
    PostError,
    Status,
    Unsupported,
)
from ibal.types import (
    BASE_WR_TYPES,
    INVALIDATE_WR_TYPES,
    AccessFlags,
    BindWr,
    QpType,
    RecvOpt,
    RecvWr,
    SendOpt,
    SendWr,
    Sge,
    UdDest,
    WcStatus,
    WcType,
    WrType,
)

SIG = SendOpt.SIGNALED
INV_RC = BASE_WR_TYPES | INVALIDATE_WR_TYPES

# ------------------------------------------------------------------ fakes


class FakeRdmaError(Exception):
    def __init__(self, msg: str, error_code: int) -> None:
        super().__init__(f"{msg}. Errno: {error_code}")
        self.error_code = error_code


class FakeSGE:
    def __init__(self, addr: int, length: int, lkey: int) -> None:
        if addr < 0 or length < 0 or lkey < 0:
            raise OverflowError("can't convert negative value to unsigned int")
        self.addr, self.length, self.lkey = addr, length, lkey
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeSendWR:
    """Records what pyverbs' SendWR would hold in its ibv_send_wr."""

    def __init__(self, wr_id: int = 0, opcode: int = 2, num_sge: int = 0, imm_data: int = 0,
                 sg: list[FakeSGE] | None = None, send_flags: int = 2) -> None:  # fmt: skip
        if opcode not in (7, 8, 9) and (num_sge < 1 or sg is None):
            raise ValueError("A WR needs at least one SGE")
        self.wr_id, self.opcode, self.num_sge = wr_id, opcode, num_sge
        self.imm_data, self.send_flags = imm_data, send_flags
        self.copies = [(s.addr, s.length, s.lkey) for s in (sg or [])]
        self.sg_ref: FakeSGE | None = None
        self.next: FakeSendWR | None = None
        self.wr: dict[str, Any] = {}
        self.closed = False

    @property
    def next_wr(self) -> FakeSendWR | None:
        return self.next

    @next_wr.setter
    def next_wr(self, val: FakeSendWR) -> None:
        self.next = val

    @property
    def sg_list(self) -> None:  # pragma: no cover - write-only in pyverbs
        raise AttributeError

    @sg_list.setter
    def sg_list(self, sge: FakeSGE) -> None:
        self.sg_ref = sge

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        self.wr = {"kind": "rdma", "rkey": rkey, "remote_addr": addr}

    def set_wr_atomic(self, rkey: int, addr: int, compare_add: int, swap: int = 0) -> None:
        self.wr = {"kind": "atomic", "rkey": rkey, "remote_addr": addr,
                   "compare_add": compare_add, "swap": swap}  # fmt: skip

    def set_wr_ud(self, ah: Any, rqpn: int, rqkey: int) -> None:
        self.wr = {"kind": "ud", "ah": ah, "qpn": rqpn, "qkey": rqkey}

    def set_bind_wr(self, mw: tuple[str, int], info: Any) -> None:
        # pyverbs 44 binds to ibv_inc_rkey of the window's current key
        self.wr = {"kind": "bind", "mw": mw[0], "info": info, "rkey": (mw[1] & ~0xFF) | 0x01}

    @property
    def rkey(self) -> int:
        return int(self.wr["rkey"])

    def sges(self) -> list[tuple[int, int, int]]:
        if self.sg_ref is not None:
            s = self.sg_ref
            return [(s.addr, s.length, s.lkey)][: self.num_sge]
        return self.copies[: self.num_sge]

    @property
    def wr_id(self) -> int:
        return self._wr_id

    @wr_id.setter
    def wr_id(self, val: int) -> None:
        if not 0 <= val < 1 << 64:  # a Cython uint64_t field
            raise OverflowError("value out of range for uint64_t")
        self._wr_id = val

    def close(self) -> None:
        self.closed = True


class FakeRecvWR:
    def __init__(self, wr_id: int = 0, num_sge: int = 0, sg: list[FakeSGE] | None = None) -> None:
        if num_sge < 1 or sg is None:
            raise ValueError("A WR needs at least one SGE")
        self.wr_id, self.num_sge = wr_id, num_sge
        self.copies = [(s.addr, s.length, s.lkey) for s in sg]
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeQp:
    """Walks posted chains like a provider; can refuse the n-th work request."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.recvd: list[tuple[int, list[tuple[int, int, int]]]] = []
        self.refuse_at: int | None = None  # index in the posted stream
        self.refuse_errno = errno.ENOMEM
        self.calls = 0

    def post_send(self, head: FakeSendWR, bad: FakeSendWR) -> None:
        self.calls += 1
        w: FakeSendWR | None = head
        while w is not None:
            if self.refuse_at is not None and len(self.sent) == self.refuse_at:
                bad.wr_id, bad.opcode, bad.imm_data = w.wr_id, w.opcode, w.imm_data
                raise FakeRdmaError("Failed to post send", self.refuse_errno)
            self.sent.append({"wr_id": w.wr_id, "opcode": w.opcode, "flags": w.send_flags,
                              "imm": w.imm_data, "sges": w.sges(), **w.wr})  # fmt: skip
            w = w.next

    def post_recv(self, rw: FakeRecvWR) -> None:
        if self.refuse_at is not None and len(self.recvd) == self.refuse_at:
            raise FakeRdmaError("Failed to post recv", self.refuse_errno)
        self.recvd.append((rw.wr_id, rw.copies[: rw.num_sge]))


API = PyverbsApi(FakeSendWR, FakeSGE, FakeRecvWR, FakeRdmaError)


class Owner:
    def __init__(self) -> None:
        self.rtok: set[int] = set()


def send_queue(qp: FakeQp, qp_type: QpType = QpType.RC, **kw: Any) -> SendQueue:
    opts: dict[str, Any] = {"max_sge": 4, "max_inline": 64, "depth": 16, "atomics": True,
                            "ah_of": lambda av: av if isinstance(av, str) else None}  # fmt: skip
    opts.update(kw)
    return SendQueue(API, qp.post_send, qp_type, **opts)


def write(i: int, **kw: Any) -> SendWr:
    opts: dict[str, Any] = {"wr_id": i, "opcode": WrType.RDMA_WRITE,
                            "sg_list": [Sge(0x1000 + i, 8, 7)], "remote_addr": 0x9000 + 8 * i,
                            "rkey": 0x55}  # fmt: skip
    opts.update(kw)
    return SendWr(**opts)


# ----------------------------------------------------------- the send table


def test_send_table_per_qp_type() -> None:
    def entry(qp_type: QpType, op: WrType, opt: SendOpt, atomics: bool = True) -> Any:
        return build_send_table(qp_type, atomics)[op * 64 + opt]

    assert entry(QpType.RC, WrType.RDMA_WRITE, SIG)[:2] == (
        C.IBV_WR_RDMA_WRITE,
        C.IBV_SEND_SIGNALED,
    )
    assert entry(QpType.RC, WrType.RDMA_WRITE, SIG | SendOpt.IMMEDIATE)[0] == (
        C.IBV_WR_RDMA_WRITE_WITH_IMM
    )
    assert entry(QpType.RC, WrType.SEND, SendOpt.IMMEDIATE)[:2] == (C.IBV_WR_SEND_WITH_IMM, 0)
    flags = entry(QpType.RC, WrType.SEND, SIG | SendOpt.FENCE | SendOpt.SOLICITED | SendOpt.INLINE)[
        1
    ]
    assert flags == (C.IBV_SEND_SIGNALED | C.IBV_SEND_FENCE | C.IBV_SEND_SOLICITED
                     | C.IBV_SEND_INLINE)  # fmt: skip
    assert entry(QpType.RC, WrType.COMPARE_SWAP, SIG)[0] == C.IBV_WR_ATOMIC_CMP_AND_SWP
    assert entry(QpType.RC, WrType.FETCH_ADD, SIG)[0] == C.IBV_WR_ATOMIC_FETCH_AND_ADD
    assert entry(QpType.RC, WrType.FETCH_ADD, SIG, atomics=False) is Unsupported
    assert entry(QpType.RC, WrType.RDMA_READ, SendOpt.IMMEDIATE) is InvalidWrType
    assert entry(QpType.RC, WrType.RDMA_READ, SendOpt.INLINE) is InvalidParameter
    assert entry(QpType.RC, WrType.SEND, SendOpt.LOCAL) is InvalidParameter
    assert entry(QpType.UC, WrType.RDMA_READ, SIG) is InvalidWrType
    assert entry(QpType.UC, WrType.FETCH_ADD, SIG) is InvalidWrType
    assert entry(QpType.UD, WrType.RDMA_WRITE, SIG) is InvalidWrType
    assert entry(QpType.UD, WrType.SEND, SIG)[0] == C.IBV_WR_SEND
    # indexed by value (WrType has gaps); invalidate/bind requests only where listed
    codes = {WrType.LOCAL_INV: C.IBV_WR_LOCAL_INV, WrType.BIND_MW: C.IBV_WR_BIND_MW,
             WrType.SEND_WITH_INV: C.IBV_WR_SEND_WITH_INV}  # fmt: skip
    for op, code in codes.items():
        assert entry(QpType.RC, op, SIG) is InvalidWrType
        table = build_send_table(QpType.RC, True, frozenset({op}))
        assert table[op * 64 + SIG][:2] == (code, C.IBV_SEND_SIGNALED)
        assert table[op * 64 + (SIG | SendOpt.IMMEDIATE)] is InvalidWrType
        inline = table[op * 64 + (SIG | SendOpt.INLINE)]
        assert (inline is InvalidParameter) is (op is not WrType.SEND_WITH_INV)
    assert build_send_table(QpType.RC, True)[5 * 64 + SIG] is InvalidWrType  # no opcode 5


def test_immediate_goes_big_endian_on_the_wire() -> None:
    # verbs keeps imm_data in network order: the int a little-endian host stores
    # must have the wire bytes 01 02 03 04 in memory.
    v = imm_to_verbs(0x01020304)
    assert struct.pack("=I", v) == bytes([1, 2, 3, 4])
    assert imm_from_verbs(v) == 0x01020304
    with pytest.raises(OverflowError):
        imm_to_verbs(1 << 32)


# ------------------------------------------------------- pyverbs send path


def test_batch_is_one_chained_post_with_every_field() -> None:
    qp = FakeQp()
    sq = send_queue(qp)
    sq.post([write(i) for i in range(5)])
    assert qp.calls == 1
    assert [s["wr_id"] for s in qp.sent] == [0, 1, 2, 3, 4]
    s = qp.sent[3]
    assert s["opcode"] == C.IBV_WR_RDMA_WRITE and s["flags"] == C.IBV_SEND_SIGNALED
    assert (s["rkey"], s["remote_addr"], s["sges"]) == (0x55, 0x9018, [(0x1003, 8, 7)])


def test_more_than_a_pool_posts_in_chunks_in_order() -> None:
    qp = FakeQp()
    sq = send_queue(qp, depth=1000)
    n = POOL_MAX * 2 + 5
    sq.post([write(i) for i in range(n)])
    assert [s["wr_id"] for s in qp.sent] == list(range(n))
    assert qp.calls == 3
    sq.post([write(7)])  # a short batch after a long one ends its chain correctly
    assert [s["wr_id"] for s in qp.sent][-1] == 7 and len(qp.sent) == n + 1


def test_atomic_ud_send_imm_and_multi_sge() -> None:
    qp = FakeQp()
    sq = send_queue(qp)
    sq.post([
        SendWr(1, WrType.COMPARE_SWAP, [Sge(0x2000, 8, 3)], SIG, remote_addr=0x8008, rkey=9,
               compare_add=5, swap=6),
        SendWr(2, WrType.SEND, [Sge(0x10, 4, 1), Sge(0x20, 4, 1)], SIG | SendOpt.IMMEDIATE,
               imm=0xA0B0C0D0),
        SendWr(3, WrType.SEND, [], SIG),
    ])  # fmt: skip
    a, b, c = qp.sent
    assert (a["kind"], a["compare_add"], a["swap"], a["remote_addr"]) == ("atomic", 5, 6, 0x8008)
    assert b["opcode"] == C.IBV_WR_SEND_WITH_IMM and imm_from_verbs(b["imm"]) == 0xA0B0C0D0
    assert b["sges"] == [(0x10, 4, 1), (0x20, 4, 1)]
    assert c["sges"] == [] and c["opcode"] == C.IBV_WR_SEND
    uq = FakeQp()
    send_queue(uq, QpType.UD).post([SendWr(4, WrType.SEND, [Sge(1, 2, 3)], SIG,
                                           ud=UdDest("AH", 0x123, 0x11111111))])  # fmt: skip
    assert uq.sent[0]["kind"] == "ud"
    assert (uq.sent[0]["ah"], uq.sent[0]["qpn"], uq.sent[0]["qkey"]) == ("AH", 0x123, 0x11111111)


@pytest.mark.parametrize(
    ("bad", "cls"),
    [
        (SendWr(9, WrType.RDMA_READ, [Sge(1, 8, 1)], SIG | SendOpt.IMMEDIATE), InvalidWrType),
        (write(9, sg_list=[Sge(1, 1, 1)] * 5), InvalidMaxSge),
        (write(9, send_opt=SIG | SendOpt.INLINE, sg_list=[Sge(1, 65, 1)]), InvalidParameter),
        (SendWr(9, WrType.FETCH_ADD, [Sge(1, 8, 1)], SIG, remote_addr=0x1004), InvalidParameter),
        (SendWr(9, WrType.FETCH_ADD, [Sge(1, 4, 1)], SIG, remote_addr=0x1000), InvalidParameter),
        (write(9, wr_id=-1), InvalidParameter),
        (write(9, send_opt=SendOpt(1 << 6)), InvalidWrType),
    ],
)
def test_bad_request_posts_the_ones_before_it(bad: SendWr, cls: type) -> None:
    qp = FakeQp()
    sq = send_queue(qp)
    with pytest.raises(cls) as info:
        sq.post([write(0), write(1), bad, write(3)])
    assert isinstance(info.value, PostError)
    assert info.value.failed_index == 2
    assert [s["wr_id"] for s in qp.sent] == [0, 1]


@pytest.mark.parametrize(
    ("qp_type", "bad", "cls"),
    [
        (QpType.RC, SendWr(9, WrType.RDMA_READ, [Sge(1, 8, 1)], SIG | SendOpt.IMMEDIATE),
         InvalidWrType),
        (QpType.RC, write(9, send_opt=SendOpt(1 << 6)), InvalidWrType),
        (QpType.RC, write(9, sg_list=[Sge(1, 1, 1)] * 5), InvalidMaxSge),
        (QpType.RC, write(9, send_opt=SIG | SendOpt.INLINE, sg_list=[Sge(1, 65, 1)]),
         InvalidParameter),
        (QpType.RC, write(9, send_opt=SIG | SendOpt.INLINE, sg_list=[Sge(1, 33, 1)] * 2),
         InvalidParameter),
        (QpType.RC, SendWr(9, WrType.FETCH_ADD, [Sge(1, 8, 1)], SIG, remote_addr=0x1004),
         InvalidParameter),
        (QpType.RC, SendWr(9, WrType.FETCH_ADD, [Sge(1, 4, 1)], SIG, remote_addr=0x1000),
         InvalidParameter),
        (QpType.UD, SendWr(9, WrType.SEND, [Sge(1, 2, 3)], SIG), InvalidParameter),
        (QpType.UD, SendWr(9, WrType.SEND, [Sge(1, 2, 3)], SIG, ud=UdDest(object(), 1, 1)),
         InvalidAvHandle),
    ],
)  # fmt: skip
def test_every_send_path_refuses_a_bad_request_alike(qp_type: QpType, bad: SendWr,
                                                     cls: type) -> None:
    """The pooled pyverbs path, its fresh-object path (a chunk with a 2-SGE request) and
    the ctypes fast path: same status, index and message, the requests before it posted."""
    ud = UdDest("AV", 1, 1) if qp_type is QpType.UD else None
    ok = [SendWr(i, WrType.SEND, [Sge(1, 2, 3)], SIG, ud=ud) for i in range(2)]
    two = [SendWr(0, WrType.SEND, [Sge(1, 2, 3)] * 2, SIG, ud=ud), ok[1]]
    details = set()
    for path in ("pooled", "fresh", "fast"):
        good = two if path == "fresh" else ok
        if path == "fast":
            lib = FakeLib()
            fq = fast_queue(lib, qp_type, ah_ptr_of=lambda av: 0x77 if av == "AV" else 0)
            post, sent = fq.post, lib.sent
        else:
            qp = FakeQp()
            post, sent = send_queue(qp, qp_type).post, qp.sent
        with pytest.raises(cls) as info:
            post([*good, bad, write(3) if qp_type is QpType.RC else ok[0]])
        assert isinstance(info.value, PostError) and info.value.failed_index == 2, path
        assert [s["wr_id"] for s in sent] == [0, 1], path
        details.add(info.value.detail)
    assert len(details) == 1 and details.pop().startswith("send WR 2: "), details


def test_ud_without_a_usable_av() -> None:
    qp = FakeQp()
    sq = send_queue(qp, QpType.UD)
    with pytest.raises(InvalidAvHandle) as info:
        sq.post([SendWr(0, WrType.SEND, [Sge(1, 2, 3)], SIG, ud=UdDest(object(), 1, 1))])
    assert isinstance(info.value, PostError) and info.value.failed_index == 0


@pytest.mark.parametrize("imm", [False, True])
def test_refusal_by_libibverbs_is_located(imm: bool) -> None:
    qp = FakeQp()
    qp.refuse_at = 3
    sq = send_queue(qp)
    opt = SIG | SendOpt.IMMEDIATE if imm else SIG
    wrs = [write(7, send_opt=opt, imm=i) for i in range(6)]  # same wr_id everywhere
    with pytest.raises(InsufficientResources) as info:
        sq.post(wrs)
    assert isinstance(info.value, PostError) and info.value.failed_index == 3


# ----------------------------------------------------- pyverbs receive path


def test_receives_are_cached_tokenised_and_mapped_back() -> None:
    qp = FakeQp()
    tokens = RecvTokens()
    owner = Owner()
    rq = RecvQueue(API, qp.post_recv, max_sge=2, tokens=tokens, owner=owner)
    rq.post([RecvWr(10, [Sge(0x100, 64, 5)]), RecvWr(11, [Sge(0x100, 64, 5)]), RecvWr(12, [])])
    assert len(rq.cache) == 2  # one RecvWR per distinct scatter list
    toks = [t for t, _ in qp.recvd]
    assert all(t in tokens.map for t in toks) and owner.rtok == set(toks)
    assert qp.recvd[2][1] == []  # zero-SGE receive
    wcs = convert_wcs([_wc(toks[1], 0, C.IBV_WC_RECV, blen=12, qpn=5)], tokens)
    assert (wcs[0].wr_id, wcs[0].wc_type, wcs[0].length) == (11, WcType.RECV, 12)
    assert toks[1] not in tokens.map and toks[1] not in owner.rtok


def test_receive_errors() -> None:
    qp = FakeQp()
    tokens = RecvTokens()
    owner = Owner()
    rq = RecvQueue(API, qp.post_recv, max_sge=1, tokens=tokens, owner=owner)
    with pytest.raises(InvalidMaxSge) as info:
        rq.post([RecvWr(1, [Sge(1, 1, 1)]), RecvWr(2, [Sge(1, 1, 1)] * 2)])
    assert isinstance(info.value, PostError) and info.value.failed_index == 1
    assert len(qp.recvd) == 1
    qp.refuse_at = 2
    with pytest.raises(InsufficientResources) as full:
        rq.post([RecvWr(3, [Sge(1, 1, 1)]), RecvWr(4, [Sge(2, 1, 1)])])
    assert isinstance(full.value, PostError) and full.value.failed_index == 1
    assert len(tokens.map) == 2 == len(owner.rtok)  # the refused one left no token


# -------------------------------------------------------------- completions


def test_invalidate_and_bind_requests_fill_the_union_and_bind_mw() -> None:
    """SEND_WITH_INV and LOCAL_INV carry the key (host order) in imm_data; BIND_MW goes
    through set_bind_wr, with the consumer's R_Key stored when it is not the next one."""
    stored: list[tuple[int, int]] = []

    def set_rkey(w: FakeSendWR, rkey: int) -> None:
        stored.append((w.wr_id, rkey))
        w.wr["rkey"] = rkey

    api = PyverbsApi(FakeSendWR, FakeSGE, FakeRecvWR, FakeRdmaError, set_bind_rkey=set_rkey)
    qp = FakeQp()
    sq = SendQueue(api, qp.post_send, QpType.RC, max_sge=4, max_inline=64, depth=16,
                   atomics=True, ah_of=lambda av: None, allowed=INV_RC,
                   bind_of=lambda wr: ((wr.mw, 0x1200), ("info", wr.bind.addr)))  # fmt: skip
    bind = BindWr(None, 0x5000, 64, AccessFlags.RDMA_WRITE, 0x1200)
    sq.post([
        SendWr(1, WrType.SEND_WITH_INV, [Sge(0x10, 4, 1)], SIG, invalidate_rkey=0x12345678),
        SendWr(2, WrType.LOCAL_INV, [], SIG, invalidate_rkey=0xAABBCC01),
        SendWr(3, WrType.BIND_MW, [], SIG, rkey=0x1201, mw="MW", bind=bind),
        SendWr(4, WrType.BIND_MW, [], SIG, rkey=0x1277, mw="MW", bind=bind),
    ])  # fmt: skip
    a, b, c, d = qp.sent
    assert (a["opcode"], a["imm"], a["sges"]) == (C.IBV_WR_SEND_WITH_INV, 0x12345678,
                                                  [(0x10, 4, 1)])  # fmt: skip
    assert (b["opcode"], b["imm"], b["sges"]) == (C.IBV_WR_LOCAL_INV, 0xAABBCC01, [])
    assert (c["opcode"], c["mw"], c["info"], c["rkey"]) == (C.IBV_WR_BIND_MW, "MW",
                                                            ("info", 0x5000), 0x1201)  # fmt: skip
    assert d["rkey"] == 0x1277 and stored == [(4, 0x1277)]

    def refuse(wr: SendWr) -> Any:
        raise InvalidMwHandle("BIND_MW: invalid or destroyed window")

    qp2 = FakeQp()
    sq2 = SendQueue(API, qp2.post_send, QpType.RC, max_sge=4, max_inline=64, depth=16,
                    atomics=True, ah_of=lambda av: None, allowed=INV_RC,
                    bind_of=refuse)  # fmt: skip
    with pytest.raises(PostError) as ei:
        sq2.post([write(1), SendWr(2, WrType.BIND_MW, [], SIG, rkey=1, mw="x", bind=bind)])
    assert ei.value.failed_index == 1 and ei.value.status is Status.INVALID_MW_HANDLE
    assert [w["wr_id"] for w in qp2.sent] == [1]


def test_fast_path_packs_invalidate_and_bind() -> None:
    lib = FakeLib()
    sq = fast_queue(lib, allowed=INV_RC, bind_of=lambda wr: (0xAAAA0, 0xBBBB0, 0x8))
    bind = BindWr(None, 0x5000, 0x40, AccessFlags.RDMA_WRITE, 0x1200)
    sq.post([
        SendWr(1, WrType.SEND_WITH_INV, [Sge(0x10, 4, 1)], SIG, invalidate_rkey=0x12345678),
        SendWr(2, WrType.LOCAL_INV, [], SendOpt.NONE, invalidate_rkey=0xAABBCC01),
        SendWr(3, WrType.BIND_MW, [], SIG, rkey=0x1277, mw="MW", bind=bind),
    ])  # fmt: skip
    a, b, c = lib.sent
    assert (a["opcode"], a["imm"], a["sges"]) == (C.IBV_WR_SEND_WITH_INV, 0x12345678,
                                                  [(0x10, 4, 1)])  # fmt: skip
    assert (b["opcode"], b["imm"], b["sges"], b["flags"]) == (C.IBV_WR_LOCAL_INV, 0xAABBCC01,
                                                              [], 0)  # fmt: skip
    assert (c["opcode"], c["flags"]) == (C.IBV_WR_BIND_MW, C.IBV_SEND_SIGNALED)
    assert c["bind"] == (0xAAAA0, 0x1277, 0xBBBB0, 0x5000, 0x40, 0x8)
    with pytest.raises(PostError) as ei:
        no_bind = SendWr(3, WrType.BIND_MW, [], SIG, rkey=1, mw="MW")
        fast_queue(FakeLib(), allowed=INV_RC).post([no_bind])
    assert ei.value.failed_index == 0 and ei.value.status is Status.INVALID_PARAMETER


def test_invalidate_completions() -> None:
    """IBV_WC_WITH_INV (or kernel rxe's bit 2, when the CA says so) -> RecvOpt.INVALIDATE
    and the R_Key from the imm_data union; the bit means nothing on send completions."""
    tokens = RecvTokens()
    owner = Owner()
    t1, t2, t3 = tokens.add(1, owner), tokens.add(2, owner), tokens.add(3, owner)
    std, plain = convert_wcs(
        [_wc(t1, 0, C.IBV_WC_RECV, imm=0x1234_5601, flags=C.IBV_WC_WITH_INV),
         _wc(t2, 0, C.IBV_WC_RECV, imm=0x77, flags=C.KERNEL_WC_WITH_INVALIDATE)],
        tokens,
    )  # fmt: skip
    assert std.recv_opt == RecvOpt.INVALIDATE and std.invalidated_rkey == 0x1234_5601
    assert std.imm is None
    assert plain.recv_opt == RecvOpt.NONE and plain.invalidated_rkey is None
    (rxe,) = convert_wcs([_wc(t3, 0, C.IBV_WC_RECV, imm=0xABCD, flags=4)], tokens, with_inv=4)
    assert rxe.recv_opt == RecvOpt.INVALIDATE and rxe.invalidated_rkey == 0xABCD
    sends = convert_wcs([_wc(9, 0, C.IBV_WC_LOCAL_INV), _wc(10, 0, C.IBV_WC_BIND_MW)], tokens)
    assert [(w.wc_type, w.invalidated_rkey) for w in sends] == [
        (WcType.LOCAL_INV, None), (WcType.MW_BIND, None)]  # fmt: skip


def _wc(wr_id: int, status: int, opcode: int, *, blen: int = 8, imm: int = 0, qpn: int = 1,
        src: int = 0, flags: int = 0, verr: int = 0) -> tuple[int, ...]:  # fmt: skip
    return (wr_id, status, opcode, verr, blen, imm, qpn, src, flags, 0, 0, 0, 0)


def test_send_completions_and_the_cache() -> None:
    cache: dict[Any, Any] = {}
    tokens = RecvTokens()
    a = convert_wcs([_wc(1, 0, C.IBV_WC_RDMA_WRITE), _wc(2, 0, C.IBV_WC_FETCH_ADD)], tokens,
                    cache=cache)  # fmt: skip
    assert [(w.wr_id, w.wc_type, w.status) for w in a] == [
        (1, WcType.RDMA_WRITE, WcStatus.SUCCESS), (2, WcType.FETCH_ADD, WcStatus.SUCCESS)
    ]  # fmt: skip
    b = convert_wcs([_wc(1, 0, C.IBV_WC_RDMA_WRITE)], tokens, cache=cache)
    assert b[0] is a[0]  # immutable, so shared
    for i in range(SEND_WC_CACHE_MAX + 1):
        convert_wcs([_wc(100 + i, 0, C.IBV_WC_SEND)], tokens, cache=cache)
    assert len(cache) <= SEND_WC_CACHE_MAX


def test_receive_flags_imm_and_grh_only_for_ud() -> None:
    tokens = RecvTokens()
    owner = Owner()
    t_rc, t_ud = tokens.add(1, owner), tokens.add(2, owner)
    flags = C.IBV_WC_GRH | C.IBV_WC_WITH_IMM
    rc, ud = convert_wcs(
        [_wc(t_rc, 0, C.IBV_WC_RECV_RDMA_WITH_IMM, imm=imm_to_verbs(0x11223344), qpn=5,
             flags=flags),
         _wc(t_ud, 0, C.IBV_WC_RECV, blen=48, qpn=6, src=77, flags=C.IBV_WC_GRH)],
        tokens, {6},
    )  # fmt: skip
    assert rc.wc_type is WcType.RECV_RDMA_WRITE and rc.imm == 0x11223344
    assert rc.recv_opt == RecvOpt.IMMEDIATE
    assert ud.recv_opt == RecvOpt.GRH_VALID and ud.src_qp == 77 and ud.length == 48
    assert ud.imm is None


def test_flushed_receive_reported_with_send_opcode_is_a_receive() -> None:
    tokens = RecvTokens()
    owner = Owner()
    tok = tokens.add(42, owner)
    recv, send = convert_wcs(
        [_wc(tok, 5, C.IBV_WC_SEND, qpn=3), _wc(42, 5, C.IBV_WC_RDMA_WRITE, qpn=3, verr=7)],
        tokens,
    )
    assert (recv.wr_id, recv.wc_type, recv.status) == (42, WcType.RECV, WcStatus.WR_FLUSHED_ERR)
    assert (send.wr_id, send.wc_type, send.vendor_err) == (42, WcType.RDMA_WRITE, 7)
    assert recv.length == 0


@pytest.mark.parametrize(
    ("ibv", "ibal"),
    [(0, WcStatus.SUCCESS), (4, WcStatus.LOCAL_PROTECTION_ERR), (10, WcStatus.REM_ACCESS_ERR),
     (12, WcStatus.TIMEOUT_RETRY_ERR), (13, WcStatus.RNR_RETRY_ERR), (21, WcStatus.GENERAL_ERR),
     (99, WcStatus.GENERAL_ERR)],
)  # fmt: skip
def test_status_map(ibv: int, ibal: WcStatus) -> None:
    (wc,) = convert_wcs([_wc(1, ibv, C.IBV_WC_SEND)], RecvTokens())
    assert wc.status is ibal


# ---------------------------------------------------------- ctypes data path


def _read_wr(addr: int) -> tuple[dict[str, Any], int]:
    """One ``struct ibv_send_wr`` at ``addr`` (and its SGEs), plus its ``next``."""
    raw = ctypes.string_at(addr, 128)
    wr_id, nxt, sgl, ns, op, flags, imm = struct.unpack_from("<QQQiIII", raw)
    d: dict[str, Any] = {"wr_id": wr_id, "opcode": op, "flags": flags, "imm": imm}
    d["sges"] = [struct.unpack("<QII", ctypes.string_at(sgl + 16 * i, 16)) for i in range(ns)]
    d["rdma"] = struct.unpack_from("<QI", raw, 40)
    d["atomic"] = struct.unpack_from("<QQQI", raw, 40)
    d["ud"] = struct.unpack_from("<QII", raw, 40)
    b = abi.offset(abi.IbvSendWr, "tail")
    d["bind"] = struct.unpack_from("<QI4xQQQI", raw, b)
    return d, nxt


class FakeLib:
    """Plays libibverbs' ``ops.post_send``/``post_recv``: walks the chain, may refuse one."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.recvd: list[tuple[int, list[tuple[int, int, int]]]] = []
        self.refuse_at: int | None = None
        self.calls = 0

    def post_send(self, qp_ptr: int, head: int, bad: Any) -> int:
        self.calls += 1
        assert qp_ptr == 0xABC
        addr = head
        while addr:
            if self.refuse_at is not None and len(self.sent) == self.refuse_at:
                ctypes.cast(bad, ctypes.POINTER(ctypes.c_void_p))[0] = addr
                return errno.ENOMEM
            d, addr = _read_wr(addr)
            self.sent.append(d)
        return 0

    def post_recv(self, ptr: int, head: int, bad: Any) -> int:
        addr = head
        while addr:
            if self.refuse_at is not None and len(self.recvd) == self.refuse_at:
                ctypes.cast(bad, ctypes.POINTER(ctypes.c_void_p))[0] = addr
                return errno.ENOMEM
            wr_id, nxt, sgl, ns = struct.unpack("<QQQi", ctypes.string_at(addr, 28))
            sges = [struct.unpack("<QII", ctypes.string_at(sgl + 16 * i, 16)) for i in range(ns)]
            self.recvd.append((wr_id, sges))
            addr = nxt
        return 0


class FakeOps:
    def __init__(self, lib: FakeLib) -> None:
        self.post_send = lib.post_send
        self.post_recv = lib.post_recv
        self.post_srq_recv = lib.post_recv


def fast_queue(lib: FakeLib, qp_type: QpType = QpType.RC, **kw: Any) -> FastSendQueue:
    opts: dict[str, Any] = {"max_sge": 4, "max_inline": 64, "depth": 16, "atomics": True,
                            "ah_ptr_of": lambda av: 0x7777 if av == "AV" else 0}  # fmt: skip
    opts.update(kw)
    return FastSendQueue(FakeOps(lib), 0xABC, qp_type, **opts)  # type: ignore[arg-type]


def test_fast_send_packs_verbs_structs() -> None:
    lib = FakeLib()
    sq = fast_queue(lib)
    sq.post([
        write(1),
        SendWr(2, WrType.FETCH_ADD, [Sge(0x2000, 8, 3)], SIG, remote_addr=0x8008, rkey=9,
               compare_add=5),
        SendWr(3, WrType.SEND, [Sge(0x10, 4, 1), Sge(0x20, 4, 2)], SIG | SendOpt.IMMEDIATE,
               imm=0x01020304),
        SendWr(4, WrType.SEND, [], SendOpt.NONE),
    ])  # fmt: skip
    assert lib.calls == 1
    a, b, c, d = lib.sent
    assert (a["wr_id"], a["opcode"], a["flags"]) == (1, C.IBV_WR_RDMA_WRITE, C.IBV_SEND_SIGNALED)
    assert a["rdma"] == (0x9008, 0x55) and a["sges"] == [(0x1001, 8, 7)]
    assert b["opcode"] == C.IBV_WR_ATOMIC_FETCH_AND_ADD and b["atomic"] == (0x8008, 5, 0, 9)
    assert c["opcode"] == C.IBV_WR_SEND_WITH_IMM
    assert struct.pack("=I", c["imm"]) == bytes([1, 2, 3, 4])
    assert c["sges"] == [(0x10, 4, 1), (0x20, 4, 2)]
    assert d["sges"] == [] and d["flags"] == 0
    ul = FakeLib()
    fast_queue(ul, QpType.UD).post([SendWr(5, WrType.SEND, [Sge(1, 2, 3)], SIG,
                                           ud=UdDest("AV", 0x123, 0x42))])  # fmt: skip
    assert ul.sent[0]["ud"] == (0x7777, 0x123, 0x42)
    with pytest.raises(InvalidAvHandle):
        fast_queue(ul, QpType.UD).post([SendWr(5, WrType.SEND, [], SIG, ud=UdDest("x", 1, 1))])


def test_fast_send_chunks_and_failure_index() -> None:
    lib = FakeLib()
    sq = fast_queue(lib, depth=1000)
    n = 2 * POOL_MAX + 3
    sq.post([write(i) for i in range(n)])
    assert [s["wr_id"] for s in lib.sent] == list(range(n)) and lib.calls == 3
    lib.refuse_at = n + 5
    with pytest.raises(InsufficientResources) as info:
        sq.post([write(9) for _ in range(10)])
    assert isinstance(info.value, PostError) and info.value.failed_index == 5
    lib.refuse_at = None
    with pytest.raises(InvalidMaxSge) as sges:
        sq.post([write(20), write(21), write(22, sg_list=[Sge(1, 1, 1)] * 5)])
    assert isinstance(sges.value, PostError) and sges.value.failed_index == 2
    assert [s["wr_id"] for s in lib.sent][-2:] == [20, 21]


def test_fast_recv_batch_tokens_and_failure() -> None:
    lib = FakeLib()
    tokens = RecvTokens()
    owner = Owner()
    rq = FastRecvQueue(lib.post_recv, 0xDEF, max_sge=2, tokens=tokens, owner=owner)
    rq.post([RecvWr(1, [Sge(0x10, 64, 9)]), RecvWr(2, [Sge(0x20, 8, 9), Sge(0x30, 8, 9)]),
             RecvWr(3, [])])  # fmt: skip
    assert [tokens.map[t][0] for t, _ in lib.recvd] == [1, 2, 3]
    assert lib.recvd[1][1] == [(0x20, 8, 9), (0x30, 8, 9)] and lib.recvd[2][1] == []
    lib.refuse_at = 4
    with pytest.raises(InsufficientResources) as info:
        rq.post([RecvWr(4, [Sge(1, 1, 1)]), RecvWr(5, [Sge(1, 1, 1)]), RecvWr(6, [Sge(1, 1, 1)])])
    assert isinstance(info.value, PostError) and info.value.failed_index == 1
    assert len(tokens.map) == 4 == len(owner.rtok)


def test_fast_poller_unpacks_ibv_wc() -> None:
    record = struct.Struct("<QIIIIIIIIHHBB2x")
    rows = [(5, 0, C.IBV_WC_RDMA_WRITE, 0, 8, 0, 17, 0, 0, 0, 0, 0, 0),
            (6, 5, C.IBV_WC_SEND, 3, 0, 0, 17, 0, 0, 0, 0, 0, 0)]  # fmt: skip

    class Ops:
        def poll_cq(self, cq: int, n: int, addr: int) -> int:
            assert cq == 0x1234 and n == 4
            data = b"".join(record.pack(*r) for r in rows)
            ctypes.memmove(addr, data, len(data))
            return len(rows)

    assert record.size == WC_SIZE
    p = FastPoller(Ops(), 0x1234)  # type: ignore[arg-type]
    wcs = convert_wcs(p.poll(4), RecvTokens())
    assert [(w.wr_id, w.wc_type, w.status, w.vendor_err) for w in wcs] == [
        (5, WcType.RDMA_WRITE, WcStatus.SUCCESS, 0),
        (6, WcType.SEND, WcStatus.WR_FLUSHED_ERR, 3),
    ]


# --------------------------------------------------- queue depth and SQD hold


@pytest.mark.parametrize("fast", [False, True])
def test_post_beyond_the_granted_depth_posts_what_fits(fast: bool) -> None:
    if fast:
        lib = FakeLib()
        sq: Any = fast_queue(lib, depth=4)
        sent = lib.sent
    else:
        qp = FakeQp()
        sq = send_queue(qp, depth=4)
        sent = qp.sent
    with pytest.raises(InsufficientResources) as info:
        sq.post([write(i) for i in range(6)])
    assert isinstance(info.value, PostError) and info.value.failed_index == 4
    assert [s["wr_id"] for s in sent] == [0, 1, 2, 3]
    with pytest.raises(InsufficientResources) as info:
        sq.post([write(9)])
    assert isinstance(info.value, PostError) and info.value.failed_index == 0
    # two completions polled free two slots
    convert_wcs([_wc(0, 0, C.IBV_WC_RDMA_WRITE, qpn=5)] * 2, RecvTokens(), sq_accts={5: sq.acct})
    sq.post([write(10), write(11)])
    assert [s["wr_id"] for s in sent][-2:] == [10, 11]


def test_selective_signaling_frees_slots_at_the_signaled_completion() -> None:
    qp = FakeQp()
    sq = send_queue(qp, depth=4, all_signaled=False)
    sq.post([write(0, send_opt=SendOpt.NONE), write(1, send_opt=SendOpt.NONE), write(2), write(3)])
    assert sq.acct.room() == 0
    accts = {5: sq.acct}
    convert_wcs([_wc(2, 0, C.IBV_WC_RDMA_WRITE, qpn=5)], RecvTokens(), sq_accts=accts)
    assert sq.acct.room() == 3  # 0, 1 and 2 left the queue with 2's completion
    # an error completion (here the flushed 3) frees its slot too
    convert_wcs([_wc(3, 5, C.IBV_WC_RDMA_WRITE, qpn=5)], RecvTokens(), sq_accts=accts)
    assert sq.acct.room() == 4 and not sq.acct.sig


@pytest.mark.parametrize("fast", [False, True])
def test_sends_held_in_sqd_are_posted_at_release(fast: bool) -> None:
    if fast:
        lib = FakeLib()
        sq: Any = fast_queue(lib)
        sent = lib.sent
    else:
        qp = FakeQp()
        sq = send_queue(qp)
        sent = qp.sent
    sq.post([write(1), write(2)], hold=True)
    with pytest.raises(InvalidMaxSge) as info:
        sq.post([write(3), write(4, sg_list=[Sge(1, 1, 1)] * 5)], hold=True)
    assert isinstance(info.value, PostError) and info.value.failed_index == 1
    assert sent == []
    assert sq.acct.posted == 3
    sq.post([write(5)])  # not held: goes now (the QP left SQD)
    sq.release()
    assert [s["wr_id"] for s in sent] == [5, 1, 2, 3]
    sq.post([write(6)], hold=True)
    sq.drop_held()
    sq.release()
    assert [s["wr_id"] for s in sent] == [5, 1, 2, 3]


@pytest.mark.parametrize("fast", [False, True])
def test_held_sends_that_cannot_be_posted_complete_flushed(fast: bool) -> None:
    """Resuming from SQD may fail: what was not posted completes WR_FLUSHED_ERR, none is lost."""
    if fast:
        lib = FakeLib()
        sq: Any = fast_queue(lib, depth=8)
        sent = lib.sent
    else:
        qp = FakeQp()
        sq = send_queue(qp, depth=8)
        lib = qp  # type: ignore[assignment]
        sent = qp.sent
    sq.post([write(1), write(2, send_opt=SendOpt.NONE)], hold=True)
    sq.post([SendWr(3, WrType.SEND, [Sge(1, 8, 7)])], hold=True)
    assert sq.acct.room() == 5
    lib.refuse_at = 1  # libibverbs takes the first and refuses the rest (a QP gone bad)
    lost = sq.release()
    assert [s["wr_id"] for s in sent] == [1]
    assert lost == [(2, WrType.RDMA_WRITE), (3, WrType.SEND)]  # unsignaled ones too
    wcs = convert_wcs(flush_tuples(lost, 5), RecvTokens(), sq_accts={5: sq.acct})
    assert [(w.wr_id, w.wc_type, w.status, w.qp_num) for w in wcs] == [
        (2, WcType.RDMA_WRITE, WcStatus.WR_FLUSHED_ERR, 5),
        (3, WcType.SEND, WcStatus.WR_FLUSHED_ERR, 5),
    ]
    assert sq.acct.room() == 7  # only the posted 1 still holds its slot
    assert sq.release() == []
