"""Get the pinned sdist through pip from the package registry and verify its sha256 before anything is unpacked."""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
from pathlib import Path

from loadpolicy.upstream.installer import run_pip
from loadpolicy.upstream.pin import Pin, UpstreamError


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify(path: Path, pin: Pin) -> None:
    actual = sha256_of(path)
    if actual != pin.sha256:
        raise UpstreamError(
            f"{path.name}: sha256 {actual} does not match the pinned {pin.sha256} (patches/UPSTREAM); "
            "refusing to unpack it."
        )


def _download(requirement: str, sdist: str, dest: Path) -> Path:
    result = run_pip("download", "--quiet", "--no-deps", "--no-binary", ":all:", "--dest", str(dest), requirement)
    downloaded = dest / sdist
    if result.returncode != 0 or not downloaded.exists():
        raise UpstreamError(f"pip could not download {requirement} as an sdist:\n{result.stderr.strip()}")
    return downloaded


def fetch_sdist(pin: Pin, cache: Path) -> Path:
    """The verified sdist, from `cache` when a verified copy is there, else downloaded with pip."""
    cached = cache / pin.sdist
    if cached.exists():
        verify(cached, pin)
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        downloaded = _download(pin.requirement, pin.sdist, Path(tmp))
        verify(downloaded, pin)
        shutil.move(downloaded, cached)
    return cached


def fetch_unpinned(name: str, version: str, cache: Path) -> Pin:
    """Another release, to try the series on: nothing pins its hash yet, so the pin records the one downloaded."""
    sdist = f"{name}-{version}.tar.gz"
    directory = cache / "unpinned"
    path = directory / sdist
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        _download(f"{name}=={version}", sdist, directory)
    return Pin(name=name, version=version, sdist=str(Path("unpinned") / sdist), sha256=sha256_of(path))


def unpack(sdist: Path, pin: Pin, dest: Path) -> Path:
    """Unpack a verified sdist's single top-level directory into `dest` (which must not exist yet)."""
    verify(sdist, pin)
    if dest.exists():
        raise UpstreamError(f"{dest} already exists; give a new directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp, tarfile.open(sdist) as archive:
        archive.extractall(tmp, filter="data")
        (top,) = Path(tmp).iterdir()
        shutil.move(top, dest)
    return dest
