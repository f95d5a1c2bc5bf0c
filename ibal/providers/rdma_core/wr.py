"""Work requests and completions: ibal records <-> pyverbs objects.

This is the hot path, so it avoids building pyverbs objects per work request:

* **Sends** go through a per-QP pool of pyverbs ``SendWR`` objects, each with
  its own ``SGE``, chained ``pool[i].next -> pool[i+1]`` once at creation.  A
  batch of ``k`` work requests fills the *last* ``k`` entries (the chain then
  ends with a NULL ``next`` by construction) and is posted with one
  ``ibv_post_send`` call, which for rxe is one doorbell system call.  Filling
  an entry is a handful of attribute stores; building ``SGE`` + ``SendWR``
  objects costs about ten times more (both call ``logging.getLogger`` and
  ``malloc``, and pyverbs never frees them unless ``close()`` is called).
  Work requests with more than one SGE use freshly built objects.
* **Receives** are posted one per ``ibv_post_recv`` (for rxe a pure user-space
  queue write); the ``RecvWR`` for a given scatter list is cached, as
  receives are usually re-posted on the same buffers.  The ``wr_id`` handed to
  verbs is a token that maps back to the consumer's ``wr_id``: this tells
  receive completions from send completions when the provider reports a
  flushed receive with opcode ``IBV_WC_SEND`` (kernel rxe does, and verbs
  leaves ``opcode`` undefined for failed completions).
* **Completions** are built with the slot descriptors of :class:`Wc` rather
  than its frozen-dataclass ``__init__`` (half the cost).

``failed_index``: a batch fails at the first bad work request.  Checks that
can be made here (opcode for the QP type, SGE count, inline size, atomic
alignment, AV) are made before posting, so the index is exact and the work
requests before it are posted.  When libibverbs refuses one (queue full), the
copy of the bad request pyverbs returns identifies it: work requests without
immediate data carry their position in the batch in ``imm_data``, which
verbs ignores for those opcodes.
"""

from __future__ import annotations

import errno
import itertools
import logging
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from ibal.providers.rdma_core import consts as C
from ibal.providers.rdma_core.errors import status_of
from ibal.status import (
    IbError,
    InsufficientResources,
    InvalidAvHandle,
    InvalidMaxSge,
    InvalidParameter,
    InvalidWrType,
    PostError,
    Unsupported,
    post_error,
)
from ibal.types import (
    BASE_WR_TYPES,
    INVALIDATE_WR_TYPES,
    QpType,
    RecvOpt,
    RecvWr,
    SendOpt,
    SendWr,
    Wc,
    WcStatus,
    WcType,
    WrType,
)

POOL_MAX = 64
"""Most send work requests posted with one ``ibv_post_send`` call."""

log = logging.getLogger("ibal.providers.rdma_core")

RECV_CACHE_MAX = 4096
"""Cached ``RecvWR`` objects per queue before the cache is emptied."""

K_PLAIN, K_RDMA, K_ATOMIC, K_UD, K_INV, K_BIND = range(6)
"""How a work request fills ``ibv_send_wr`` past its header; ``K_INV`` puts
``invalidate_rkey`` (host order) where the header has ``imm_data``."""
_NOPT = 64  # SendOpt has six bits
_TABLE_LEN = (max(WrType) + 1) * _NOPT  # indexed by value: WrType has gaps

if sys.byteorder == "little":

    def imm_to_verbs(imm: int) -> int:
        """ibal immediate (an int whose big-endian bytes go on the wire) -> ``imm_data``."""
        return int.from_bytes(imm.to_bytes(4, "little"), "big")

else:  # pragma: no cover - big-endian hosts

    def imm_to_verbs(imm: int) -> int:
        imm.to_bytes(4, "big")  # range check
        return imm


imm_from_verbs = imm_to_verbs


SendEntry = tuple[int, int, int, bool, bool]
"""(ibv opcode, ibv send flags, kind, has immediate, inline)."""


