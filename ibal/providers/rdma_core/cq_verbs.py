"""Completion queue verbs of an rdma_core CA: create, resize, poll, notify, destroy.

Each CQ has its own completion channel, watched by the CA's event thread
(:mod:`.events`); completions the provider makes itself (sends flushed before
they reached the device) wait in :attr:`Cq.pending` and are polled after the
device's.  Called by the access layer on any thread; raises :mod:`ibal.status`
exceptions.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
from typing import Any

from ibal.ci.interface import (
    CqCreated,
    Handle,
)
from ibal.providers.rdma_core import peek
from ibal.providers.rdma_core.errors import translate
from ibal.providers.rdma_core.fastpath import (
    FastPoller,
    wc_tuples_from_pyverbs,
)
from ibal.providers.rdma_core.handles import (
    Cq,
)
from ibal.providers.rdma_core.nethdr import classify
from ibal.providers.rdma_core.state import CaState
from ibal.providers.rdma_core.wr import (
    convert_wcs,
)
from ibal.status import (
    InvalidCaHandle,
    InvalidCqHandle,
    InvalidCqSize,
    Overflow,
    ResourceBusy,
    Unsupported,
)
from ibal.types import (
    LinkLayer,
    NetworkHeader,
    RecvOpt,
    Wc,
    WcStatus,
    WcType,
)

log = logging.getLogger("ibal.providers.rdma_core")


class CqVerbs(CaState):
    """``create_cq`` ... ``destroy_cq``, ``poll_cq``, ``enable_cq_notify``."""

    def create_cq(self, h_ca: Handle, size: int, cq_context: Any) -> CqCreated:
        self._ca(h_ca)
        if not isinstance(size, int) or size < 1 or size > int(self.dev.max_cqe):
            raise InvalidCqSize(f"CQ size {size} outside 1..{int(self.dev.max_cqe)}")
        loop = self._loop
        if loop is None:
            raise InvalidCaHandle("CA is not open")
        with self._lock:
            cq = Cq(self, cq_context)
            pvc = self.pv.cq
            try:
                channel = pvc.CompChannel(self.ctx)
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_create_comp_channel") from exc
            try:
                fd = self._channel_fd(channel)
                pv = pvc.CQ(self.ctx, size, cq, channel, 0)
            except BaseException as exc:
                channel.close()
                if isinstance(exc, self._errs.PyverbsError):
                    raise translate(exc, "ibv_create_cq", {errno.EINVAL: InvalidCqSize}) from exc
                raise
            cq.pv, cq.channel, cq.fd, cq.size = pv, channel, fd, int(pv.cqe)
            if self.ops is not None and self.layout is not None:
                try:
                    cq.poller = FastPoller(self.ops, self.layout.cq_ptr(pv, self.ctx))
                except peek.PeekError as exc:
                    log.debug("rdma_core %s: CQ pointer not found: %s", self.name, exc)
            self._cqs[id(cq)] = cq
            self._n["cq"] += 1

            def read_event() -> None:
                channel.get_cq_event(pv)
                pv.ack_events(1)

            def upcall() -> None:
                cq.armed = False
                h = self._open
                if h is not None:
                    h.completion_cb(cq_context)

            loop.add_channel(fd, cq, read_event, upcall)
            return CqCreated(cq, cq.size)

    def _channel_fd(self, channel: Any) -> int:
        if self.layout is None:
            raise Unsupported("completion channel fd not reachable in this pyverbs")
        try:
            return self.layout.comp_channel_fd(channel, self.ctx)
        except peek.PeekError as exc:
            raise Unsupported(f"completion channel fd not reachable: {exc}") from exc

    def resize_cq(self, h_cq: Handle, size: int) -> int:
        cq = self._cq(h_cq)
        if not isinstance(size, int) or size < 1 or size > int(self.dev.max_cqe):
            raise InvalidCqSize(f"CQ size {size} outside 1..{int(self.dev.max_cqe)}")
        with cq.lock:
            try:
                cq.pv.resize(size)
            except self._errs.PyverbsError as exc:
                # rxe (and mlx5) refuse a size below the queued entries with EINVAL;
                # the size itself was checked above.
                raise translate(exc, "ibv_resize_cq", {errno.EINVAL: Overflow}) from exc
            cq.size = int(cq.pv.cqe)
            return cq.size

    def query_cq(self, h_cq: Handle) -> int:
        return self._cq(h_cq).size

    def destroy_cq(self, h_cq: Handle) -> None:
        cq = self._cq(h_cq)
        with self._lock:
            if cq.users:
                raise ResourceBusy(f"CQ still used by {cq.users} QPs")

            def destroy() -> None:
                with cq.lock:
                    cq.pv.close()
                    cq.channel.close()

            self._retire(cq, destroy, "ibv_destroy_cq", cq.fd)
            del self._cqs[id(cq)]
            self._n["cq"] -= 1
            for tokens in cq.orphans:
                self.tokens.purge(tokens)
            cq.orphans.clear()

    def poll_cq(self, h_cq: Handle, max_entries: int) -> list[Wc]:
        cq = h_cq
        if cq.__class__ is not Cq or cq.ci is not self or not cq.alive:
            raise InvalidCqHandle("invalid or destroyed CQ")
        if max_entries < 1:
            return []
        with cq.lock:
            if not cq.alive:
                raise InvalidCqHandle("invalid or destroyed CQ")
            poller = cq.poller
            try:
                if poller is not None:
                    got = poller.poll(max_entries)
                else:
                    n, wcs = cq.pv.poll(max_entries)
                    got = wc_tuples_from_pyverbs(wcs) if n else ()
            except (OSError, self._errs.PyverbsError) as exc:
                raise translate(exc, "ibv_poll_cq") from exc
            out = convert_wcs(
                got, self.tokens, self._ud_qpns, cq.wc_cache, self._sq_accts, self._errored,
                self.quirks.wc_with_inv,
            )
            if cq.pending and len(out) < max_entries:  # after the device's: they came later
                take = cq.pending[: max_entries - len(out)]
                del cq.pending[: len(take)]
                out += convert_wcs(
                    take, self.tokens, self._ud_qpns, None, self._sq_accts, self._errored,
                    self.quirks.wc_with_inv,
                )
            return self._headers(out) if self._ud_qpns else out

    def _headers(self, wcs: list[Wc]) -> list[Wc]:
        """Fill ``network_header`` of UD receives that carry a GRH area (see nethdr)."""
        ud = self._ud_qpns
        for j, wc in enumerate(wcs):
            if wc.wc_type is not WcType.RECV or wc.qp_num not in ud:
                continue
            qp = self._qps.get(wc.qp_num)
            if qp is None:
                continue
            area = self._areas.completed(qp.num, wc.wr_id) if qp.srq is None else None
            if wc.status is not WcStatus.SUCCESS or not wc.recv_opt & RecvOpt.GRH_VALID:
                continue
            port = self._ports.get(qp.port_num)
            if port is None:
                continue
            if port.link_layer is LinkLayer.INFINIBAND:
                hdr = NetworkHeader.IB_GRH
            elif area is None:
                continue
            else:
                found = classify(area, port.v2_gids, bool(port.v2_gids))
                if found is None:
                    continue
                hdr = found
            wcs[j] = dataclasses.replace(wc, network_header=hdr)
        return wcs

    def enable_cq_notify(self, h_cq: Handle, solicited: bool) -> None:
        cq = self._cq(h_cq)
        with cq.lock:
            try:
                cq.pv.req_notify(bool(solicited))
            except self._errs.PyverbsError as exc:
                raise translate(exc, "ibv_req_notify_cq") from exc
            cq.armed = True
