"""The data path through libibverbs' own dispatch table, with ctypes.

``ibv_post_send``, ``ibv_post_recv``, ``ibv_post_srq_recv`` and
``ibv_poll_cq`` are ``static inline`` functions in ``<infiniband/verbs.h>``:
every compiled verbs program calls ``qp->context->ops.post_send(...)`` (and
so on) itself.  The position of those four slots in ``struct
ibv_context_ops``, and the layouts of ``ibv_send_wr``, ``ibv_recv_wr``,
``ibv_sge`` and ``ibv_wc``, are therefore part of libibverbs' ABI and cannot
change without breaking every binary.  This module calls the slots through
ctypes with work requests packed by :mod:`struct` into buffers it owns:

* one ``struct.pack_into`` per single-SGE work request (header and SGE
  together) instead of a dozen pyverbs attribute stores;
* one call per batch, as before, and ``bad_wr`` comes back as a pointer into
  the buffer, so ``failed_index`` is exact without any marker;
* ``ibv_poll_cq`` fills an array of ``ibv_wc`` that :func:`struct.iter_unpack`
  turns into tuples in one C call, instead of pyverbs building a ``WC`` object
  (with a ``logging.getLogger`` call) per completion.

Control verbs stay on pyverbs.  :func:`load_ops` validates the table before it
is used (the slots must be non-NULL, live in one loaded provider library, and
``poll_cq`` on a fresh CQ must return 0); otherwise the provider keeps the
pyverbs data path (``wr.SendQueue`` and friends).  ``IBAL_RDMA_CORE_DATAPATH``
= ``pyverbs`` forces that path, ``ctypes`` requires this one.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ibal.providers.rdma_core import abi
from ibal.providers.rdma_core.errors import status_for_errno
from ibal.providers.rdma_core.wr import (
    _TABLE_LEN,
    K_ATOMIC,
    K_BIND,
    K_INV,
    K_PLAIN,
    K_RDMA,
    K_UD,
    POOL_MAX,
    Held,
    RecvTokens,
    SqAccount,
    build_send_table,
    imm_to_verbs,
    post_chunked,
    post_fail,
    refusal,
)
from ibal.status import (
    IbError,
    InsufficientResources,
    InvalidMaxSge,
    InvalidParameter,
    PostError,
)
from ibal.types import QpType, RecvWr, SendWr, WrType

DATAPATH_ENV = "IBAL_RDMA_CORE_DATAPATH"

log = logging.getLogger("ibal.providers.rdma_core")

SEND_WR_SIZE = ctypes.sizeof(abi.IbvSendWr)
RECV_WR_SIZE = ctypes.sizeof(abi.IbvRecvWr)
SGE_SIZE = ctypes.sizeof(abi.IbvSge)
WC_SIZE = ctypes.sizeof(abi.IbvWc)

_POLL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
_POST = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
)

_WC = abi.layout([(abi.IbvWc, [f[0] for f in abi.IbvWc._fields_])], whole=True)
_SGE_FIELDS = ("addr", "length", "lkey")
_SGE = abi.layout([(abi.IbvSge, _SGE_FIELDS)])
_NEXT = struct.Struct("<Q")
_NEXT_OFF = abi.offset(abi.IbvSendWr, "next")
assert abi.offset(abi.IbvRecvWr, "next") == _NEXT_OFF

# Send work request headers followed, for the single-SGE forms, by the slot's
# first SGE right after the ibv_send_wr.
_HDR = ("wr_id", "next", "sg_list", "num_sge", "opcode", "send_flags", "imm_data")
_KIND_FIELDS = {
    K_PLAIN: (),
    K_RDMA: ("wr.rdma.remote_addr", "wr.rdma.rkey"),
    K_ATOMIC: ("wr.atomic.remote_addr", "wr.atomic.compare_add", "wr.atomic.swap",
               "wr.atomic.rkey"),
    K_UD: ("wr.ud.ah", "wr.ud.remote_qpn", "wr.ud.remote_qkey"),
    K_INV: (),
    K_BIND: ("tail.bind_mw.mw", "tail.bind_mw.rkey", "tail.bind_mw.bind_info.mr",
             "tail.bind_mw.bind_info.addr", "tail.bind_mw.bind_info.length",
             "tail.bind_mw.bind_info.mw_access_flags"),
}  # fmt: skip
_S0 = {k: abi.layout([(abi.IbvSendWr, _HDR + f)]) for k, f in _KIND_FIELDS.items()}
_S1 = {
    k: abi.layout([(abi.IbvSendWr, _HDR + f), (abi.IbvSge, _SGE_FIELDS)])
    for k, f in _KIND_FIELDS.items()
}
_RECV = ("wr_id", "next", "sg_list", "num_sge")
_R1 = abi.layout([(abi.IbvRecvWr, _RECV), (abi.IbvSge, _SGE_FIELDS)])  # recv WR + one SGE
_R0 = abi.layout([(abi.IbvRecvWr, _RECV)])


class OpsUnavailable(RuntimeError):
    """The dispatch table could not be validated; use the pyverbs data path."""


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _library_of(address: int) -> str | None:
    try:
        libc = ctypes.CDLL(None)
        dladdr = libc.dladdr
    except (OSError, AttributeError):  # pragma: no cover
        return None
    dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    if not dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    name: bytes = info.dli_fname
    return name.decode(errors="replace")


class Ops:
    """The four data-path slots of one ``ibv_context``."""

    def __init__(self, ctx_ptr: int) -> None:
        ops = abi.IbvContext.from_address(ctx_ptr).ops
        addrs = {
            name: getattr(ops, name) or 0
            for name in ("poll_cq", "post_srq_recv", "post_send", "post_recv")
        }
        for name in ("poll_cq", "post_send", "post_recv"):
            if not addrs[name]:
                raise OpsUnavailable(f"ops.{name} is NULL")
        libs = {_library_of(a) for n, a in addrs.items() if a and n != "post_srq_recv"}
        if None in libs or len(libs) != 1:
            raise OpsUnavailable(f"ops slots do not resolve to one provider library: {libs}")
        self.library = next(iter(libs)) or ""
        self.poll_cq = _POLL(addrs["poll_cq"])
        self.post_send = _POST(addrs["post_send"])
        self.post_recv = _POST(addrs["post_recv"])
        self.post_srq_recv = _POST(addrs["post_srq_recv"]) if addrs["post_srq_recv"] else None

    def check_poll(self, cq_ptr: int) -> None:
        """``poll_cq`` on an empty CQ must report 0 entries."""
        buf = ctypes.create_string_buffer(WC_SIZE)
        rc = self.poll_cq(cq_ptr, 1, ctypes.addressof(buf))
        if rc != 0:
            raise OpsUnavailable(f"poll_cq on an empty CQ returned {rc}")


class FastSendQueue:
    """Send work requests packed into ``ibv_send_wr`` slots and posted through ``ops.post_send``."""

    def __init__(
        self,
        ops: Ops,
        qp_ptr: int,
        qp_type: QpType,
        *,
        max_sge: int,
        max_inline: int,
        depth: int,
        atomics: bool,
        ah_ptr_of: Callable[[Any], int],
        allowed: frozenset[WrType] | None = None,
        all_signaled: bool = True,
        bind_of: Callable[[SendWr], tuple[int, int, int]] | None = None,
    ) -> None:
        self._post_fn = ops.post_send
        self.bind_of = bind_of
        """A ``BIND_MW``'s ``(ibv_mw *, ibv_mr *, ibv access)``; IbError for bad handles."""
        self.acct = SqAccount(depth, all_signaled)
        self.holding = False
        self.held: list[tuple[bytes, int, Held]] = []
        self.qp_ptr = qp_ptr
        self.max_sge = max_sge
        self.max_inline = max_inline
        self.table = build_send_table(qp_type, atomics, allowed)
        self.ah_ptr_of = ah_ptr_of
        self.lock = threading.Lock()
        self.size = max(1, min(depth, POOL_MAX))
        self.slot = SEND_WR_SIZE + SGE_SIZE * max(1, max_sge)
        self.buf = ctypes.create_string_buffer(self.size * self.slot)
        self.base = ctypes.addressof(self.buf)
        self.next_ptr = [self.base + (j + 1) * self.slot for j in range(self.size)]
        self.sge_ptr = [self.base + j * self.slot + SEND_WR_SIZE for j in range(self.size)]
        self.bad = ctypes.c_void_p()
        self.bad_ref = ctypes.byref(self.bad)
        self.closed = False
        self._wrs: Sequence[SendWr] = ()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.held = []

    def post(self, wrs: Sequence[SendWr], hold: bool = False) -> None:
        """Post ``wrs``; with ``hold`` (QP in SQD) validate and keep them until :meth:`release`."""
        with self.lock:
            if self.closed:
                raise post_fail(InvalidParameter, 0, "QP destroyed")
            self.holding = hold
            try:
                post_chunked(self.acct, self.size, wrs, self._chunk)
            finally:
                self._wrs = ()

    def release(self) -> Held:
        """Post the chains held while the QP was in SQD, in order.

        Returns the requests libibverbs refused (and every later one), for the
        caller to complete with ``WR_FLUSHED_ERR`` (``wr.flush_tuples``).
        """
        lost: Held = []
        with self.lock:
            held, self.held = self.held, []
            for data, count, ids in held:
                if lost or self.closed:
                    lost.extend(ids)
                    continue
                ctypes.memmove(self.base, data, len(data))
                rc = self._post_fn(self.qp_ptr, self.base, self.bad_ref)
                if rc:
                    log.warning("rdma_core: posting work requests held in SQD failed: %d", rc)
                    bad = self.bad.value or self.base
                    idx = (bad - self.base) // self.slot
                    lost.extend(ids[idx if 0 <= idx < count else 0 :])
        return lost

    def drop_held(self) -> None:
        """The QP went to RESET: held work requests vanish without completions."""
        with self.lock:
            self.held = []

    def _chunk(self, wrs: Sequence[SendWr], base: int, k: int) -> None:
        self._wrs = wrs
        buf = self.buf
        slot = self.slot
        table = self.table
        max_sge = self.max_sge
        next_ptr = self.next_ptr
        sge_ptr = self.sge_ptr
        last = k - 1
        j = 0
        try:
            for j in range(k):
                wr = wrs[base + j]
                opt = wr.send_opt
                idx = wr.opcode * 64 + opt
                ent = table[idx] if not opt >> 6 and 0 <= idx < _TABLE_LEN else None
                if not isinstance(ent, tuple):
                    raise self._judged(base, j)
                code, flags, kind, imm, inline = ent
                sgl = wr.sg_list
                ns = len(sgl)
                if ns > max_sge:
                    raise self._judged(base, j)
                nxt = next_ptr[j] if j < last else 0
                immv = imm_to_verbs(wr.imm) if imm else wr.invalidate_rkey if kind == K_INV else 0
                if kind == K_BIND:
                    self._pack_bind(wr, j * slot, nxt, sge_ptr[j], code, flags, base, j)
                    continue
                off = j * slot
                if ns == 1:
                    g = sgl[0]
                    glen = g.length
                    if inline and glen > self.max_inline:
                        raise self._judged(base, j)
                    if kind == K_RDMA:
                        _S1_RDMA(buf, off, wr.wr_id, nxt, sge_ptr[j], 1, code, flags, immv,
                                 wr.remote_addr, wr.rkey, g.addr, glen, g.lkey)  # fmt: skip
                        continue
                    head = (wr.wr_id, nxt, sge_ptr[j], 1, code, flags, immv)
                    tail: tuple[int, ...] = (g.addr, glen, g.lkey)
                    packer = _S1[kind]
                else:
                    if inline and sum(g.length for g in sgl) > self.max_inline:
                        raise self._judged(base, j)
                    head = (wr.wr_id, nxt, sge_ptr[j], ns, code, flags, immv)
                    tail = ()
                    packer = _S0[kind]
                    p = sge_ptr[j] - self.base
                    for g in sgl:
                        _SGE.pack_into(buf, p, g.addr, g.length, g.lkey)
                        p += SGE_SIZE
                if kind == K_RDMA:
                    packer.pack_into(buf, off, *head, wr.remote_addr, wr.rkey, *tail)
                elif kind in (K_PLAIN, K_INV):
                    packer.pack_into(buf, off, *head, *tail)
                elif kind == K_UD:
                    ud = wr.ud
                    if ud is None or not (ah := self.ah_ptr_of(ud.av)):
                        raise self._judged(base, j)
                    packer.pack_into(buf, off, *head, ah, ud.remote_qp, ud.remote_qkey, *tail)
                else:
                    if wr.remote_addr & 7 or sum(g.length for g in sgl) != 8:
                        raise self._judged(base, j)
                    packer.pack_into(buf, off, *head, wr.remote_addr, wr.compare_add, wr.swap,
                                     wr.rkey, *tail)  # fmt: skip
        except PostError:
            raise
        except (struct.error, OverflowError, TypeError, ValueError, AttributeError) as exc:
            raise self._refuse(base, j, InvalidParameter, str(exc)) from exc
        self._post(base, k)

    def _pack_bind(
        self, wr: SendWr, off: int, nxt: int, sge: int, code: int, flags: int, base: int, j: int
    ) -> None:
        bind = wr.bind
        if self.bind_of is None or bind is None:
            raise self._refuse(base, j, InvalidParameter, "BIND_MW needs wr.mw and wr.bind")
        try:
            mw, mr, access = self.bind_of(wr)
        except IbError as exc:
            raise self._refuse(base, j, type(exc), exc.detail) from exc
        _S0[K_BIND].pack_into(self.buf, off, wr.wr_id, nxt, sge, 0, code, flags, 0,
                              mw, wr.rkey, mr, bind.addr, bind.length, access)  # fmt: skip

    def _post(self, base: int, count: int) -> None:
        wrs = self._wrs
        if self.holding:
            ids = [(wrs[base + j].wr_id, WrType(wrs[base + j].opcode)) for j in range(count)]
            self.held.append((ctypes.string_at(self.base, count * self.slot), count, ids))
            self.acct.note(wrs, base, count)
            return
        rc = self._post_fn(self.qp_ptr, self.base, self.bad_ref)
        if rc:
            bad = self.bad.value or self.base
            idx = (bad - self.base) // self.slot
            if not 0 <= idx < count:
                idx = 0
            self.acct.note(wrs, base, idx)
            cls = status_for_errno(rc, {errno.ENOMEM: InsufficientResources})
            raise post_fail(cls, base + idx, f"ibv_post_send: {errno.errorcode.get(rc, rc)}")
        self.acct.note(wrs, base, count)

    def _judged(self, base: int, j: int) -> PostError:
        """The refusal of WR ``base + j``, stopped by a guard of :meth:`_chunk`: the shared
        checks say what is wrong (:func:`~ibal.providers.rdma_core.wr.refusal`)."""
        exc = refusal(self.table, self._wrs[base + j], self.max_sge, self.max_inline,
                      self.ah_ptr_of)  # fmt: skip
        return self._refuse(base, j, type(exc), exc.detail)

    def _refuse(self, base: int, j: int, cls: type[IbError], why: str) -> PostError:
        """Post the ``j`` good requests before ``base + j``, then describe it."""
        if j:
            _NEXT.pack_into(self.buf, (j - 1) * self.slot + _NEXT_OFF, 0)
            self._post(base, j)
        return post_fail(cls, base + j, f"send WR {base + j}: {why}")


