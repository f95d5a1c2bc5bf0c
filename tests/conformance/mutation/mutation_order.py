"""pytest plugin for mutation runs: the chapters that move data and check memory first.

Every check still runs (a survivor is a mutant the whole suite misses); with ``-x`` a
kill ends the run sooner when the likeliest checks come first.
"""

from __future__ import annotations

import pytest

FIRST = (
    "data path",
    "error completions",
    "generated edges",
    "posting",
    "provider on its own (direct CI)",
    "provider contract (direct CI)",
    "MR",
    "CQ & notification",
)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        mark = item.get_closest_marker("ibal_chapter")
        chapter = mark.args[0] if mark is not None else ""
        return FIRST.index(chapter) if chapter in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: suite order within a rank
