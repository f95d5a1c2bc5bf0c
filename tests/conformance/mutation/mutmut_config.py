"""mutmut's hook for ``run.py``: mutate only the selected functions, run the suite
against the provider that owns the mutated file.

mutmut imports this module by name (``run.py`` puts this directory on the path).
Lines that only raise with a message are left alone (a changed message is an
equivalent mutant); strings and f-strings are switched off on the command line.
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]

CI_SELECTION: dict[str, tuple[str, ...]] = {
    # the sample's memory translation table: the key and range check of every access
    "tests/sample_provider/ibal_sample_provider/memory.py": ("KeyTable.translate",),
    # the mock's counted CQ arming verb
    "ibal/providers/mock/cq_verbs.py": ("CqVerbs.enable_ncomp_cq_notify",),
}
"""File -> the functions (``Class.method``) whose lines are mutated in CI (a few minutes)."""

WIDE_SELECTION: dict[str, tuple[str, ...]] = {
    "tests/sample_provider/ibal_sample_provider/memory.py": (
        "KeyTable.add",
        "KeyTable.translate",
    ),
    "ibal/providers/mock/cq_verbs.py": (
        "CqVerbs.enable_cq_notify",
        "CqVerbs.enable_ncomp_cq_notify",
    ),
}
"""``run.py --wide``: more of the same files (about three times the mutants and the time)."""

SELECTION = WIDE_SELECTION if os.environ.get("IBAL_MUTATION_WIDE") else CI_SELECTION

PROVIDER = {
    "tests/sample_provider/ibal_sample_provider/": "sample",
    "ibal/providers/mock/": "mock",
}


def command(provider: str) -> str:
    """The suite against ``provider``, stopping at the first failure."""
    return (
        "python3 -m pytest -x -q -p no:cacheprovider -p mutation_order "
        f"--ibal-provider {provider}"
    )


@functools.cache
def _lines(rel: str) -> frozenset[int]:
    """1-based line numbers of the selected functions' bodies (docstrings and raises out)."""
    tree = ast.parse((ROOT / rel).read_text())
    wanted = set(SELECTION.get(rel, ()))
    out: set[int] = set()

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef) and f"{prefix}{child.name}" in wanted:
                for stmt in ast.walk(child):
                    if isinstance(stmt, ast.stmt) and not isinstance(
                        stmt, (ast.FunctionDef, ast.Raise, ast.Expr)
                    ):
                        out.add(stmt.lineno)
                out.discard(child.lineno)

    visit(tree, "")
    return frozenset(out)


def relative(filename: str) -> str:
    path = Path(filename)
    return str(path.resolve().relative_to(ROOT)) if path.is_absolute() else str(path)


def pre_mutation(context: Any) -> None:
    rel = relative(context.filename)
    if context.current_line_index + 1 not in _lines(rel):
        context.skip = True
        return
    for prefix, provider in PROVIDER.items():
        if rel.startswith(prefix):
            context.config.test_command = command(provider)
            return
    context.skip = True
