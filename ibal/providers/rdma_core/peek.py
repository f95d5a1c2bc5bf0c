"""The few libibverbs pointers and fds pyverbs 44 keeps to itself.

pyverbs wraps ``ibv_*`` objects in Cython classes and does not expose:

* the async-event fd of an ``ibv_context`` and the fd of an
  ``ibv_comp_channel``.  Both are needed because ``Context.get_async_event``
  and ``CompChannel.get_cq_event`` block in ``read()`` *while holding the
  GIL*; the provider waits for readability with ``selectors`` (which releases
  the GIL) and only then calls them;
* ``ibv_async_event.element`` (``AsyncEvent`` exposes only ``event_type``),
  without which an event cannot be routed to its QP, CQ or SRQ;
* the ``ibv_qp *`` needed to call ``ibv_attach_mcast``/``ibv_detach_mcast``,
  which pyverbs 44 does not wrap, through ctypes.

They are read from the Cython objects' C structs with :mod:`ctypes`.  Cython
lays a ``cdef class`` out as its base's struct followed by its own ``cdef``
fields in declaration order, so the first C field of a class deriving from
``PyverbsCM`` sits at ``PyverbsCM.__basicsize__``.  Every read is checked
before it is trusted: the slot next to the pointer must hold the
``id()`` of a Python object we know (the Context's name, the PD, ...), and
what the pointer points to must agree with what pyverbs reports (``cmd_fd``,
``qp_num``).  Only then is the pointer dereferenced.  When a check fails,
:class:`PeekError` is raised and the caller degrades (and says so).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from ibal.providers.rdma_core import abi

# Offsets in libibverbs' own structs (each struct's first field, the owning
# ibv_context, sits at 0 in all of them).
_CC_FD = abi.offset(abi.IbvCompChannel, "fd")
_QP_CONTEXT = abi.offset(abi.IbvQp, "qp_context")
_QP_NUM = abi.offset(abi.IbvQp, "qp_num")
_CQ_CONTEXT = abi.offset(abi.IbvCq, "cq_context")
_CMD_FD = abi.offset(abi.IbvContext, "cmd_fd")
_ASYNC_FD = abi.offset(abi.IbvContext, "async_fd")
_NCV = abi.offset(abi.IbvContext, "num_comp_vectors")
_SG_LIST = abi.offset(abi.IbvSendWr, "sg_list")
_MR_LKEY = abi.offset(abi.IbvMr, "lkey")
_MR_RKEY = abi.offset(abi.IbvMr, "rkey")
_MW_RKEY = abi.offset(abi.IbvMw, "rkey")
_MW_TYPE = abi.offset(abi.IbvMw, "type")
_WR_OPCODE = abi.offset(abi.IbvSendWr, "opcode")
_WR_BIND_RKEY = abi.offset(abi.IbvSendWr, "tail.bind_mw.rkey")

_U64 = ctypes.c_uint64
_I32 = ctypes.c_int32
_U32 = ctypes.c_uint32


class PeekError(RuntimeError):
    """A pyverbs object does not have the layout this module expects."""


def _slot(obj: object, offset: int) -> int:
    """The 8-byte slot at ``offset`` inside ``obj``'s C struct."""
    if offset < 0 or offset + 8 > type(obj).__basicsize__:
        raise PeekError(f"offset {offset} outside {type(obj).__name__}")
    return _U64.from_address(id(obj) + offset).value


def u64(address: int) -> int:
    return _U64.from_address(address).value


def u32(address: int) -> int:
    return _U32.from_address(address).value


def i32(address: int) -> int:
    return _I32.from_address(address).value


