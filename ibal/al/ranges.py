"""Value ranges of the numeric fields a consumer hands the access layer.

Each field has the width the wire or the verbs give it (IBA 9.2, 10.x,
``ib_types.h``).  The access layer checks them once, here, so every provider
sees only values it can encode: a provider that packs a key with ``struct``
would otherwise fail inside ``post_send`` (or worse, on a timer thread) and a
lenient one would truncate silently.  Each check returns a reason (``None``
when the object is fine) so the post verbs can stop at the first bad request.
"""

from __future__ import annotations

from typing import Any, Final, cast

from ibal.status import InvalidParameter
from ibal.types import AvAttr, Gid, Grh, PortAttrMod, QpMod, QpState

U8: Final = 0xFF
U16: Final = 0xFFFF
U24: Final = 0xFFFFFF
U32: Final = 0xFFFF_FFFF
U64: Final = 0xFFFF_FFFF_FFFF_FFFF

SEND_FIELDS: Final = (
    ("wr_id", U64),
    ("imm", U32),
    ("remote_addr", U64),
    ("rkey", U32),
    ("compare_add", U64),
    ("swap", U64),
    ("invalidate_rkey", U32),
)
UD_FIELDS: Final = (("remote_qp", U24), ("remote_qkey", U32), ("pkey_index", U16))
SGE_FIELDS: Final = (("addr", U64), ("length", U32), ("lkey", U32))
BIND_FIELDS: Final = (("addr", U64), ("length", U64), ("current_rkey", U32), ("wr_id", U64))
AV_FIELDS: Final = (("dlid", U16), ("sl", 15), ("static_rate", U8), ("path_bits", 0x7F))
GRH_FIELDS: Final = (
    ("sgid_index", U8),
    ("flow_label", 0xFFFFF),
    ("hop_limit", U8),
    ("traffic_class", U8),
)
# PortInfo's CapabilityMask (32 bits), InitTypeReply (8: IBA 14.2.5.6 keeps 4), a GUID.
PORT_MOD_FIELDS: Final = (("cap", U32), ("init_type", U8), ("system_image_guid", U64))
# port_num and pkey_index have their own statuses (InvalidPort, InvalidPkey), the
# depths theirs (InvalidSetting, InvalidMaxWrs): the qp module checks those.
QPMOD_FIELDS: Final = (
    ("qkey", U32),
    ("dest_qp", U24),
    ("rq_psn", U24),
    ("sq_psn", U24),
    ("rnr_nak_timeout", 31),
    ("local_ack_timeout", 31),
    ("retry_cnt", 7),
    ("rnr_retry_cnt", 7),
)


def out_of_range(obj: Any, fields: tuple[tuple[str, int], ...], what: str) -> str | None:
    """Why one of ``obj``'s ``fields`` is not an int in ``0..top`` (``None``: all are).

    ``bool`` passes as an int (it is one); ``None`` fields are checked by the caller.
    """
    for name, top in fields:
        v = getattr(obj, name)
        if type(v) is not int and not isinstance(v, int):
            return f"{what}.{name} must be an int, not {type(v).__name__}"
        if not 0 <= v <= top:
            return f"{what}.{name} {v} out of range 0..{top:#x}"
    return None


def send_problem(wr: Any) -> str | None:
    """A value of a well-typed ``SendWr`` that no CA can carry."""
    why = out_of_range(wr, SEND_FIELDS, "SendWr")
    if why is None and wr.ud is not None:
        why = out_of_range(wr.ud, UD_FIELDS, "UdDest")
    if why is None and wr.bind is not None:
        why = out_of_range(wr.bind, BIND_FIELDS, "BindWr")
    return why or sgl_problem(wr.sg_list)


def sgl_problem(sgl: Any) -> str | None:
    for g in sgl:
        why = out_of_range(g, SGE_FIELDS, "Sge")
        if why is not None:
            return why
    return None


def check_av(attr: AvAttr) -> None:
    """``InvalidParameter`` unless every field of ``attr`` fits its width."""
    why = out_of_range(attr, AV_FIELDS, "AvAttr")
    grh: Any = attr.grh
    if why is None and grh is not None:
        if not isinstance(grh, Grh):
            why = f"AvAttr.grh must be a Grh, not {type(grh).__name__}"
        elif not isinstance(dgid := cast(Any, grh.dgid), Gid):
            why = f"Grh.dgid must be a Gid (an IPv6Address), not {dgid!r:.40}"
        else:
            why = out_of_range(grh, GRH_FIELDS, "Grh")
    if why is not None:
        raise InvalidParameter(why)


def check_port_attr_mod(mod: object) -> None:
    """``InvalidParameter`` unless ``mod`` is a ``PortAttrMod`` whose fields fit their widths."""
    if not isinstance(mod, PortAttrMod):
        raise InvalidParameter(f"a PortAttrMod is required, not {type(mod).__name__}")
    why = out_of_range(mod, PORT_MOD_FIELDS, "PortAttrMod")
    if why is not None:
        raise InvalidParameter(why)


def check_qp_mod(mod: QpMod) -> None:
    """``InvalidParameter`` unless ``mod``'s states are states and its wire fields fit."""
    for name in ("state", "current_state"):
        v = getattr(mod, name)
        if not isinstance(v, QpState) and (v is not None or name == "state"):
            raise InvalidParameter(f"QpMod.{name} must be a QpState, not {v!r:.40}")
    for name in ("port_num", "pkey_index", "resp_res", "init_depth", "sq_depth", "rq_depth"):
        v = getattr(mod, name)
        if v is not None and not isinstance(v, int):
            raise InvalidParameter(f"QpMod.{name} must be an int, not {type(v).__name__}")
    for name, top in QPMOD_FIELDS:
        v = getattr(mod, name)
        if v is None:
            continue
        if not isinstance(v, int):
            raise InvalidParameter(f"QpMod.{name} must be an int, not {type(v).__name__}")
        if not 0 <= v <= top:
            raise InvalidParameter(f"QpMod.{name} {v} out of range 0..{top:#x}")
    for av in (mod.primary_av, mod.alternate_av):
        if av is not None:
            if not isinstance(av, AvAttr):
                raise InvalidParameter(f"a QpMod path must be an AvAttr, not {type(av).__name__}")
            check_av(av)


def check_timeout(timeout: object) -> float | None:
    """``timeout`` as seconds to wait (``None``: for ever); ``InvalidParameter`` otherwise."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout != timeout:
        raise InvalidParameter(f"a timeout is a number of seconds or None, not {timeout!r:.40}")
    if timeout < 0:
        raise InvalidParameter(f"a timeout cannot be negative ({timeout!r} s)")
    return float(timeout)
