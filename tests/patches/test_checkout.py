"""The real pinned sdist, real git: checkout verifies and applies; export is byte-stable; failures say where."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from loadpolicy.upstream.carry import SOURCE, TRANSFORMERS_MODULE, render_transformers_module
from loadpolicy.upstream.checkout import checkout, pristine_tag
from loadpolicy.upstream.fetch import fetch_sdist, unpack
from loadpolicy.upstream.pin import Pin, UpstreamError, read_pin
from loadpolicy.upstream.series import export_series, read_series
from loadpolicy.upstream.stack_record import require_tree_is_series


ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "patches"
CACHE = ROOT / "build" / "cache"


@pytest.fixture(scope="module")
def pin() -> Pin:
    return read_pin(PATCHES / "UPSTREAM")


@pytest.fixture(scope="module")
def patched(tmp_path_factory: pytest.TempPathFactory, pin: Pin) -> Path:
    tree = tmp_path_factory.mktemp("checkout") / "tf"
    checkout(tree, PATCHES, CACHE)
    return tree


def test_checkout_has_pristine_commit_then_one_commit_per_patch(patched: Path, pin: Pin) -> None:
    log = subprocess.run(
        ["git", "log", "--format=%s", f"{pristine_tag(pin)}..HEAD"], cwd=patched, capture_output=True, text=True
    )
    assert len(log.stdout.splitlines()) == len(read_series(PATCHES).names)
    first = subprocess.run(["git", "log", "--format=%s", "-1", pristine_tag(pin)], cwd=patched, capture_output=True)
    assert first.stdout.decode().strip() == "transformers 5.23.0 (pristine sdist)"


def test_reexporting_an_unchanged_branch_is_byte_identical(patched: Path, pin: Pin, tmp_path: Path) -> None:
    out = tmp_path / "patches"
    out.mkdir()
    names = export_series(patched, pristine_tag(pin), out)
    assert names == list(read_series(PATCHES).names)
    # the DeepSpeed, PEFT and upstream-ep series have their own directories; STACK is the record of the stack check
    comparison = filecmp.dircmp(out, PATCHES, ignore=["UPSTREAM", "STACK", "deepspeed", "peft", "upstream-ep"])
    assert comparison.diff_files == []
    assert comparison.left_only == []
    assert comparison.right_only == []
    _, mismatch, errors = filecmp.cmpfiles(out, PATCHES, [*names, "series"], shallow=False)
    assert mismatch == errors == []


def test_a_stack_record_names_only_a_tree_whose_commits_are_the_series(
    patched: Path, pin: Pin, tmp_path: Path
) -> None:
    require_tree_is_series(patched, pristine_tag(pin), read_series(PATCHES))
    # the same series with one patch changed by a byte: the tree's commits are no longer it
    other = tmp_path / "patches"
    shutil.copytree(PATCHES, other)
    first = other / read_series(other).names[0]
    first.write_bytes(first.read_bytes().replace(b"\n---\n", b"\n---\n ", 1))
    with pytest.raises(UpstreamError, match=rf"commits are not the series in .* \(differ: \['{first.name}'\]\)"):
        require_tree_is_series(patched, pristine_tag(pin), read_series(other))


def test_sha256_mismatch_refuses_to_unpack(pin: Pin, tmp_path: Path) -> None:
    sdist = fetch_sdist(pin, CACHE)
    wrong = Pin(name=pin.name, version=pin.version, sdist=pin.sdist, sha256="0" * 64)
    with pytest.raises(UpstreamError, match=r"does not match the pinned 0{64}.*refusing to unpack"):
        unpack(sdist, wrong, tmp_path / "tree")
    assert not (tmp_path / "tree").exists()


def test_a_patch_that_does_not_apply_is_named_with_its_file(tmp_path: Path) -> None:
    patches = tmp_path / "patches"
    shutil.copytree(PATCHES, patches)
    victim = next(p for p in read_series(patches).paths if "device_map" in p.name)
    text = victim.read_text(encoding="utf-8")
    # Break one context line of the hunk in integrations/accelerate.py so it no longer matches the pristine tree.
    broken = text.replace(" def compute_module_sizes(", " def compute_module_sizes_renamed(", 1)
    assert broken != text
    victim.write_text(broken, encoding="utf-8")
    with pytest.raises(UpstreamError) as excinfo:
        checkout(tmp_path / "tf", patches, CACHE)
    message = str(excinfo.value)
    assert f"patch {victim.name} does not apply" in message
    assert "src/transformers/integrations/accelerate.py" in message


def test_touched_files_pass_transformers_own_ruff(patched: Path, pin: Pin) -> None:
    """transformers' ruff version and configuration, on every Python file the series touches."""
    ruff = shutil.which("ruff", path=os.path.dirname(sys.executable))
    assert ruff is not None, "the patches environment installs transformers' ruff"
    version = subprocess.run([ruff, "--version"], capture_output=True, text=True).stdout
    assert version.strip() == "ruff 0.14.10", version
    touched = subprocess.run(
        ["git", "diff", "--name-only", f"{pristine_tag(pin)}..HEAD", "--", "*.py"],
        cwd=patched,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert "src/transformers/modeling_utils.py" in touched
    for command in (["check"], ["format", "--check"]):
        result = subprocess.run([ruff, *command, *touched], cwd=patched, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_wheel_carries_a_local_version_and_leaves_the_checkout_clean(patched: Path, pin: Pin, tmp_path: Path) -> None:
    from loadpolicy.upstream.build import build_wheel, local_version

    wheel = build_wheel(patched, pin, read_series(PATCHES), tmp_path)
    version = local_version(pin, read_series(PATCHES))
    assert version.startswith("5.23.0+loadpolicy.")
    assert wheel.name.startswith(f"transformers-{version}-")
    with zipfile.ZipFile(wheel) as archive:
        assert f'__version__ = "{version}"' in archive.read("transformers/__init__.py").decode()
        assert "transformers/integrations/load_policy.py" in archive.namelist()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=patched, capture_output=True, text=True, check=True)
    assert status.stdout == ""


# An interpreter that sees no DeepSpeed, as a transformers CI job without it: `is_deepspeed_available()` asks
# `importlib.util.find_spec("deepspeed")`.
_NO_DEEPSPEED = """
import importlib.util
_real = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a, **k: None if name.split(".")[0] == "deepspeed" else _real(name, *a, **k)
"""


def test_in_tree_tests_skip_cleanly_without_deepspeed(patched: Path, tmp_path: Path) -> None:
    """The series' tests live in transformers' `tests/deepspeed/` and skip, not fail, where DeepSpeed is absent."""
    (tmp_path / "sitecustomize.py").write_text(_NO_DEEPSPEED, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(patched / "src")]), "RUN_SLOW": "1"}
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", "-rs", "--rootdir", str(patched)]
    command += ["-c", str(patched / "pyproject.toml"), str(patched / "tests" / "deepspeed")]
    done = subprocess.run(command, cwd=patched, env=env, capture_output=True, text=True, timeout=300)
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert " skipped" in summary, summary
    assert not any(word in summary for word in ("failed", "error")), summary
    # Only the range readers and writers, the staging buffers, the collective's device and the planned save layout
    # run without DeepSpeed: they compare reads and writes of a safetensors file, a backend config's device, and a
    # layout planned from metadata, with torch and `save_pretrained`
    without_deepspeed = (
        "::RangeReadersTest::",
        "::RangeWritersTest::",
        "::StagingTest::",
        "::CollectiveDeviceTest::",
        "::SaveLayoutTest::",
        "::ExpertParallelSaveAgreementTest::",  # a store and threads: no DeepSpeed
    )
    passed = [line.split()[0] for line in done.stdout.splitlines() if " PASSED" in line]
    assert all(any(kind in test for kind in without_deepspeed) for test in passed), passed


