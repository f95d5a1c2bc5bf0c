"""The package layout keeps its promises: ``ibal.types`` names, the access layer's interface."""

from __future__ import annotations

import importlib
import pkgutil

import ibal.types

# Every public name ``ibal/types.py`` had before it became a package (c68efa7).
TYPES_NAMES = frozenset({
    "ALL_ACCESS", "AccessFlags", "AlFlags", "ApmState", "AsyncEvent", "AsyncEventRec",
    "AtomicCap", "AvAttr", "BASE_WR_TYPES", "BindWr", "CA_MOD_TO_PORT_CAP", "CA_MOD_VALID",
    "CaAttr", "CaMod", "CiOp", "DEFAULT_PKEY", "DgrmInfo", "EventRecord", "EventSource",
    "FmrCreate", "Gid", "GidEntry", "GidType", "Grh", "IB_ANY_INDEX", "INVALIDATE_WR_TYPES",
    "IOC_ID_STRING_SIZE", "IocInfo", "IocProfile", "IouInfo", "LinkLayer", "LinkState",
    "MAD_HEADER_SIZE", "MAD_SIZE", "MAD_STATUS_BAD_VERSION", "MAD_STATUS_UNSUPPORTED_METHOD",
    "MAD_STATUS_UNSUPPORTED_METHOD_ATTR", "MAX_SVC_ENTRIES", "MIN_VERBS_VERSION",
    "MULTICAST_LID_BASE", "MadAddr", "MadAgentSpec", "MadRecv", "MadRecvCallback", "MadSend",
    "MadSendCallback", "MadSendDone", "MrAttr", "MrKeys", "MrModMask", "Mtu", "NODE_DESC_SIZE",
    "NetworkHeader", "NodeType", "OPENIB_OUI", "PERMISSIVE_LID", "PdType", "PhysCreate",
    "PortAttr", "PortAttrMod", "PortCap", "QP1_WELL_KNOWN_QKEY", "QPMOD_ATTRS", "QpAttr",
    "QpCaps", "QpMod", "QpState", "QpType", "RecvOpt", "RecvWr", "SVC_NAME_SIZE", "SendOpt",
    "SendWr", "Sge", "SrqAttr", "SrqAttrMask", "SvcEntry", "UdDest", "VENDOR_OUI",
    "VENDOR_RANGE2_FIRST", "VENDOR_RANGE2_LAST", "VERBS_VERSION", "WC_TYPE_FOR_WR", "Wc",
    "WcStatus", "WcType", "WrType", "ZERO_GID", "is_int", "mad_error_reply", "mad_is_response",
    "mad_vendor_oui",
})


def _concept_modules() -> dict[str, object]:
    return {
        info.name: importlib.import_module(f"ibal.types.{info.name}")
        for info in pkgutil.iter_modules(ibal.types.__path__)
    }


def test_types_exports_the_names_it_had() -> None:
    assert set(ibal.types.__all__) == TYPES_NAMES
    namespace: dict[str, object] = {}
    exec("from ibal.types import *", namespace)  # what a star import hands over
    assert set(namespace) - {"__builtins__"} == TYPES_NAMES


def test_each_types_name_lives_in_a_concept_module() -> None:
    modules = _concept_modules()
    assert {"address", "ca", "mad", "memory", "qp", "work"} <= set(modules)
    for name in TYPES_NAMES:
        value = getattr(ibal.types, name)
        homes = [m for m, mod in modules.items() if getattr(mod, name, None) is value]
        assert homes, name
        home = getattr(value, "__module__", None)
        if callable(value) and home is not None and home.startswith("ibal."):
            # classes and functions: defined in a concept module, re-exported from there
            assert home.removeprefix("ibal.types.") in homes, (name, home)
