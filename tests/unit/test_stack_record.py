"""The record of the full stack check: current for exactly the patches it was written for, stale after any change."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loadpolicy.cli import main
from loadpolicy.upstream.pin import UpstreamError
from loadpolicy.upstream.series import read_series
from loadpolicy.upstream.stack_record import require_current_record, series_digest, write_record


PATCHES = Path(__file__).resolve().parents[2] / "patches"


@pytest.fixture
def series_dir(tmp_path: Path) -> Path:
    """A copy of the series: `series`, UPSTREAM and the first two patches."""
    directory = tmp_path / "patches"
    directory.mkdir()
    names = read_series(PATCHES).names[:2]
    for name in (*names, "UPSTREAM"):
        shutil.copy(PATCHES / name, directory / name)
    (directory / "series").write_text("# PR 1: one\n" + "\n".join(names) + "\n", encoding="utf-8")
    return directory


def test_a_record_written_for_the_series_is_current(series_dir: Path) -> None:
    record = series_dir / "STACK"
    write_record(record, read_series(series_dir), ["PR 1: ... its 3 test(s) pass (20s)"])
    assert require_current_record(record, read_series(series_dir)) == (
        f"series sha256 {series_digest(read_series(series_dir))}"
    )
    assert "PR 1: ... its 3 test(s) pass (20s)" in record.read_text(encoding="utf-8")


@pytest.mark.parametrize("change", ["a patch's body", "the order", "a patch added", "the pin", "a nested series"])
def test_any_change_to_the_patches_makes_the_record_stale(series_dir: Path, change: str) -> None:
    record = series_dir / "STACK"
    write_record(record, read_series(series_dir), [])
    before = series_digest(read_series(series_dir))
    names = list(read_series(series_dir).names)
    if change == "a patch's body":
        path = series_dir / names[0]
        path.write_text(path.read_text(encoding="utf-8") + " ", encoding="utf-8")
    elif change == "the order":
        (series_dir / "series").write_text("# PR 1: one\n" + "\n".join(reversed(names)) + "\n", encoding="utf-8")
    elif change == "the pin":
        (series_dir / "UPSTREAM").write_text("transformers 5.24.0\n", encoding="utf-8")
    elif change == "a nested series":
        (series_dir / "deepspeed").mkdir()
        (series_dir / "deepspeed" / "0001-a.patch").write_text("From 1\n", encoding="utf-8")
    else:
        third = read_series(PATCHES).names[2]
        shutil.copy(PATCHES / third, series_dir / third)
        (series_dir / "series").write_text("# PR 1: one\n" + "\n".join([*names, third]) + "\n", encoding="utf-8")
    with pytest.raises(UpstreamError, match="run `tox -e stack`") as error:
        require_current_record(record, read_series(series_dir))
    assert before in str(error.value)
    assert series_digest(read_series(series_dir)) in str(error.value)


def test_other_files_beside_the_series_leave_the_record_current(series_dir: Path) -> None:
    write_record(series_dir / "STACK", read_series(series_dir), [])
    (series_dir / "0001-a.patch.orig").write_text("an editor's backup", encoding="utf-8")
    require_current_record(series_dir / "STACK", read_series(series_dir))


def test_no_record_says_which_command_writes_it(series_dir: Path) -> None:
    with pytest.raises(UpstreamError, match=r"no record .* run `tox -e stack`"):
        require_current_record(series_dir / "STACK", read_series(series_dir))


def test_the_partial_check_cannot_write_the_record(series_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["dev", "series", "stack", str(series_dir), "--patches", str(series_dir), "--standalone-tests-only"]
    assert main([*argv, "--write-record", str(series_dir / "STACK")]) != 0
    assert "--write-record records the full check" in capsys.readouterr().err
    assert not (series_dir / "STACK").exists()