_S1_RDMA = _S1[K_RDMA].pack_into


class FastRecvQueue:
    """Receive work requests posted in batches through ``ops.post_recv``/``post_srq_recv``."""

    def __init__(
        self,
        post_fn: Any,
        target_ptr: int,
        *,
        max_sge: int,
        tokens: RecvTokens,
        owner: Any,
    ) -> None:
        self._post_fn = post_fn
        self.ptr = target_ptr
        self.max_sge = max_sge
        self.tokens = tokens
        self.owner = owner
        self.lock = threading.Lock()
        self.size = POOL_MAX
        self.slot = RECV_WR_SIZE + SGE_SIZE * max(1, max_sge)
        self.buf = ctypes.create_string_buffer(self.size * self.slot)
        self.base = ctypes.addressof(self.buf)
        self.next_ptr = [self.base + (j + 1) * self.slot for j in range(self.size)]
        self.sge_ptr = [self.base + j * self.slot + RECV_WR_SIZE for j in range(self.size)]
        self.bad = ctypes.c_void_p()
        self.bad_ref = ctypes.byref(self.bad)
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def post(self, wrs: Sequence[RecvWr]) -> None:
        n = len(wrs)
        with self.lock:
            if self.closed:
                raise post_fail(InvalidParameter, 0, "queue destroyed")
            base = 0
            while base < n:
                k = n - base if n - base <= self.size else self.size
                self._chunk(wrs, base, k)
                base += k

    def _chunk(self, wrs: Sequence[RecvWr], base: int, k: int) -> None:
        buf = self.buf
        slot = self.slot
        add = self.tokens.add
        owner = self.owner
        last = k - 1
        toks: list[int] = []
        j = 0
        try:
            for j in range(k):
                wr = wrs[base + j]
                sgl = wr.sg_list
                ns = len(sgl)
                if ns > self.max_sge:
                    why = f"recv WR {base + j}: {ns} SGEs, queue has {self.max_sge}"
                    raise post_fail(InvalidMaxSge, base + j, why)
                nxt = self.next_ptr[j] if j < last else 0
                sp = self.sge_ptr[j]
                if ns == 1:
                    g = sgl[0]
                    addr, length, lkey = g.addr, g.length, g.lkey
                    tok = add(wr.wr_id, owner)
                    toks.append(tok)
                    _R1.pack_into(buf, j * slot, tok, nxt, sp, 1, addr, length, lkey)
                else:
                    p = sp - self.base
                    for g in sgl:
                        _SGE.pack_into(buf, p, g.addr, g.length, g.lkey)
                        p += SGE_SIZE
                    tok = add(wr.wr_id, owner)
                    toks.append(tok)
                    _R0.pack_into(buf, j * slot, tok, nxt, sp, ns)
        except PostError as exc:
            self._drop(toks[j:] if len(toks) > j else [])
            if j:
                _NEXT.pack_into(buf, (j - 1) * slot + _NEXT_OFF, 0)
                self._post(base, j, toks)
            raise exc from None
        except (struct.error, OverflowError, TypeError, ValueError, AttributeError) as exc:
            self._drop(toks[j:])
            if j:
                _NEXT.pack_into(buf, (j - 1) * slot + _NEXT_OFF, 0)
                self._post(base, j, toks)
            raise post_fail(InvalidParameter, base + j, f"recv WR {base + j}: {exc}") from exc
        self._post(base, k, toks)

    def _drop(self, toks: Sequence[int]) -> None:
        for t in toks:
            self.tokens.drop(t, self.owner)

    def _post(self, base: int, count: int, toks: list[int]) -> None:
        rc = self._post_fn(self.ptr, self.base, self.bad_ref)
        if rc:
            bad = self.bad.value or self.base
            idx = (bad - self.base) // self.slot
            if not 0 <= idx < count:
                idx = 0
            self._drop(toks[idx:count])
            cls = status_for_errno(rc, {errno.ENOMEM: InsufficientResources})
            raise post_fail(cls, base + idx, f"ibv_post_recv: {errno.errorcode.get(rc, rc)}")


