"""The send side of the AL's own QP0/QP1: :class:`SendRing`.

The special QP's send queue holds ``depth`` MADs, each in a slot of the
transport's registered buffer.  Sends beyond that wait in a backlog, in order
(a burst of 100 CM DREQs must not fail for want of slots, as with Linux's
overflow list).  One address handle serves every send to a destination while
any is in flight or it is among the recently used (:class:`AvCache`).

The send CQ is reaped by the thread that posted (:meth:`SendRing.reap` right
after ``post_send``) and armed only while sends are still out: a provider that
completes a datagram as it sends it (rxe, the mock) then costs no hop to the
completion queue per MAD; one whose completions lag gets the CQ's upcall, and
the completion queue reaps.  :meth:`SendRing.post_many` posts many sends with
one ``post_send`` (the answers to one receive batch: one datagram batch at the
provider).  The ring holds no policy: what a completed send
means (a report, a wait for its answer) is the transport's ``on_done``.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable
from typing import Any, Protocol

from ibal.al.dispatcher import log
from ibal.ci.interface import ChannelInterface
from ibal.status import IbError, InsufficientResources
from ibal.types import MAD_SIZE, AvAttr, Grh, MadSend, SendWr, Sge, UdDest, Wc, WcStatus

__all__ = ["AvCache", "AvKey", "Outgoing", "SendCqContext", "SendRing"]

BACKLOG_MAX = 4096  # sends queued behind a full send queue (Linux: its overflow list)

AvKey = tuple[int, int, Grh | None, int]  # DLID, SL, GRH, path bits


class Outgoing(Protocol):
    """What the ring needs of a send: its bytes, its address, its copies on the wire."""

    mad: bytes
    send: MadSend
    on_wire: int
    queued: bool


class AvCache:
    """Address handles of recent MAD destinations, shared by the sends in flight to each.

    A CM connection sends its REQ, RTU and DREQ to one address, an SA client all its
    queries to the SM: one ``create_av`` serves them, not one per MAD.  At most
    ``size`` handles stay when idle (the least recently used go first); one in use is
    never destroyed.  The owner holds its lock around every call and destroys what
    :meth:`release` and :meth:`clear` return once it has dropped the lock.
    """

    def __init__(self, size: int = 64) -> None:
        self.size = size
        self._avs: dict[AvKey, list[Any]] = {}  # key -> [handle, sends in flight]; LRU order

    def take(self, key: AvKey, create: Callable[[], Any]) -> Any:
        """The handle for ``key`` (made by ``create`` when missing), held by one more send."""
        entry = self._avs.pop(key, None)
        if entry is None:
            entry = [create(), 0]
        entry[1] += 1
        self._avs[key] = entry  # the most recently used last
        return entry[0]

    def release(self, key: AvKey) -> list[Any]:
        """One send of ``key`` is done; the idle handles evicted to stay within ``size``."""
        entry = self._avs.get(key)
        if entry is not None:
            entry[1] -= 1
        if len(self._avs) <= self.size:
            return []
        evicted = []
        for k in [k for k, e in self._avs.items() if e[1] <= 0]:
            evicted.append(self._avs.pop(k)[0])
            if len(self._avs) <= self.size:
                break
        return evicted

    def clear(self) -> list[Any]:
        """Every handle, forgotten (the QP is closing)."""
        out = [e[0] for e in self._avs.values()]
        self._avs.clear()
        return out


class SendCqContext:
    """The ``cq_context`` of a transport's send CQ (its upcall drains the sends)."""

    __slots__ = ("transport",)

    def __init__(self, transport: Any) -> None:
        self.transport = transport


OnDone = Callable[[Any, WcStatus, list[Any], Any], None]
"""``on_done(item, status, failed, deferred)``: a send's last copy left the wire (``item``
``None`` when nobody owns it any more); ``failed``: backlog items the provider refused
meanwhile; ``deferred``: the reaper's list for reports that must not run on its thread."""