class Layout:
    """Offsets derived from the loaded pyverbs' base classes."""

    def __init__(self, pyverbs_base: Any) -> None:
        self.cm_base = int(pyverbs_base.PyverbsCM.__basicsize__)
        self.obj_base = int(pyverbs_base.PyverbsObject.__basicsize__)
        if self.cm_base % 8 or self.obj_base % 8:
            raise PeekError("unexpected pyverbs base class sizes")

    # ----------------------------------------------------------- ibv_context
    def context_ptr(self, ctx: Any) -> int:
        """``ibv_context *`` of a pyverbs ``Context`` (fields: context, device, name)."""
        if _slot(ctx, self.cm_base + 16) != id(ctx.name):
            raise PeekError("pyverbs Context layout: name slot not found")
        ptr = _slot(ctx, self.cm_base)
        if not ptr:
            raise PeekError("Context is closed")
        return ptr

    def async_fd(self, ctx: Any) -> int:
        """``ibv_context.async_fd``: the int after ``cmd_fd``, found by its value."""
        ptr = self.context_ptr(ctx)
        cmd_fd = int(ctx.cmd_fd)
        ncv = int(ctx.num_comp_vectors)
        # struct ibv_context { device; struct ibv_context_ops ops; int cmd_fd;
        # int async_fd; int num_comp_vectors; ... }: ops is a table of function
        # pointers whose size changed over the years, so look for the triple.
        for off in range(8, 8 + 8 * 96, 4):
            if i32(ptr + off) == cmd_fd and i32(ptr + off + _NCV - _CMD_FD) == ncv:
                fd = i32(ptr + off + _ASYNC_FD - _CMD_FD)
                if _is_uverbs_event_fd(fd):
                    return fd
        raise PeekError("ibv_context.async_fd not found")

    # ----------------------------------------------------- ibv_comp_channel
    def comp_channel_fd(self, channel: Any, ctx: Any) -> int:
        """``ibv_comp_channel.fd`` (fields: cc, context, cqs)."""
        if _slot(channel, self.cm_base + 8) != id(ctx):
            raise PeekError("pyverbs CompChannel layout: context slot not found")
        cc = _slot(channel, self.cm_base)
        if not cc or u64(cc) != self.context_ptr(ctx):
            raise PeekError("ibv_comp_channel does not belong to this context")
        fd = i32(cc + _CC_FD)
        if not _is_uverbs_event_fd(fd):
            raise PeekError(f"fd {fd} is not a uverbs event fd")
        return fd

    # ---------------------------------------------------------------- ibv_qp
    def qp_ptr(self, qp: Any, pd: Any, ctx: Any) -> int:
        """``ibv_qp *`` of a pyverbs ``QP`` (fields: qp, int type, int state, pd, ...)."""
        if _slot(qp, self.cm_base + 16) != id(pd):
            raise PeekError("pyverbs QP layout: pd slot not found")
        ptr = _slot(qp, self.cm_base)
        if not ptr or u64(ptr) != self.context_ptr(ctx) or qp_num_of(ptr) != int(qp.qp_num):
            raise PeekError("ibv_qp does not match the QP")
        return ptr

    # --------------------------------------------------------------- ibv_srq
    def srq_ptr(self, srq: Any, ctx: Any) -> int:
        """``ibv_srq *`` of a pyverbs ``SRQ`` (fields: srq, cq, qps)."""
        ptr = _slot(srq, self.cm_base)
        if not ptr or u64(ptr) != self.context_ptr(ctx):
            raise PeekError("ibv_srq does not match the context")
        return ptr

    # --------------------------------------------------------------- ibv_ah
    def ah_ptr(self, ah: Any, pd: Any, ctx: Any) -> int:
        """``ibv_ah *`` of a pyverbs ``AH`` (fields: ah, pd)."""
        if _slot(ah, self.cm_base + 8) != id(pd):
            raise PeekError("pyverbs AH layout: pd slot not found")
        ptr = _slot(ah, self.cm_base)
        if not ptr or u64(ptr) != self.context_ptr(ctx):
            raise PeekError("ibv_ah does not match the context")
        return ptr

    # --------------------------------------------------------------- ibv_cq
    def cq_ptr(self, cq: Any, ctx: Any) -> int:
        """``ibv_cq *`` of a pyverbs ``CQ`` (fields: cq, context, ...)."""
        if _slot(cq, self.cm_base + 8) != id(ctx):
            raise PeekError("pyverbs CQ layout: context slot not found")
        ptr = _slot(cq, self.cm_base)
        if not ptr or u64(ptr) != self.context_ptr(ctx):
            raise PeekError("ibv_cq does not match the context")
        return ptr

    # ---------------------------------------------------------- ibv_mr, ibv_mw
    def mr_ptr(self, mr: Any, ctx: Any) -> int:
        """``ibv_mr *`` of a pyverbs ``MR`` (fields: pd, [cmid,] mr): the slot whose
        ``ibv_mr`` has this context and the MR's keys; every slot tried holds a
        pointer (a Python object's or the ``ibv_mr``'s), so reading through it is safe."""
        ctxp = self.context_ptr(ctx)
        lkey, rkey = int(mr.lkey), int(mr.rkey)
        for k in (1, 2):
            ptr = _slot(mr, self.cm_base + 8 * k)
            if (ptr and u64(ptr) == ctxp
                    and u32(ptr + _MR_LKEY) == lkey and u32(ptr + _MR_RKEY) == rkey):  # fmt: skip
                return ptr
        raise PeekError("ibv_mr not found in the pyverbs MR")

    def mw_ptr(self, mw: Any, pd: Any, ctx: Any) -> int:
        """``ibv_mw *`` of a pyverbs ``MW`` (fields: pd, mw)."""
        if _slot(mw, self.cm_base) != id(pd):
            raise PeekError("pyverbs MW layout: pd slot not found")
        ptr = _slot(mw, self.cm_base + 8)
        if (not ptr or u64(ptr) != self.context_ptr(ctx) or u32(ptr + _MW_RKEY) != int(mw.rkey)
                or u32(ptr + _MW_TYPE) != int(mw.type)):  # fmt: skip
            raise PeekError("ibv_mw does not match the MW")
        return ptr

    def set_mw_rkey(self, mw_ptr: int, rkey: int) -> None:
        """Store ``ibv_mw.rkey``: the key verbs' BIND_MW names as the window's current one.

        Posting a type 2 bind does not update it (only ``ibv_bind_mw`` does, for
        type 1), and kernel rxe refuses a bind whose ``ibv_mw.rkey`` is not the
        window's current key, so a second bind would fail without this.
        """
        _U32.from_address(mw_ptr + _MW_RKEY).value = rkey

    def set_bind_rkey(self, wr: Any, rkey: int) -> None:
        """Store ``bind_mw.rkey`` of a pyverbs ``SendWR`` (read-only in pyverbs 44),
        whose ``ibv_send_wr`` is its first C field; checked through its getters."""
        base = id(wr) + self.cm_base
        if (type(wr).__basicsize__ < self.cm_base + ctypes.sizeof(abi.IbvSendWr)
                or u64(base) != int(wr.wr_id)
                or u32(base + _WR_OPCODE) != int(wr.opcode)):  # fmt: skip
            raise PeekError("pyverbs SendWR layout: ibv_send_wr not found")
        _U32.from_address(base + _WR_BIND_RKEY).value = rkey
        if int(wr.rkey) != rkey:
            raise PeekError("pyverbs SendWR layout: bind_mw.rkey not where expected")

    # ------------------------------------------------------ ibv_async_event
    def check_async_event(self, event_cls: Any) -> None:
        """Check that ``AsyncEvent`` holds ``{element, event_type}`` where expected."""
        probe = event_cls(0x5A5A)
        if i32(id(probe) + self.obj_base + 8) != 0x5A5A:
            raise PeekError("pyverbs AsyncEvent layout not recognised")

    def event_element(self, event: Any) -> int:
        """``ibv_async_event.element`` as an integer (pointer or port number)."""
        return u64(id(event) + self.obj_base)

    # --------------------------------------------------------- SendWR / SGE
    def sge_struct_ptr(self, sge: Any) -> int:
        """``ibv_sge *`` owned by a pyverbs ``SGE``."""
        return _slot(sge, self.cm_base)

    def adopt_sge(self, wr: Any, sge: Any) -> int | None:
        """Point ``wr``'s scatter list at ``sge``'s struct and return the old list.

        ``SendWR(num_sge=0)`` mallocs a scatter array that ``wr.sg_list = sge``
        then orphans; the caller frees the returned pointer with ``free()``.
        None when the layout could not be confirmed (the array then leaks).
        """
        wr_off = self.cm_base  # struct ibv_send_wr send_wr: wr_id, next, sg_list, ...
        marker = 0x1BA1_5EED_0000_0001
        wr.wr_id = marker
        if _slot(wr, wr_off) != marker:
            wr.sg_list = sge
            return None
        old = _slot(wr, wr_off + _SG_LIST)
        wr.sg_list = sge
        wr.wr_id = 0
        if _slot(wr, wr_off + _SG_LIST) != self.sge_struct_ptr(sge):
            return None
        return old


