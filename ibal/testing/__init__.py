"""The provider conformance suite, shipped in the wheel.

* ``pytest --ibal-provider NAME`` (the ``ibal`` pytest plugin) runs every check
  against provider ``NAME``;
* ``class TestMine(ProviderConformance): provider_name = "mine"`` runs them
  from a provider's own test suite;
* :func:`run_conformance` runs them in-process for tools (``ibal conformance``).

Names are imported lazily: the pytest plugin loads with every pytest run and
must not pull in the access layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ibal.testing.runner import ChapterResult, Reporter, RunResult, run_conformance
    from ibal.testing.suite import CHAPTERS, ProviderConformance

__all__ = [
    "CHAPTERS",
    "ChapterResult",
    "ProviderConformance",
    "Reporter",
    "RunResult",
    "run_conformance",
]

_WHERE = {
    "CHAPTERS": "ibal.testing.suite",
    "ProviderConformance": "ibal.testing.suite",
    "ChapterResult": "ibal.testing.runner",
    "Reporter": "ibal.testing.runner",
    "RunResult": "ibal.testing.runner",
    "run_conformance": "ibal.testing.runner",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ibal.testing' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
