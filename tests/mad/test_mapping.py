"""The IBMF and libibmad mapping tables say only what the code holds."""

from __future__ import annotations

import pytest

from ibal.mad.mapping import IBMF_MAPPING, LIBIBMAD_MAPPING, Row, resolve

ROWS = [(t, row) for t, rows in (("ibmf", IBMF_MAPPING), ("libibmad", LIBIBMAD_MAPPING))
        for row in rows]  # fmt: skip


@pytest.mark.parametrize(("table", "row"), ROWS, ids=[f"{t}:{r[0]}" for t, r in ROWS])
def test_row_status_and_target_agree(table: str, row: Row) -> None:
    name, target, status, _note = row
    if status == "done":
        resolve(target)  # LookupError names the missing part
    elif status.startswith("planned: ibal."):
        assert target, f"{name}: a planned row names the spelling it is expected to get"
    else:
        assert status.startswith("not applicable: ") and len(status) > 20, name
        assert not target, f"{name}: not applicable, yet it names {target}"


def test_rpc_rows_are_done() -> None:
    """ibal.mad.rpc (the tools' MAD client) has landed: its rows say done (and resolve above)."""
    rpc = [(name, status) for name, target, status, _ in IBMF_MAPPING + LIBIBMAD_MAPPING
           if target.startswith("ibal.mad.rpc.")]  # fmt: skip
    assert len(rpc) >= 13
    assert all(status == "done" for _, status in rpc), rpc


def test_every_call_of_the_seeds_is_listed() -> None:
    ibmf = {r[0].split(" ")[0] for r in IBMF_MAPPING}
    assert {
        "ibmf_register", "ibmf_unregister", "ibmf_setup_async_cb", "ibmf_tear_down_async_cb",
        "ibmf_msg_transport", "ibmf_alloc_msg", "ibmf_free_msg", "ibmf_alloc_qp",
        "ibmf_query_qp", "ibmf_modify_qp", "ibmf_free_qp",
    } <= ibmf  # fmt: skip
    libibmad = [r[0] for r in LIBIBMAD_MAPPING]
    assert len(libibmad) == len(set(libibmad))
    # the 53 functions of seed 004's catalogue, plus its typedef and ibdebug
    functions = [n for n in libibmad if not n.endswith("_t") and n != "ib_mad_f"]
    assert len(functions) == 55


def test_resolve_reports_the_missing_part() -> None:
    assert resolve("ibal.wire.mad.header.build").__name__ == "build"  # type: ignore[attr-defined]
    # the package's export, not its submodule of the same name (which it must not import)
    assert callable(resolve("ibal.mad.transact"))
    from ibal.mad import transact

    assert callable(transact)


def test_transact_is_the_function_after_its_module_loads() -> None:
    """Importing the submodule must not shadow the package's ``transact`` export."""
    import ibal.mad.transaction  # noqa: F401
    from ibal.mad import transact

    assert callable(transact)
    assert transact.__module__ == "ibal.mad.transaction"
    assert resolve("ibal.mad.pool.MadElement.mad").name == "mad"  # type: ignore[attr-defined]
    with pytest.raises(LookupError, match="'nope'"):
        resolve("ibal.wire.mad.header.nope")
    with pytest.raises(LookupError, match="'no_such_module'"):
        resolve("ibal.mad.no_such_module.thing")