def build_send_table(
    qp_type: QpType, atomics: bool, allowed: frozenset[WrType] | None = None
) -> list[SendEntry | type[IbError]]:
    """The translation of every ``(WrType, SendOpt)`` pair for one QP type.

    Index ``opcode * 64 + send_opt``; an entry is either the verbs form or the
    exception class to raise for that work request.
    """
    if allowed is None:
        allowed = {
            QpType.RC: BASE_WR_TYPES,
            QpType.UC: frozenset({WrType.SEND, WrType.RDMA_WRITE}),
            QpType.UD: frozenset({WrType.SEND}),
        }.get(qp_type, frozenset())
    table: list[SendEntry | type[IbError]] = []
    for value in range(_TABLE_LEN // _NOPT):
        op = _WR_TYPES.get(value)
        for opt in range(_NOPT):
            table.append(
                InvalidWrType if op is None
                else _send_entry(qp_type, op, SendOpt(opt), atomics, allowed)
            )  # fmt: skip
    return table


_WR_TYPES = {int(op): op for op in WrType}


def _send_entry(
    qp_type: QpType, op: WrType, opt: SendOpt, atomics: bool, allowed: frozenset[WrType]
) -> SendEntry | type[IbError]:
    if op not in allowed:
        return InvalidWrType
    if op not in BASE_WR_TYPES and op not in INVALIDATE_WR_TYPES:
        return Unsupported
    if op.is_atomic and not atomics:
        return Unsupported
    if opt & SendOpt.LOCAL:
        return InvalidParameter  # a MAD-QP option; no special QPs here
    imm = bool(opt & SendOpt.IMMEDIATE)
    inline = bool(opt & SendOpt.INLINE)
    if op is WrType.SEND:
        code = C.IBV_WR_SEND_WITH_IMM if imm else C.IBV_WR_SEND
        kind = K_UD if qp_type is QpType.UD else K_PLAIN
    elif op is WrType.RDMA_WRITE:
        code = C.IBV_WR_RDMA_WRITE_WITH_IMM if imm else C.IBV_WR_RDMA_WRITE
        kind = K_RDMA
    elif op in INVALIDATE_WR_TYPES:
        if imm:
            return InvalidWrType  # its imm_data slot holds the key to invalidate
        if inline and op is not WrType.SEND_WITH_INV:
            return InvalidParameter
        code = {
            WrType.SEND_WITH_INV: C.IBV_WR_SEND_WITH_INV,
            WrType.LOCAL_INV: C.IBV_WR_LOCAL_INV,
            WrType.BIND_MW: C.IBV_WR_BIND_MW,
        }[op]
        kind = K_BIND if op is WrType.BIND_MW else K_INV
    else:
        if imm:
            return InvalidWrType
        if inline:
            return InvalidParameter
        code = {
            WrType.RDMA_READ: C.IBV_WR_RDMA_READ,
            WrType.COMPARE_SWAP: C.IBV_WR_ATOMIC_CMP_AND_SWP,
            WrType.FETCH_ADD: C.IBV_WR_ATOMIC_FETCH_AND_ADD,
        }[op]
        kind = K_RDMA if op is WrType.RDMA_READ else K_ATOMIC
    flags = 0
    if opt & SendOpt.SIGNALED:
        flags |= C.IBV_SEND_SIGNALED
    if opt & SendOpt.FENCE:
        flags |= C.IBV_SEND_FENCE
    if opt & SendOpt.SOLICITED:
        flags |= C.IBV_SEND_SOLICITED
    if inline:
        flags |= C.IBV_SEND_INLINE
    return (code, flags, kind, imm, inline)


# The per-WR checks of every send path (the pyverbs pool, its fresh-object path, the ctypes
# fast path), in the order they are made; each raises the IbError for the WR, which the
# path turns into its PostError (``send WR <index>: <detail>``).  The two hot paths guard
# inline and ask :func:`refusal` for the verdict only when a guard fires: a call per WR
# costs them 10-30 %.
def send_entry(table: Sequence[SendEntry | type[IbError]], wr: SendWr, max_sge: int,
               max_inline: int) -> SendEntry:
    """``wr``'s row of ``table`` (:func:`build_send_table`): opcode and options valid on
    the QP, no more SGEs than ``max_sge``, inline data within ``max_inline``."""
    opt = wr.send_opt
    idx = wr.opcode * _NOPT + opt
    if opt >> 6 or not 0 <= idx < _TABLE_LEN:
        raise InvalidWrType("unknown opcode or send options")
    ent = table[idx]
    if not isinstance(ent, tuple):
        raise ent("opcode/options not valid on this QP")
    sgl = wr.sg_list
    if len(sgl) > max_sge:
        raise InvalidMaxSge(f"{len(sgl)} SGEs, QP has {max_sge}")
    if ent[4] and sum(g.length for g in sgl) > max_inline:
        raise InvalidParameter("inline data too long")
    return ent


def ud_target(wr: SendWr, ah_of: Callable[[Any], Any]) -> tuple[Any, int, int]:
    """A UD send's address handle (a pyverbs AH or an ``ibv_ah *``, as ``ah_of`` gives it:
    ``None`` or NULL for a bad AV), remote QP and Q_Key."""
    ud = wr.ud
    if ud is None:
        raise InvalidParameter("UD send without a destination")
    ah = ah_of(ud.av)
    if ah is None or (isinstance(ah, int) and not ah):
        raise InvalidAvHandle("invalid or destroyed AV (or a RoCE AV without a GRH)")
    return ah, ud.remote_qp, ud.remote_qkey


def check_atomic(wr: SendWr) -> None:
    """An atomic's target is 8-byte aligned and its SGEs hold exactly 8 bytes."""
    if wr.remote_addr & 7:
        raise InvalidParameter("atomic remote_addr not 8-byte aligned")
    if sum(g.length for g in wr.sg_list) != 8:
        raise InvalidParameter("atomic needs exactly 8 bytes of SGE")


def check_send_wr(table: Sequence[SendEntry | type[IbError]], wr: SendWr, max_sge: int,
                  max_inline: int, ah_of: Callable[[Any], Any]) -> SendEntry:
    """Every check above that applies to ``wr`` (its kind's too); its table row."""
    ent = send_entry(table, wr, max_sge, max_inline)
    if ent[2] == K_UD:
        ud_target(wr, ah_of)
    elif ent[2] == K_ATOMIC:
        check_atomic(wr)
    return ent


def refusal(table: Sequence[SendEntry | type[IbError]], wr: SendWr, max_sge: int,
            max_inline: int, ah_of: Callable[[Any], Any]) -> IbError:
    """The IbError :func:`check_send_wr` raises for ``wr``, which an inline guard of a hot
    path stopped (the guards mirror those checks: one they pass is a bug, said so)."""
    try:
        check_send_wr(table, wr, max_sge, max_inline, ah_of)
    except IbError as exc:
        return exc
    raise AssertionError(f"an inline guard refused send WR {wr.wr_id!r}; the checks pass it")


Held = list[tuple[int, WrType]]
"""``(wr_id, opcode)`` of send work requests held back in SQD."""

_WC_OF_WR = {
    WrType.SEND: C.IBV_WC_SEND,
    WrType.RDMA_WRITE: C.IBV_WC_RDMA_WRITE,
    WrType.RDMA_READ: C.IBV_WC_RDMA_READ,
    WrType.COMPARE_SWAP: C.IBV_WC_COMP_SWAP,
    WrType.FETCH_ADD: C.IBV_WC_FETCH_ADD,
    WrType.SEND_WITH_INV: C.IBV_WC_SEND,
    WrType.LOCAL_INV: C.IBV_WC_LOCAL_INV,
    WrType.BIND_MW: C.IBV_WC_BIND_MW,
}
IBV_WC_WR_FLUSH_ERR = 5
KEY_IN_IMM = C.IMM_OPCODES | {C.IBV_WR_SEND_WITH_INV, C.IBV_WR_LOCAL_INV}
"""Opcodes whose ``imm_data`` slot carries data (so it cannot mark a WR's position)."""


def _index_of(ids: Held, wr_id: object) -> int:
    for j, (i, _) in enumerate(ids):
        if i == wr_id:
            return j
    return 0


def flush_tuples(lost: Held, qp_num: int) -> list[tuple[int, ...]]:
    """``ibv_wc`` tuples completing ``lost`` flushed (the input of :func:`convert_wcs`)."""
    return [
        (wr_id, IBV_WC_WR_FLUSH_ERR, _WC_OF_WR[op], 0, 0, 0, qp_num, 0, 0, 0, 0, 0, 0)
        for wr_id, op in lost
    ]



class SqAccount:
    """Send-queue occupancy, so a post beyond the granted depth fails as the contract says.

    libibverbs rounds queues up and rxe runs the requester inside the
    doorbell, so neither refuses a post beyond the depth the QP was granted.
    A work request occupies its slot until its completion is polled (as on
    real hardware, whose driver advances the queue tail in poll_cq); an
    unsignaled one until a later signaled one completes.  ``sig`` holds the
    sequence numbers of signaled requests when the QP signals selectively.
    """

    __slots__ = ("all_signaled", "depth", "posted", "retired", "sig")

    def __init__(self, depth: int, all_signaled: bool) -> None:
        self.depth = depth
        self.all_signaled = all_signaled
        self.posted = 0
        self.retired = 0
        self.sig: deque[int] = deque()

    def room(self) -> int:
        out = self.posted - self.retired
        return self.depth - (out if out > 0 else 0)

    def note(self, wrs: Sequence[SendWr], base: int, count: int) -> None:
        """``wrs[base:base+count]`` are now on the queue."""
        if not self.all_signaled:
            seq = self.posted
            sig = self.sig
            bit_and = int.__and__  # an enum.Flag ``&`` per WR cost 7x this (perftest -s 8)
            signaled = int(SendOpt.SIGNALED)
            for j in range(count):
                seq += 1
                if bit_and(wrs[base + j].send_opt, signaled):
                    sig.append(seq)
        self.posted += count

    def note_one(self, signaled: bool) -> None:
        self.posted += 1
        if signaled and not self.all_signaled:
            self.sig.append(self.posted)

    def reset(self) -> None:
        """The QP went to RESET: its queue is empty."""
        self.retired = self.posted
        self.sig.clear()


class PyverbsApi:
    """The pyverbs classes the translation uses (fakes in unit tests)."""

    def __init__(
        self,
        send_wr: Any,
        sge: Any,
        recv_wr: Any,
        rdma_error: type[BaseException],
        adopt_sge: Callable[[Any, Any], int | None] | None = None,
        free: Callable[[int], None] | None = None,
        set_bind_rkey: Callable[[Any, int], None] | None = None,
    ) -> None:
        self.SendWR = send_wr
        self.SGE = sge
        self.RecvWR = recv_wr
        self.rdma_error = rdma_error
        self.adopt_sge = adopt_sge
        self.free = free
        self.set_bind_rkey = set_bind_rkey
        """Stores ``bind_mw.rkey`` of a ``SendWR`` (pyverbs 44 only sets the next key itself)."""


def post_fail(status_cls: type[IbError], index: int, message: str) -> PostError:
    """The :class:`PostError` for request ``index`` failing with ``status_cls``'s status."""
    return post_error(status_cls.status, index, message)


def post_chunked(
    acct: SqAccount,
    size: int,
    wrs: Sequence[SendWr],
    chunk: Callable[[Sequence[SendWr], int, int], None],
) -> None:
    """Post as many of ``wrs`` as the send queue has room for, ``size`` per chain.

    ``chunk(wrs, base, k)`` posts ``wrs[base:base + k]``; both send queues
    (pyverbs and the ctypes fast path) share this accounting.  Raises
    ``InsufficientResources`` at the first request that found no room.
    """
    n = len(wrs)
    room = acct.room()
    limit = n if n <= room else max(room, 0)
    base = 0
    while base < limit:
        k = limit - base if limit - base <= size else size
        chunk(wrs, base, k)
        base += k
    if limit < n:
        raise post_fail(InsufficientResources, limit, f"send queue full ({acct.depth} granted)")


class SendQueue:
    """Posts ibal send work requests on one pyverbs QP."""

    def __init__(
        self,
        api: PyverbsApi,
        post: Callable[[Any, Any], None],
        qp_type: QpType,
        *,
        max_sge: int,
        max_inline: int,
        depth: int,
        atomics: bool,
        ah_of: Callable[[Any], Any],
        allowed: frozenset[WrType] | None = None,
        all_signaled: bool = True,
        bind_of: Callable[[SendWr], tuple[Any, Any]] | None = None,
    ) -> None:
        self.api = api
        self.bind_of = bind_of
        """A ``BIND_MW``'s pyverbs ``MW`` and ``MWBindInfo``; raises an IbError for bad handles."""
        self._post = post
        self.acct = SqAccount(depth, all_signaled)
        self.holding = False
        self.held: list[tuple[list[Any], list[Any], Held]] = []
        self.closed = False
        self.qp_type = qp_type
        self.max_sge = max_sge
        self.max_inline = max_inline
        self.table = build_send_table(qp_type, atomics, allowed)
        self.ah_of = ah_of
        self.lock = threading.Lock()
        self.size = max(1, min(depth, POOL_MAX))
        self.pool_wr: list[Any] = []
        self.pool_sge: list[Any] = []
        for _ in range(self.size):
            wr, sge = self._pooled_pair()
            self.pool_wr.append(wr)
            self.pool_sge.append(sge)
        for a, b in itertools.pairwise(self.pool_wr):
            a.next_wr = b
        self.bad, self._bad_sge = self._pooled_pair()

    def _pooled_pair(self) -> tuple[Any, Any]:
        api = self.api
        sge = api.SGE(0, 0, 0)
        wr = api.SendWR(opcode=C.IBV_WR_BIND_MW, num_sge=0)
        old = api.adopt_sge(wr, sge) if api.adopt_sge is not None else None
        if old is None:
            wr.sg_list = sge
        elif old and api.free is not None:
            api.free(old)
        return wr, sge

    def close(self) -> None:
        """Free the pooled scatter entries (the SendWRs point at them)."""
        with self.lock:
            self.closed = True
            for sge in (*self.pool_sge, self._bad_sge):
                sge.close()
            self.pool_sge = []
            self.pool_wr = []
            self.size = 0

    # ------------------------------------------------------------------ post
    def post(self, wrs: Sequence[SendWr], hold: bool = False) -> None:
        """Post ``wrs``; with ``hold`` (QP in SQD) validate and queue them until :meth:`release`."""
        with self.lock:
            if self.closed or not self.size:
                raise post_fail(InvalidParameter, 0, "QP destroyed")
            self.holding = hold
            post_chunked(self.acct, self.size, wrs, self._post_chunk)

    def release(self) -> Held:
        """Post what was held while the QP was in SQD, in order.

        Returns the requests libibverbs refused (and every later one): the
        caller completes them with ``WR_FLUSHED_ERR`` (:func:`flush_tuples`).
        """
        lost: Held = []
        with self.lock:
            held, self.held = self.held, []
            for built, sges, ids in held:
                try:
                    if lost:
                        lost.extend(ids)
                        continue
                    self._post(built[0], self.bad)
                except self.api.rdma_error as exc:
                    at = _index_of(ids, getattr(self.bad, "wr_id", None))
                    log.warning("rdma_core: posting work requests held in SQD failed: %s", exc)
                    lost.extend(ids[at:])
                finally:
                    for w in built:
                        w.close()
                    for g in sges:
                        g.close()
        return lost

    def drop_held(self) -> None:
        """The QP went to RESET: held work requests vanish without completions."""
        with self.lock:
            held, self.held = self.held, []
            for built, sges, _ids in held:
                for w in built:
                    w.close()
                for g in sges:
                    g.close()

    def _post_chunk(self, wrs: Sequence[SendWr], base: int, k: int) -> None:
        if self.holding:
            return self._post_fresh(wrs, base, k)
        first = self.size - k
        pool_wr = self.pool_wr
        pool_sge = self.pool_sge
        table = self.table
        max_sge = self.max_sge
        j = 0
        try:
            for j in range(k):
                wr = wrs[base + j]
                opt = wr.send_opt
                idx = wr.opcode * _NOPT + opt
                ent = table[idx] if not opt >> 6 and 0 <= idx < _TABLE_LEN else None
                if not isinstance(ent, tuple):
                    raise self._refusal(wr)
                code, flags, kind, imm, inline = ent
                sgl = wr.sg_list
                ns = len(sgl)
                if ns > max_sge:
                    raise self._refusal(wr)
                w = pool_wr[first + j]
                if ns == 1 and kind != K_BIND:
                    g = sgl[0]
                    s = pool_sge[first + j]
                    s.addr = g.addr
                    s.length = g.length
                    s.lkey = g.lkey
                    if inline and g.length > self.max_inline:
                        raise self._refusal(wr)
                elif ns or kind == K_BIND:
                    return self._post_fresh(wrs, base, k)
                w.num_sge = ns
                self._fill(w, wr, code, flags, kind, imm, j)
        except PostError:
            raise
        except IbError as exc:
            raise self._refuse(wrs, base, j, type(exc), exc.detail) from None
        except (OverflowError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise self._refuse(wrs, base, j, InvalidParameter, str(exc)) from exc
        try:
            self._post(pool_wr[first], self.bad)
        except self.api.rdma_error as exc:
            idx = self._locate(wrs, base, k)
            self.acct.note(wrs, base, idx)
            raise self._posted_error(exc, base + idx) from exc
        self.acct.note(wrs, base, k)
        return None

    def _set_bind(self, w: Any, wr: SendWr) -> None:
        """Fill a ``BIND_MW``: window, region range and access, and the new R_Key."""
        if self.bind_of is None:
            raise Unsupported("BIND_MW is not mapped on this QP")
        mw, info = self.bind_of(wr)
        w.set_bind_wr(mw, info)
        if int(w.rkey) != wr.rkey:  # pyverbs sets ibv_inc_rkey of the window's key
            if self.api.set_bind_rkey is None:
                raise InvalidParameter("this pyverbs binds type 2 windows to the next key only")
            self.api.set_bind_rkey(w, wr.rkey)

    def _refuse(
        self, wrs: Sequence[SendWr], base: int, j: int, cls: type[IbError], why: str
    ) -> PostError:
        """Post ``wrs[base:base+j]`` (the good prefix), then describe WR ``base+j``."""
        if j:
            self._post_fresh(wrs, base, j)
        return post_fail(cls, base + j, f"send WR {base + j}: {why}")

    def _posted_error(self, exc: BaseException, index: int) -> PostError:
        status = status_of(exc, {errno.ENOMEM: InsufficientResources})
        return post_error(status, index, f"ibv_post_send: {exc}")

    def _locate(self, wrs: Sequence[SendWr], base: int, k: int) -> int:
        """Index in the chunk of the work request libibverbs refused."""
        bad = self.bad
        try:
            code, wr_id, mark = bad.opcode, bad.wr_id, bad.imm_data
        except Exception:  # pragma: no cover - pyverbs always fills these
            return 0
        if code not in KEY_IN_IMM and 0 <= mark < k and wrs[base + mark].wr_id == wr_id:
            return int(mark)
        for j in range(k):
            wr = wrs[base + j]
            if wr.wr_id == wr_id and (code not in C.IMM_OPCODES or imm_to_verbs(wr.imm) == mark):
                return j
        return 0

    # ----------------------------------------------------------- slow path
    def _post_fresh(self, wrs: Sequence[SendWr], base: int, k: int) -> None:
        """Build, chain and post ``wrs[base:base+k]`` with new pyverbs objects."""
        built: list[Any] = []
        sges: list[Any] = []
        kept = False
        try:
            for j in range(k):
                wr = wrs[base + j]
                try:
                    w = self._build_one(wr, j, sges)
                except PostError:
                    raise
                except IbError as exc:
                    kept = self._post_built(built, wrs, base, sges)
                    why = f"send WR {base + j}: {exc.detail}"
                    raise post_fail(type(exc), base + j, why) from exc
                except (OverflowError, TypeError, ValueError, AttributeError) as exc:
                    kept = self._post_built(built, wrs, base, sges)
                    why = f"send WR {base + j}: {exc}"
                    raise post_fail(InvalidParameter, base + j, why) from exc
                if built:
                    built[-1].next_wr = w
                built.append(w)
            kept = self._post_built(built, wrs, base, sges)
        finally:
            if not kept:
                for w in built:
                    w.close()
                for g in sges:
                    g.close()

    def _post_built(
        self, built: list[Any], wrs: Sequence[SendWr], base: int, sges: list[Any]
    ) -> bool:
        """Post (or, holding, keep) a built chain; True when the objects were kept."""
        if not built:
            return False
        if self.holding:
            ids = [(wrs[base + j].wr_id, WrType(wrs[base + j].opcode)) for j in range(len(built))]
            self.held.append((list(built), list(sges), ids))
            self.acct.note(wrs, base, len(built))
            return True
        try:
            self._post(built[0], self.bad)
        except self.api.rdma_error as exc:
            idx = self._locate(wrs, base, len(built))
            self.acct.note(wrs, base, idx)
            raise self._posted_error(exc, base + idx) from exc
        self.acct.note(wrs, base, len(built))
        return False

    def _build_one(self, wr: SendWr, j: int, sges: list[Any]) -> Any:
        api = self.api
        code, flags, kind, imm, _inline = send_entry(self.table, wr, self.max_sge,
                                                     self.max_inline)  # fmt: skip
        sgl = wr.sg_list
        mine = [api.SGE(g.addr, g.length, g.lkey) for g in sgl]
        sges.extend(mine)
        if mine:
            w = api.SendWR(
                wr_id=wr.wr_id, opcode=code, num_sge=len(mine), sg=mine, send_flags=flags
            )
        else:
            w = api.SendWR(opcode=C.IBV_WR_BIND_MW, num_sge=0)
        try:
            self._fill(w, wr, code, flags, kind, imm, j)
        except BaseException:
            w.close()
            raise
        return w

    def _fill(self, w: Any, wr: SendWr, code: int, flags: int, kind: int, imm: bool,
              j: int) -> None:
        """Write ``wr`` (its row ``code, flags, kind, imm`` of the table, ``j``-th of its
        chain) into the pyverbs ``SendWR`` ``w``, whose scatter list is set: both the
        pooled and the freshly built requests."""
        w.wr_id = wr.wr_id
        w.opcode = code
        w.send_flags = flags
        w.imm_data = imm_to_verbs(wr.imm) if imm else j
        if kind == K_RDMA:
            w.set_wr_rdma(wr.rkey, wr.remote_addr)
        elif kind == K_INV:
            w.imm_data = wr.invalidate_rkey
        elif kind == K_BIND:
            self._set_bind(w, wr)
        elif kind == K_UD:
            ud = wr.ud
            if ud is None or (ah := self.ah_of(ud.av)) is None:
                raise self._refusal(wr)
            w.set_wr_ud(ah, ud.remote_qp, ud.remote_qkey)
        elif kind == K_ATOMIC:
            if wr.remote_addr & 7 or sum(g.length for g in wr.sg_list) != 8:
                raise self._refusal(wr)
            w.set_wr_atomic(wr.rkey, wr.remote_addr, wr.compare_add, wr.swap)

    def _refusal(self, wr: SendWr) -> IbError:
        return refusal(self.table, wr, self.max_sge, self.max_inline, self.ah_of)


# --------------------------------------------------------------------- receives


class RecvTokens:
    """Maps the ``wr_id`` given to verbs for a receive back to the consumer's.

    ``owner`` is the QP or SRQ the receive was posted to; its ``rtok`` set
    holds its outstanding tokens so they can be dropped when it goes away.
    """

    TAG = 0xB1A1 << 48

    def __init__(self) -> None:
        self.map: dict[int, tuple[int, Any]] = {}
        self._next = itertools.count(1).__next__

    def add(self, wr_id: int, owner: Any) -> int:
        tok = self.TAG | (self._next() & 0xFFFF_FFFF_FFFF)
        self.map[tok] = (wr_id, owner)
        owner.rtok.add(tok)
        return tok

    def drop(self, tok: int, owner: Any) -> None:
        self.map.pop(tok, None)
        owner.rtok.discard(tok)

    def purge(self, tokens: set[int]) -> None:
        pop = self.map.pop
        for tok in tokens:
            pop(tok, None)
        tokens.clear()


class RecvQueue:
    """Posts ibal receive work requests on a pyverbs QP or SRQ."""

    def __init__(
        self,
        api: PyverbsApi,
        post: Callable[[Any], None],
        *,
        max_sge: int,
        tokens: RecvTokens,
        owner: Any,
    ) -> None:
        self.api = api
        self._post = post
        self.max_sge = max_sge
        self.tokens = tokens
        self.owner = owner
        self.cache: dict[Any, Any] = {}
        self.lock = threading.Lock()
        self.closed = False

    def close(self) -> None:
        with self.lock:
            for rw in self.cache.values():
                rw.close()
            self.cache.clear()
            self.closed = True

    def _make(self, key: Any, sgl: Sequence[Any]) -> Any:
        api = self.api
        if len(self.cache) >= RECV_CACHE_MAX:
            for rw in self.cache.values():
                rw.close()
            self.cache.clear()
        sges = [api.SGE(g.addr, g.length, g.lkey) for g in sgl] if sgl else [api.SGE(0, 0, 0)]
        try:
            rw = api.RecvWR(wr_id=0, num_sge=len(sges), sg=sges)
        finally:
            for s in sges:
                s.close()
        if not sgl:
            rw.num_sge = 0
        self.cache[key] = rw
        return rw

    def post(self, wrs: Sequence[RecvWr]) -> None:
        tokens = self.tokens
        owner = self.owner
        cache = self.cache
        post = self._post
        rdma_error = self.api.rdma_error
        with self.lock:
            if self.closed:
                raise post_fail(InvalidParameter, 0, "queue destroyed")
            for j, wr in enumerate(wrs):
                try:
                    sgl = wr.sg_list
                    ns = len(sgl)
                    if ns == 1:
                        g = sgl[0]
                        key: Any = (g.addr, g.length, g.lkey)
                    elif ns == 0:
                        key = ()
                    else:
                        key = tuple((g.addr, g.length, g.lkey) for g in sgl)
                    if ns > self.max_sge:
                        raise post_fail(
                            InvalidMaxSge, j, f"recv WR {j}: {ns} SGEs, queue has {self.max_sge}"
                        )
                    rw = cache.get(key)
                    if rw is None:
                        rw = self._make(key, sgl)
                    tok = tokens.add(wr.wr_id, owner)
                except PostError:
                    raise
                except (OverflowError, TypeError, ValueError, AttributeError) as exc:
                    raise post_fail(InvalidParameter, j, f"recv WR {j}: {exc}") from exc
                rw.wr_id = tok
                try:
                    post(rw)
                except rdma_error as exc:
                    tokens.drop(tok, owner)
                    status = status_of(exc, {errno.ENOMEM: InsufficientResources})
                    raise post_error(status, j, f"ibv_post_recv: {exc}") from exc


# ------------------------------------------------------------------- completions


def _wc_builders() -> tuple[Callable[..., Wc], Callable[..., Wc]]:
    """Fast constructors for :class:`Wc` through its slot descriptors.

    Falls back to the dataclass constructor if ``Wc`` is not a slotted
    dataclass with the expected fields.
    """
    names = (
        "wr_id",
        "wc_type",
        "status",
        "length",
        "imm",
        "recv_opt",
        "qp_num",
        "src_qp",
        "slid",
        "sl",
        "pkey_index",
        "path_bits",
        "vendor_err",
        "grh",
        "network_header",
        "invalidated_rkey",
    )
    fields = tuple(getattr(Wc, "__dataclass_fields__", {}))
    slots = getattr(Wc, "__slots__", ())
    if fields != names or tuple(slots) != names:  # pragma: no cover - types.py changed

        def full_slow(*args: Any) -> Wc:
            make: Any = Wc
            *head, inv = args
            return cast(Wc, make(*head, None, None, inv))

        def send_ok_slow(wr_id: int, wc_type: WcType, length: int, qp_num: int) -> Wc:
            return Wc(wr_id, wc_type, WcStatus.SUCCESS, length, None, RecvOpt.NONE, qp_num)

        return send_ok_slow, full_slow

    d = Wc.__dict__
    s = [d[n].__set__ for n in names]
    s_wr, s_ty, s_st, s_len, s_imm, s_ro, s_qp, s_src, s_slid, s_sl, s_pk, s_pb, s_ve = s[:13]
    s_grh, s_nh, s_inv = s[13:]
    new = object.__new__
    ok = WcStatus.SUCCESS
    none_opt = RecvOpt.NONE

    def send_ok(wr_id: int, wc_type: WcType, length: int, qp_num: int) -> Wc:
        o = new(Wc)
        s_wr(o, wr_id)
        s_ty(o, wc_type)
        s_st(o, ok)
        s_len(o, length)
        s_imm(o, None)
        s_ro(o, none_opt)
        s_qp(o, qp_num)
        s_src(o, 0)
        s_slid(o, 0)
        s_sl(o, 0)
        s_pk(o, 0)
        s_pb(o, 0)
        s_ve(o, 0)
        s_grh(o, None)
        s_nh(o, None)
        s_inv(o, None)
        return o

    def full(
        wr_id: int,
        wc_type: WcType,
        status: WcStatus,
        length: int,
        imm: int | None,
        recv_opt: RecvOpt,
        qp_num: int,
        src_qp: int,
        slid: int,
        sl: int,
        pkey_index: int,
        path_bits: int,
        vendor_err: int,
        invalidated_rkey: int | None = None,
    ) -> Wc:
        o = new(Wc)
        s_wr(o, wr_id)
        s_ty(o, wc_type)
        s_st(o, status)
        s_len(o, length)
        s_imm(o, imm)
        s_ro(o, recv_opt)
        s_qp(o, qp_num)
        s_src(o, src_qp)
        s_slid(o, slid)
        s_sl(o, sl)
        s_pk(o, pkey_index)
        s_pb(o, path_bits)
        s_ve(o, vendor_err)
        s_grh(o, None)
        s_nh(o, None)
        s_inv(o, invalidated_rkey)
        return o

    return send_ok, full


_send_ok, _full_wc = _wc_builders()
_WC_TYPES: list[WcType | None] = [C.WC_OPCODE_TO_TYPE.get(i) for i in range(256)]
_WC_STATUS = C.WC_STATUS_FROM_IBV
_RECV_OPTS = {
    0: RecvOpt.NONE,
    C.IBV_WC_GRH: RecvOpt.GRH_VALID,
    C.IBV_WC_WITH_IMM: RecvOpt.IMMEDIATE,
    C.IBV_WC_GRH | C.IBV_WC_WITH_IMM: RecvOpt.GRH_VALID | RecvOpt.IMMEDIATE,
}


SEND_WC_CACHE_MAX = 4096
"""Successful send completions remembered per CQ (see :func:`convert_wcs`)."""


def convert_wcs(
    wcs: Iterable[tuple[int, ...]],
    tokens: RecvTokens,
    ud_qpns: set[int] | frozenset[int] = frozenset(),
    cache: dict[tuple[int, int, int, int], Wc] | None = None,
    sq_accts: dict[int, SqAccount] | None = None,
    errored: set[int] | None = None,
    with_inv: int = C.IBV_WC_WITH_INV,
) -> list[Wc]:
    """``ibv_wc`` tuples -> ibal :class:`Wc`, in order.

    A tuple is ``(wr_id, status, opcode, vendor_err, byte_len, imm_data,
    qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits)``.

    ``ud_qpns``: numbers of the UD QPs; ``RecvOpt.GRH_VALID`` is reported for
    them only (rxe sets ``IBV_WC_GRH`` on RoCE RC receives too, whose buffers
    hold no GRH).

    ``cache``: a successful send completion is fully described by
    ``(wr_id, opcode, byte_len, qp_num)``, and :class:`Wc` is immutable, so
    programs that re-post the same work requests get the same objects back
    instead of new ones (building one costs more than the rest of the
    translation).  Bounded by :data:`SEND_WC_CACHE_MAX`.

    ``sq_accts``: each QP's :class:`SqAccount`, by QP number; send
    completions free their slots there.

    ``errored``: numbers of QPs an error completion was seen for are added
    (the kernel may have moved them to ERROR behind the provider's back).

    ``with_inv``: the ``wc_flags`` bit that marks a receive of a SEND with
    invalidate (``IBV_WC_WITH_INV``; kernel rxe sets the kernel's bit 2); its
    ``imm_data`` then holds the invalidated R_Key in host order.
    """
    out: list[Wc] = []
    append = out.append
    types = _WC_TYPES
    pop = tokens.map.pop
    acct_map: dict[int, SqAccount] = sq_accts if sq_accts is not None else {}
    accts = acct_map.get
    for wr_id, st, op, verr, blen, immraw, qpn, src, flags, pki, slid, sl, pbits in wcs:
        if st == 0 and op < 128:
            t = types[op]
            if t is not None:
                a = accts(qpn)
                if a is not None:
                    if a.all_signaled or not a.sig:
                        a.retired += 1
                    else:
                        a.retired = a.sig.popleft()
                if cache is not None:
                    key = (wr_id, op, blen, qpn)
                    wc = cache.get(key)
                    if wc is None:
                        if len(cache) >= SEND_WC_CACHE_MAX:
                            cache.clear()
                        wc = cache[key] = _send_ok(wr_id, t, blen, qpn)
                    append(wc)
                else:
                    append(_send_ok(wr_id, t, blen, qpn))
                continue
        ent = pop(wr_id, None)
        if ent is not None:
            owner = ent[1]
            owner.rtok.discard(wr_id)
            wr_id = ent[0]
            wc_type = WcType.RECV_RDMA_WRITE if op == C.IBV_WC_RECV_RDMA_WITH_IMM else WcType.RECV
        else:
            wc_type = (types[op] if 0 <= op < 256 else None) or WcType.SEND
            if op < 128:
                a = accts(qpn)
                if a is not None:  # an error or flushed send: it leaves the queue too
                    a.retired += 1
                    sig = a.sig
                    while sig and sig[0] <= a.retired:
                        sig.popleft()
        if st == 0:
            imm = imm_from_verbs(immraw) if flags & C.IBV_WC_WITH_IMM else None
            if flags & C.IBV_WC_GRH and qpn not in ud_qpns:
                flags &= ~C.IBV_WC_GRH
            opts = _RECV_OPTS[flags & 3]
            inv = None
            if flags & with_inv and ent is not None:
                opts |= RecvOpt.INVALIDATE
                inv = immraw
            append(
                _full_wc(wr_id, wc_type, WcStatus.SUCCESS, blen, imm, opts,
                         qpn, src, slid, sl, pki, pbits, 0, inv)
            )  # fmt: skip
        else:
            status = _WC_STATUS.get(st, WcStatus.GENERAL_ERR)
            if errored is not None:
                errored.add(qpn)
            append(
                _full_wc(wr_id, wc_type, status, 0, None, RecvOpt.NONE, qpn, 0, 0, 0, 0, 0, verr)
            )
    return out


__all__ = [
    "POOL_MAX",
    "PyverbsApi",
    "RecvQueue",
    "RecvTokens",
    "SendQueue",
    "SqAccount",
    "build_send_table",
    "convert_wcs",
    "flush_tuples",
    "imm_from_verbs",
    "imm_to_verbs",
    "post_chunked",
    "post_fail",
]