def _is_uverbs_event_fd(fd: int) -> bool:
    if fd < 0:
        return False
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:[infinibandevent]"
    except OSError:
        return False


def qp_context_of(qp_ptr: int) -> int:
    """``ibv_qp.qp_context`` (pyverbs stores the ``id()`` of the object passed)."""
    return u64(qp_ptr + _QP_CONTEXT)


def qp_num_of(qp_ptr: int) -> int:
    return u32(qp_ptr + _QP_NUM)


def cq_context_of(cq_ptr: int) -> int:
    """``ibv_cq.cq_context`` (pyverbs stores the ``id()`` of the object passed)."""
    return u64(cq_ptr + _CQ_CONTEXT)


_libc: ctypes.CDLL | None = None


def libc_free(ptr: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None)
        _libc.free.argtypes = [ctypes.c_void_p]
        _libc.free.restype = None
    _libc.free(ctypes.c_void_p(ptr))


class Multicast:
    """``ibv_attach_mcast``/``ibv_detach_mcast`` through ctypes."""

    def __init__(self) -> None:
        lib = ctypes.CDLL("libibverbs.so.1", use_errno=True)
        self._attach = lib.ibv_attach_mcast
        self._detach = lib.ibv_detach_mcast
        for f in (self._attach, self._detach):
            f.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_uint16]
            f.restype = ctypes.c_int

    def attach(self, qp_ptr: int, gid: bytes, lid: int) -> int:
        """0 or an errno."""
        rc = self._attach(ctypes.c_void_p(qp_ptr), gid, lid)
        return 0 if rc == 0 else (rc if rc > 0 else ctypes.get_errno())

    def detach(self, qp_ptr: int, gid: bytes, lid: int) -> int:
        rc = self._detach(ctypes.c_void_p(qp_ptr), gid, lid)
        return 0 if rc == 0 else (rc if rc > 0 else ctypes.get_errno())
