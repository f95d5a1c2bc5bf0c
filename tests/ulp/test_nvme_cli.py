"""``ibal nvme``: bad arguments are one clear line and a non-zero exit status (the
commands' real runs are in tests/lab/test_nvme_lab.py)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from ibal.cli import main


def test_serve_needs_one_backing() -> None:
    r = CliRunner().invoke(main, ["nvme", "serve", "--addr", "10.0.0.1"])
    assert r.exit_code == 2 and "give --file or --mem" in r.output


def test_serve_missing_file_is_an_error(tmp_path: Path) -> None:
    r = CliRunner().invoke(main, ["nvme", "serve", "--file", str(tmp_path / "none.img"),
                                  "--addr", "10.0.0.1"])  # fmt: skip
    assert r.exit_code == 1 and "No such file" in r.output


def test_serve_refuses_a_file_smaller_than_a_block(tmp_path: Path) -> None:
    img = tmp_path / "tiny.img"
    img.write_bytes(bytes(100))
    r = CliRunner().invoke(main, ["nvme", "serve", "--file", str(img), "--addr", "10.0.0.1"])
    assert r.exit_code == 1 and "is not one 512-byte block" in r.output


def test_connect_with_an_unknown_provider_fails() -> None:
    r = CliRunner().invoke(main, ["nvme", "connect", "-a", "10.0.0.1", "-n", "nqn.x",
                                  "--provider", "no-such-provider"])  # fmt: skip
    assert r.exit_code == 1 and "providers:" in r.output


def test_nvme_is_listed() -> None:
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0 and "nvme" in r.output
