"""The ctypes structures of ``abi.py`` against the installed ``<infiniband/verbs.h>``.

A small C program compiled with the system compiler prints ``sizeof`` and
``offsetof`` of every field the provider declares; ctypes must agree.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from ibal.providers.rdma_core import abi, fastpath

HEADER = Path("/usr/include/infiniband/verbs.h")

# ctypes class -> (C struct, whether ctypes declares all of it: then sizeof must match too)
STRUCTS: dict[type[ctypes.Structure], tuple[str, bool]] = {
    abi.IbvSge: ("ibv_sge", True),
    abi.IbvSendWr: ("ibv_send_wr", True),
    abi.IbvRecvWr: ("ibv_recv_wr", True),
    abi.IbvWc: ("ibv_wc", True),
    abi.IbvContextOps: ("ibv_context_ops", True),
    abi.IbvCompChannel: ("ibv_comp_channel", True),
    abi.IbvContext: ("ibv_context", False),
    abi.IbvCq: ("ibv_cq", False),
    abi.IbvQp: ("ibv_qp", False),
    abi.IbvMr: ("ibv_mr", True),
    abi.IbvMw: ("ibv_mw", True),
}
ANONYMOUS = {"tail"}  # ctypes names for the header's anonymous unions


def _paths(cls: type, prefix: str = "") -> list[str]:
    out = []
    for f in cls._fields_:  # type: ignore[attr-defined]
        name, ctype = f[0], f[1]
        path = f"{prefix}{name}"
        out.append(path)
        if issubclass(ctype, (ctypes.Structure, ctypes.Union)):
            out += _paths(ctype, path + ".")
    return out


def _c_member(path: str) -> str:
    return ".".join(p for p in path.split(".") if p not in ANONYMOUS) or path


def _checks() -> list[tuple[str, str, int]]:
    """``(label, C expression, ctypes value)`` for every size and offset."""
    rows = []
    for cls, (cname, whole) in STRUCTS.items():
        if whole:
            rows.append((f"sizeof {cname}", f"sizeof(struct {cname})", ctypes.sizeof(cls)))
        for path in _paths(cls):
            if path in ANONYMOUS:
                first = _c_member(_paths(dict(cls._fields_)[path])[0])
                c_expr = f"offsetof(struct {cname}, {first})"
            else:
                c_expr = f"offsetof(struct {cname}, {_c_member(path)})"
            rows.append((f"{cname}.{path}", c_expr, abi.offset(cls, path)))
    return rows


@pytest.fixture(scope="module")
def from_c(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    if not HEADER.exists():
        pytest.skip("needs libibverbs-dev (/usr/include/infiniband/verbs.h)")
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("needs gcc")
    d = tmp_path_factory.mktemp("abi")
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <infiniband/verbs.h>",
             "int main(void) {"]  # fmt: skip
    for label, expr, _ in _checks():
        lines.append(f'    printf("%s %zu\\n", "{label}", (size_t)({expr}));')
    lines += ["    return 0;", "}"]
    (d / "abi.c").write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-o", str(d / "abi"), str(d / "abi.c")], check=True, capture_output=True)
    out = subprocess.run([str(d / "abi")], check=True, capture_output=True, text=True).stdout
    return {label: int(value) for label, value in (ln.rsplit(" ", 1) for ln in out.splitlines())}


def test_every_declared_size_and_offset_matches_the_header(from_c: dict[str, int]) -> None:
    checks = _checks()
    assert len(checks) > 100 and len(from_c) == len(checks)
    wrong = {label: (ours, from_c[label]) for label, _, ours in checks if from_c[label] != ours}
    assert wrong == {}, "ctypes vs C (ours, header)"


def test_the_fast_path_formats_come_from_the_structures(from_c: dict[str, int]) -> None:
    assert from_c["sizeof ibv_send_wr"] == fastpath.SEND_WR_SIZE
    assert fastpath.WC_SIZE == fastpath._WC.size == from_c["sizeof ibv_wc"]
    rdma = fastpath._S1[fastpath.K_RDMA]
    # the single-SGE RDMA slot ends with the SGE that follows the ibv_send_wr
    assert rdma.size == from_c["sizeof ibv_send_wr"] + from_c["sizeof ibv_sge"]
    ud = fastpath._S0[fastpath.K_UD]
    assert ud.size == from_c["ibv_send_wr.wr.ud.remote_qkey"] + 4