class SendRing:
    """The special QP's send slots, backlog, address handles and send CQ.

    Every method but :meth:`reap` and :meth:`destroy_avs` runs under ``lock`` (the
    transport's, which guards its agents too); those two take it themselves.
    ``wanted(item)``: whether a queued send is still to go when a slot frees;
    ``on_done``: see :data:`OnDone`.  Once :meth:`clear` ran (the transport closed,
    under the same lock) nothing is out and nothing queued, so a reap finds no work.
    """

    def __init__(self, lock: threading.Lock, stats: Counter[str], depth: int,
                 wanted: Callable[[Any], bool], on_done: OnDone) -> None:  # fmt: skip
        self._lock = lock
        self.stats = stats
        self.depth = depth
        self._wanted = wanted
        self._on_done = on_done
        self.avs = AvCache()
        self._free: list[int] = []
        self._owner: dict[int, tuple[Any, AvKey]] = {}  # slot -> item (None: disowned), AV key
        self._backlog: deque[Any] = deque()
        self._armed = False
        self._ci: ChannelInterface | None = None
        self._h_pd: Any = None
        self._h_qp: Any = None
        self.h_cq: Any = None
        self._buf = bytearray()
        self._base = 0  # the first send slot's index in the buffer
        self._slot = 0
        self._vaddr = 0
        self._lkey = 0
        self._port_num = 0

    def start(self, ci: ChannelInterface, h_pd: Any, h_qp: Any, h_cq: Any, buf: bytearray,
              base: int, slot_size: int, vaddr: int, lkey: int, port_num: int) -> None:  # fmt: skip
        """The QP is ready: slots ``base .. base + depth - 1`` of ``buf`` carry sends."""
        self._ci, self._h_pd, self._h_qp, self.h_cq = ci, h_pd, h_qp, h_cq
        self._buf, self._base, self._slot = buf, base, slot_size
        self._vaddr, self._lkey, self._port_num = vaddr, lkey, port_num
        self._free = list(range(base, base + self.depth))

    @property
    def in_flight(self) -> bool:
        """Some send has not completed yet."""
        return bool(self._owner)

    def post(self, item: Outgoing) -> None:
        """Put ``item``'s MAD on the wire once more, or behind the sends in flight when
        every slot is taken; the provider's status exceptions, ``InsufficientResources``
        when the backlog is full too."""
        if not self._free:
            if item.queued:
                return  # a retry of a send still waiting for its first slot
            if len(self._backlog) >= BACKLOG_MAX:
                raise InsufficientResources(
                    f"{self.depth} MADs in flight and {BACKLOG_MAX} queued on the port")
            item.queued = True
            self._backlog.append(item)
            self.stats["sends_queued"] += 1
            return
        self._post_now(item)

    def _post_backlog(self) -> list[Any]:
        """Post queued sends while slots are free; those the provider refused."""
        failed: list[Any] = []
        while self._backlog and self._free:
            item = self._backlog.popleft()
            item.queued = False
            if not self._wanted(item):
                continue  # ended while it waited (cancelled, timed out, answered)
            try:
                self._post_now(item)
            except IbError as exc:
                log.debug("ibal: a queued MAD send failed: %s", exc)
                failed.append(item)
        return failed

    def post_many(self, items: list[Any]) -> list[Any]:
        """Post ``items`` in order with one ``post_send`` for all that find a free slot
        (one provider call, one datagram batch); the rest wait in the backlog as
        :meth:`post` would queue them.  Returns the items not sent, always a tail of
        ``items``: from the first the provider refused (or whose address handle could
        not be made, or that found the backlog full) on."""
        ci = self._ci
        assert ci is not None
        wrs: list[SendWr] = []
        n = 0
        stopped = False
        while n < len(items) and self._free:
            try:
                wrs.append(self._prepare(items[n]))
            except IbError as exc:
                log.debug("ibal: a MAD's address handle could not be made: %s", exc)
                stopped = True
                break
            n += 1
        if wrs:
            try:
                ci.post_send(self._h_qp, wrs)
            except IbError as exc:
                first = getattr(exc, "failed_index", 0)  # the WRs before it are on the wire
                log.debug("ibal: MAD sends failed at %d of %d: %s", first, len(wrs), exc)
                for wr, item in zip(wrs[first:], items[first:n], strict=True):
                    self._unprepare(wr.wr_id, item)
                return items[first:]
        if stopped:
            return items[n:]
        for k in range(n, len(items)):
            try:
                self.post(items[k])
            except InsufficientResources:
                return items[k:]
        return []

    def _prepare(self, item: Outgoing) -> SendWr:
        """A slot for ``item`` with its MAD copied in, its address handle held: the WR."""
        ci = self._ci
        assert ci is not None
        slot = self._free.pop()
        off = slot * self._slot
        self._buf[off : off + MAD_SIZE] = item.mad
        addr = item.send.addr
        key: AvKey = (addr.dlid, addr.sl, addr.grh, addr.path_bits)
        try:
            h_av = self.avs.take(key, lambda: ci.create_av(
                self._h_pd, AvAttr(self._port_num, addr.dlid, addr.sl, addr.grh, 0,
                                   addr.path_bits)
            ))  # fmt: skip
        except BaseException:
            self._free.append(slot)
            raise
        self._owner[slot] = (item, key)
        item.on_wire += 1
        return SendWr(
            wr_id=slot,
            sg_list=[Sge(self._vaddr + off, MAD_SIZE, self._lkey)],
            ud=UdDest(h_av, addr.remote_qp, addr.remote_qkey, addr.pkey_index),
        )

    def _unprepare(self, slot: int, item: Outgoing) -> None:
        """Undo :meth:`_prepare` for a WR the provider did not take."""
        ci = self._ci
        assert ci is not None
        _item, key = self._owner.pop(slot)
        item.on_wire -= 1
        self._free.append(slot)
        for av in self.avs.release(key):
            ci.destroy_av(av)

    def _post_now(self, item: Outgoing) -> None:
        ci = self._ci
        assert ci is not None
        wr = self._prepare(item)
        try:
            ci.post_send(self._h_qp, [wr])
        except BaseException:
            self._unprepare(wr.wr_id, item)
            raise

    def disown(self, mine: Callable[[Any], bool]) -> None:
        """Sends of a going agent still complete, into nobody."""
        for slot, (item, av) in list(self._owner.items()):
            if item is not None and mine(item):
                self._owner[slot] = (None, av)

    def clear(self) -> list[Any]:
        """The QP is closing: forget every send; the address handles to destroy."""
        self._owner.clear()
        self._backlog.clear()
        return self.avs.clear()

    # ------------------------------------------------------------------ reaping
    def reap(self, deferred: Any = None) -> None:
        """Take the send CQ's completions on this thread (not under the lock), arming the
        CQ only while sends are still out; ``on_done`` for each send whose last copy
        left the wire."""
        ci = self._ci
        assert ci is not None
        while True:
            with self._lock:
                if not self._owner:
                    break  # nothing out: nothing to reap (an empty poll may cost a syscall)
                wcs = ci.poll_cq(self.h_cq, self.depth)
                if not wcs:
                    if self._armed:
                        break
                    ci.enable_cq_notify(self.h_cq, False)
                    self._armed = True
                    continue  # one more poll: a completion between the poll and the arm
            for wc in wcs:
                self._done(wc, deferred)

    def fired(self) -> None:
        """The armed CQ's upcall came: the arm is used up (caller holds the lock)."""
        self._armed = False

    def _done(self, wc: Wc, deferred: Any) -> None:
        slot = wc.wr_id
        with self._lock:
            owner = self._owner.pop(slot, None)
            self._free.append(slot)
            item = None if owner is None else owner[0]
            if item is not None:
                item.on_wire -= 1
            idle = self.avs.release(owner[1]) if owner is not None else []
            failed = self._post_backlog() if self._backlog else []
        self.destroy_avs(idle)
        self._on_done(item, wc.status, failed, deferred)

    def destroy_avs(self, avs: list[Any]) -> None:
        """Destroy address handles no send uses any more (not under the lock)."""
        ci = self._ci
        for h_av in avs:
            try:
                assert ci is not None
                ci.destroy_av(h_av)
            except IbError as exc:
                log.warning("ibal: destroy_av of an idle MAD address failed: %s", exc)
