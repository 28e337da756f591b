"""Install the patched tree, or build a wheel of it with a local version label that names the series."""

from __future__ import annotations

import hashlib
import tarfile
import tempfile
from pathlib import Path

from loadpolicy.upstream.git import git
from loadpolicy.upstream.installer import run_pip
from loadpolicy.upstream.pin import Pin, UpstreamError
from loadpolicy.upstream.series import Series


# Where transformers 5.23.0 spells its version; both must change together for a consistent wheel.
_VERSION_FILES = ("setup.py", "src/transformers/__init__.py")


def local_version(pin: Pin, series: Series) -> str:
    """`5.23.0+loadpolicy.<first 10 hex of the sha256 over the series files, in order>`: a new series, a new label."""
    digest = hashlib.sha256()
    for path in series.paths:
        digest.update(path.read_bytes())
    return f"{pin.version}+loadpolicy.{digest.hexdigest()[:10]}"


def _pip(*args: str) -> None:
    result = run_pip(*args)
    if result.returncode:
        raise UpstreamError(f"pip {' '.join(args)} failed:\n{result.stderr.strip()[-4000:]}")


def _export_tree(tree: Path, dest: Path) -> Path:
    """The committed tree (HEAD) copied to `dest`, so building never writes into the checkout (egg-info, build/)."""
    archive = dest / "tree.tar"
    git(tree, "archive", "--format=tar", f"--output={archive}", "HEAD")
    with tarfile.open(archive) as handle:
        handle.extractall(dest / "tree", filter="data")
    return dest / "tree"


# Packages whose build imports torch: built against the installed torch (an isolated build would fetch another one,
# on Linux the CUDA build of several GB).
BUILDS_AGAINST_TORCH = ("deepspeed",)


def install(tree: Path, name: str = "transformers", version: str | None = None) -> None:
    """Install the patched tree's HEAD into the running interpreter's environment (not editable: it is a release),
    versioned `version` where given, so that `pip list` and `__version__` tell it from the release it patches."""
    isolation = ["--no-build-isolation"] if name in BUILDS_AGAINST_TORCH else []
    with tempfile.TemporaryDirectory() as tmp:
        copy = _export_tree(tree, Path(tmp))
        if version is not None:
            _relabel(copy, version)
        _pip("install", "--quiet", "--no-deps", "--force-reinstall", *isolation, str(copy))


def _relabel(copy: Path, version: str) -> None:
    """Write `version` (the release plus a local label) where transformers spells its release."""
    release = version.split("+")[0]
    for name in _VERSION_FILES:
        path = copy / name
        text = path.read_text(encoding="utf-8")
        quoted = f'"{release}"'
        if text.count(quoted) != 1:
            raise UpstreamError(f"{name}: expected the version {quoted} exactly once")
        path.write_text(text.replace(quoted, f'"{version}"'), encoding="utf-8")


def build_wheel(tree: Path, pin: Pin, series: Series, out: Path) -> Path:
    """Build a wheel of the tree's HEAD versioned `local_version(...)`, from a copy: the checkout is not touched."""
    version = local_version(pin, series)
    with tempfile.TemporaryDirectory() as tmp:
        copy = _export_tree(tree, Path(tmp))
        _relabel(copy, version)
        out.mkdir(parents=True, exist_ok=True)
        _pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(out.resolve()), str(copy))
    (wheel,) = out.glob(f"transformers-{version}-*.whl")
    return wheel
