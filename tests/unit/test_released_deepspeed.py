"""The layer the stack check tests `Needs: none` PRs in: the running environment below, the pinned DeepSpeed sdist
above it, for real (a virtual environment, pip, a path file), with a stand-in sdist built here."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from loadpolicy.upstream.pin import Pin, UpstreamError
from loadpolicy.upstream.released import released_deepspeed_python


def _sdist(cache: Path, version: str) -> Pin:
    """A `deepspeed` sdist of `version` in `cache` whose module says where it is imported from, and its pin."""
    name = f"deepspeed-{version}"
    files = {
        "pyproject.toml": '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "deepspeed"\nversion = "{version}"\n',
        "deepspeed/__init__.py": f'__version__ = "{version}"\n',
    }
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for relative, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}/{relative}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return Pin("deepspeed", version, path.name, hashlib.sha256(path.read_bytes()).hexdigest())


def test_the_layer_imports_the_release_above_what_the_environment_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("setuptools")  # the stand-in builds without isolation, with the environment's setuptools
    # as under tox: constraints that pin another DeepSpeed do not stop the pinned sdist
    (tmp_path / "constraints.txt").write_text("deepspeed==9.9.9\n", encoding="utf-8")
    monkeypatch.setenv("PIP_CONSTRAINT", str(tmp_path / "constraints.txt"))
    pin = _sdist(tmp_path / "cache", "0.0.1")
    python = released_deepspeed_python(tmp_path / "layer", pin, tmp_path / "cache")
    code = "import deepspeed, pytest; print(deepspeed.__version__, deepspeed.__file__)"
    version, where = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert version == "0.0.1"
    assert Path(where).is_relative_to(tmp_path / "layer")  # and pytest, from the environment below, imports too


def test_a_sdist_that_is_not_the_pinned_one_is_refused(tmp_path: Path) -> None:
    pin = _sdist(tmp_path / "cache", "0.0.1")
    (tmp_path / "cache" / pin.sdist).write_bytes(b"not the pinned sdist")
    with pytest.raises(UpstreamError, match="sha256"):
        released_deepspeed_python(tmp_path / "layer", pin, tmp_path / "cache")