class FastPoller:
    """``ops.poll_cq`` into an ``ibv_wc`` array, unpacked in one call."""

    def __init__(self, ops: Ops, cq_ptr: int) -> None:
        self._poll = ops.poll_cq
        self.cq_ptr = cq_ptr
        self.cap = 0
        self.buf: Any = None
        self.addr = 0
        self.view: memoryview | None = None

    def poll(self, n: int) -> Any:
        if n > self.cap:
            self.cap = max(n, 16)
            self.buf = ctypes.create_string_buffer(self.cap * WC_SIZE)
            self.addr = ctypes.addressof(self.buf)
            self.view = memoryview(self.buf).cast("B")
        rc = self._poll(self.cq_ptr, n, self.addr)
        if rc <= 0:
            if rc < 0:
                raise OSError(-rc if rc < -1 else errno.EIO, "ibv_poll_cq failed")
            return ()
        assert self.view is not None
        return _WC.iter_unpack(self.view[: rc * WC_SIZE])


def wc_tuples_from_pyverbs(wcs: Sequence[Any]) -> list[tuple[int, ...]]:
    """pyverbs ``WC`` objects as the tuples :class:`FastPoller` yields."""
    return [
        (w.wr_id, w.status, w.opcode, w.vendor_err, w.byte_len, w.imm_data, w.qp_num,
         w.src_qp, w.wc_flags, w.pkey_index, w.slid, w.sl, w.dlid_path_bits)
        for w in wcs
    ]  # fmt: skip


__all__ = [
    "DATAPATH_ENV",
    "FastPoller",
    "FastRecvQueue",
    "FastSendQueue",
    "Ops",
    "OpsUnavailable",
    "wc_tuples_from_pyverbs",
]
