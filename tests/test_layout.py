"""The package layout keeps its promises: ``ibal.types`` names, the access layer's interface."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import grimp

import ibal.al
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


# ----------------------------------------------------------------- the access layer

AL_DIR = Path(ibal.al.__file__).parent
IBAL_DIR = AL_DIR.parent
UPPER = ("mad", "sa", "cm", "dm", "tools", "testing")
"""The layers built on the access layer, which use only its exported names."""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _on_self(n: ast.Attribute) -> bool:
    return isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _defined_private(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, attributes set on
    ``self``/``cls``, module and class variables, ``__slots__`` entries."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(n.name)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and _on_self(n):
            out.add(n.attr)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.Assign) and isinstance(n.value, ast.Tuple | ast.List) and any(
            isinstance(t, ast.Name) and t.id == "__slots__" for t in n.targets
        ):
            out |= {e.value for e in n.value.elts if isinstance(e, ast.Constant)}
    return {name for name in out if isinstance(name, str) and _private(name)}


AL_TREES = {p.stem: _tree(p) for p in sorted(AL_DIR.glob("*.py"))}
AL_PRIVATE = {m: _defined_private(t) for m, t in AL_TREES.items()}
_AL_MODULES = {"ibal.al"} | {f"ibal.al.{m}" for m in AL_TREES}


def private_uses(tree: ast.Module, own: str | None = None) -> Iterator[tuple[int, str]]:
    """``obj._x`` (``obj`` not ``self``/``cls``) where ``_x`` belongs to an access-layer
    module other than ``own`` and not to the module itself; ``from ibal.al.m import _x``."""
    mine = AL_PRIVATE[own] if own is not None else _defined_private(tree)
    others = set().union(*(names for m, names in AL_PRIVATE.items() if m != own))
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and _private(n.attr) and not _on_self(n):
            if n.attr in others and n.attr not in mine:
                yield n.lineno, n.attr
        elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith("ibal.al"):
            yield from ((n.lineno, a.name) for a in n.names if _private(a.name))


def unexported_imports(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Names imported from ``ibal.al`` or its modules that ``ibal.al`` does not export."""
    exported = set(ibal.al.__all__)
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module in _AL_MODULES:
            yield from ((n.lineno, a.name) for a in n.names if a.name not in exported)


def _upper_files() -> Iterable[Path]:
    for pkg in UPPER:
        yield from sorted((IBAL_DIR / pkg).rglob("*.py"))


def al_private_use_count() -> int:
    return sum(len(list(private_uses(t, own=m))) for m, t in AL_TREES.items())


def al_cycle() -> set[str]:
    """The largest group of ``ibal.al`` modules that import one another in a cycle
    (function-local imports included, ``TYPE_CHECKING`` ones not)."""
    graph = grimp.build_graph("ibal", exclude_type_checking_imports=True, cache_dir=None)
    al = {m for m in graph.modules if m == "ibal.al" or m.startswith("ibal.al.")}
    best: set[str] = set()
    for m in al:
        group = {m} | {
            o for o in al - {m}
            if graph.chain_exists(importer=m, imported=o)
            and graph.chain_exists(importer=o, imported=m)
        }
        best = max(best, group, key=len)
    return best


def test_upper_layers_import_only_what_the_access_layer_exports() -> None:
    found = {f"{p.relative_to(IBAL_DIR)}:{line} {name}"
             for p in _upper_files() for line, name in unexported_imports(_tree(p))}
    assert found == set()


def test_upper_layers_use_no_private_member_of_the_access_layer() -> None:
    found = {f"{p.relative_to(IBAL_DIR)}:{line} {name}"
             for p in _upper_files() for line, name in private_uses(_tree(p))}
    assert found == set()


AL_PRIVATE_USES_CEILING = 30
"""Uses of another al module's private members inside ``ibal.al`` (172 at c68efa7, 68
before the manager, CQ, QP, SRQ, MR and PnP registration got named interfaces): the
rest are the object tree's own protocol (attach, activate, use, enter/leave, children,
refs, forced destroy); the number only goes down."""


def test_access_layer_modules_use_each_others_private_members_less() -> None:
    assert al_private_use_count() <= AL_PRIVATE_USES_CEILING


def test_access_layer_modules_import_one_another_without_a_cycle() -> None:
    # 7 modules (alias, fmr, mad_port, mr, pd, qp, qp_work) were in one at c68efa7
    assert len(al_cycle()) == 1


def test_every_access_layer_export_is_importable() -> None:
    for name in ibal.al.__all__:
        assert getattr(ibal.al, name) is not None, name


def test_the_counters_see_what_they_count() -> None:
    # A module that reaches into another's state and imports an unexported name is caught.
    probe = ast.parse("from ibal.al.obj import State\nfrom ibal.al.mr import _x\n"
                      "def f(pd, self):\n    return pd._cica, self._cica, pd.__class__\n")
    assert [n for _, n in unexported_imports(probe)] == ["State", "_x"]
    assert sorted(n for _, n in private_uses(probe)) == ["_cica", "_x"]