def test_the_fork_carries_the_module_generated_from_policy_py(patched: Path) -> None:
    """The EP PR carries its own module (checked against policy.py in tests/unit/test_series.py); the fork-only patch
    replaces it with the generated one, whose helpers only the fork's patches call."""
    carried = (patched / TRANSFORMERS_MODULE).read_text(encoding="utf-8")
    assert carried == render_transformers_module(SOURCE.read_text(encoding="utf-8")), (
        "the fork's policy module drifted from src/loadpolicy/policy.py: run "
        "`loadpolicy dev series sync-policy TREE`, amend the fork-only patch that carries it, and "
        "`loadpolicy dev series export TREE`"
    )


def test_the_installed_patched_tree_names_its_series_in_its_version(pin: Pin) -> None:
    """`tox -e patches` installs the tree with `loadpolicy checkout --install`: pip and transformers say the label."""
    import importlib.metadata

    import transformers

    from loadpolicy.upstream.build import local_version

    expected = local_version(pin, read_series(PATCHES))
    assert transformers.__version__ == expected
    assert importlib.metadata.version("transformers") == expected


def test_the_upstream_ep_series_reexports_byte_identical(pin: Pin, tmp_path: Path) -> None:
    series = PATCHES / "upstream-ep"
    tree = tmp_path / "tf-ep"
    checkout(tree, series, CACHE)
    out = tmp_path / "patches"
    out.mkdir()
    names = export_series(tree, pristine_tag(pin), out)
    assert names == list(read_series(series).names)
    _, mismatch, errors = filecmp.cmpfiles(out, series, [*names, "series"], shallow=False)
    assert mismatch == errors == []
