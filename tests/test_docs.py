"""The generated docs pages match the tables they come from."""

import pytest

from ibal.docgen import DOCS, PAGES, SECTIONS


@pytest.mark.parametrize("name", sorted(PAGES))
def test_generated_page_is_current(name: str) -> None:
    expected = PAGES[name]()
    actual = (DOCS / name).read_text()
    assert actual == expected, f"docs/{name} is stale: run python -m ibal.docgen"


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_generated_section_is_current(name: str) -> None:
    actual = (DOCS / name).read_text()
    assert SECTIONS[name](actual) == actual, f"docs/{name} is stale: run python -m ibal.docgen"
