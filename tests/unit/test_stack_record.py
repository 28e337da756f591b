"""The record of the full stack check: current for exactly the patches it was written for, stale after any change."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from loadpolicy.cli import main
from loadpolicy.upstream.pin import UpstreamError
from loadpolicy.upstream.series import read_series
from loadpolicy.upstream.stack_record import require_current_record, series_digest, write_record


def record_now(path: Path, directory: Path, lines: list[str] | None = None) -> None:
    series = read_series(directory)
    write_record(path, series, series_digest(series), lines or [])


PATCHES = Path(__file__).resolve().parents[2] / "patches"


@pytest.fixture
def series_dir(tmp_path: Path) -> Path:
    """A copy of the series' first two PRs: `series`, UPSTREAM and their patches."""
    directory = tmp_path / "patches"
    directory.mkdir()
    groups = read_series(PATCHES).groups[:2]  # PR 1 and PR 2, one patch each
    for name in (*(name for _, names in groups for name in names), "UPSTREAM"):
        shutil.copy(PATCHES / name, directory / name)
    listing = "".join(f"# {label}\n" + "".join(f"{name}\n" for name in names) for label, names in groups)
    (directory / "series").write_text(listing, encoding="utf-8")
    return directory


def test_a_record_written_for_the_series_is_current(series_dir: Path) -> None:
    record = series_dir / "STACK"
    record_now(record, series_dir, ["PR 1: ... its 3 test(s) pass (20s)"])
    assert require_current_record(record, read_series(series_dir)) == (
        f"series sha256 {series_digest(read_series(series_dir))}"
    )
    assert "PR 1: ... its 3 test(s) pass (20s)" in record.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "change", ["a patch's body", "the order", "a patch added", "the pin", "a nested series", "the pinned versions"]
)
def test_any_change_to_the_patches_makes_the_record_stale(series_dir: Path, change: str) -> None:
    record = series_dir / "STACK"
    record_now(record, series_dir)
    before = series_digest(read_series(series_dir))
    names = list(read_series(series_dir).names)
    if change == "a patch's body":
        path = series_dir / names[0]
        path.write_text(path.read_text(encoding="utf-8") + " ", encoding="utf-8")
    elif change == "the order":
        (series_dir / "series").write_text("# PR 1: one\n" + "\n".join(reversed(names)) + "\n", encoding="utf-8")
    elif change == "the pin":
        (series_dir / "UPSTREAM").write_text("transformers 5.24.0\n", encoding="utf-8")
    elif change == "the pinned versions":  # the torch, DeepSpeed, ... the PRs' tests ran with
        (series_dir.parent / "pins").mkdir()
        (series_dir.parent / "pins" / "constraints.txt").write_text("torch==2.13.0\n", encoding="utf-8")
    elif change == "a nested series":
        nested = series_dir / "deepspeed"
        nested.mkdir()
        shutil.copy(series_dir / "UPSTREAM", nested / "UPSTREAM")
        (nested / "0001-a.patch").write_text("From 1\n", encoding="utf-8")
        (nested / "series").write_text("0001-a.patch\n", encoding="utf-8")
    else:
        third = read_series(PATCHES).names[2]
        shutil.copy(PATCHES / third, series_dir / third)
        (series_dir / "series").write_text("# PR 1: one\n" + "\n".join([*names, third]) + "\n", encoding="utf-8")
    with pytest.raises(UpstreamError, match="run `tox -e stack`") as error:
        require_current_record(record, read_series(series_dir))
    assert before in str(error.value)
    assert series_digest(read_series(series_dir)) in str(error.value)


def test_what_no_prefix_holds_leaves_the_record_current(series_dir: Path) -> None:
    record_now(series_dir / "STACK", series_dir)
    (series_dir / "0001-a.patch.orig").write_text("an editor's backup", encoding="utf-8")
    (series_dir / "9999-unlisted.patch").write_text("From 1\n", encoding="utf-8")
    require_current_record(series_dir / "STACK", read_series(series_dir))
    # a fork-only patch after the PRs: no PR's prefix holds it
    third = read_series(PATCHES).names[2]
    shutil.copy(PATCHES / third, series_dir / third)
    listing = (series_dir / "series").read_text(encoding="utf-8")
    (series_dir / "series").write_text(listing + f"# fork-only: kept\n{third}\n", encoding="utf-8")
    require_current_record(series_dir / "STACK", read_series(series_dir))


def test_a_series_changed_while_it_was_checked_is_not_recorded(series_dir: Path) -> None:
    before = series_digest(read_series(series_dir))
    path = series_dir / read_series(series_dir).names[0]
    path.write_text(path.read_text(encoding="utf-8") + " ", encoding="utf-8")
    with pytest.raises(UpstreamError, match="the series changed while the stack was checked"):
        write_record(series_dir / "STACK", read_series(series_dir), before, [])
    assert not (series_dir / "STACK").exists()


def test_a_record_that_is_not_one_says_so(series_dir: Path) -> None:
    (series_dir / "STACK").write_text("hello\n", encoding="utf-8")
    with pytest.raises(UpstreamError, match=r"begins 'hello', not `series sha256 <hex>`"):
        require_current_record(series_dir / "STACK", read_series(series_dir))


def test_no_record_says_which_command_writes_it(series_dir: Path) -> None:
    with pytest.raises(UpstreamError, match=r"no record .* run `tox -e stack`"):
        require_current_record(series_dir / "STACK", read_series(series_dir))


def test_lint_requires_a_current_record(series_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["dev", "series", "lint", "--patches", str(series_dir), "--require-stack-record", str(series_dir / "STACK")]
    assert main(argv) != 0
    assert "run `tox -e stack`" in capsys.readouterr().err
    record_now(series_dir / "STACK", series_dir)
    assert main(argv) == 0
    assert "the full stack check is recorded for them (series sha256" in capsys.readouterr().out


def test_the_partial_check_cannot_write_the_record(series_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["dev", "series", "stack", str(series_dir), "--patches", str(series_dir), "--standalone-tests-only"]
    assert main([*argv, "--write-record", str(series_dir / "STACK")]) != 0
    assert "--write-record records the full check" in capsys.readouterr().err
    assert not (series_dir / "STACK").exists()
