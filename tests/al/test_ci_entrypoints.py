"""The entry-point reader of the provider manager against importlib.metadata."""

from __future__ import annotations

import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from ibal.ci import entrypoints


def _pairs(eps: list[entrypoints.EntryPoint]) -> list[tuple[str, str]]:
    return [(e.name, e.value) for e in eps]


@pytest.mark.parametrize("group", ["ibal.providers", "console_scripts", "pytest11"])
def test_the_fast_read_is_importlib_metadatas_answer_on_this_install(group: str) -> None:
    fast = entrypoints._scan(group)
    assert fast is not None, "this install has only directories on sys.path"
    assert _pairs(fast) == _pairs(list(metadata.entry_points(group=group)))
    if group == "ibal.providers":
        assert {"mock", "rdma_core", "rxe"} <= {e.name for e in fast}


def _dist(root: Path, dirname: str, text: str | None) -> None:
    d = root / dirname
    d.mkdir()
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dirname.split('-')[0]}\n")
    if text is not None:
        (d / "entry_points.txt").write_text(text)


def test_first_distribution_on_the_path_wins_and_sections_are_read_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "ep_target.py").write_text("class Holder:\n    class Inner:\n        VALUE = 42\n")
    _dist(a, "Acme_Pkg-1.0.dist-info",
          "# a comment\n[other]\nx = nope\n\n[grp]\none = ep_target:Holder.Inner\n"
          "two = ep_target [extra]\n")  # fmt: skip
    _dist(b, "acme.pkg-2.0.dist-info", "[grp]\nshadowed = ep_target\n")  # same name: a's wins
    _dist(b, "other-0.1.dist-info", "[grp]\nthree = ep_target:Holder\n")
    _dist(b, "noeps-1.0.dist-info", None)
    (b / "old.egg-info").write_text("Metadata-Version: 1.0\nName: old\n")  # a file
    monkeypatch.setattr(sys, "path", [str(a), str(tmp_path / "missing"), str(b)])
    fast = entrypoints._scan("grp")
    assert fast is not None
    assert _pairs(fast) == _pairs(list(metadata.entry_points(group="grp")))
    assert sorted(_pairs(fast)) == [
        ("one", "ep_target:Holder.Inner"), ("three", "ep_target:Holder"),
        ("two", "ep_target [extra]"),
    ]  # fmt: skip
    by = {e.name: e for e in fast}
    try:
        assert by["one"].load().VALUE == 42
        assert by["two"].load().__name__ == "ep_target"
    finally:
        sys.modules.pop("ep_target", None)


def test_a_zip_on_the_path_or_another_finder_falls_back_to_importlib_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    z = tmp_path / "lib.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("zipped-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipped\n")
        f.writestr("zipped-1.0.dist-info/entry_points.txt", "[grp]\nz = zmod\n")
    monkeypatch.setattr(sys, "path", [str(z)])
    assert entrypoints._scan("grp") is None
    assert _pairs(entrypoints.group("grp")) == [("z", "zmod")]

    class Finder:
        @staticmethod
        def find_distributions(*args: object, **kw: object) -> list[object]:
            return []

    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    monkeypatch.setattr(sys, "meta_path", [*sys.meta_path, Finder()])
    assert entrypoints._scan("grp") is None
