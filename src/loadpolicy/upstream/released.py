"""An interpreter with the released DeepSpeed, for the PRs that say `Needs: none`.

The stack check runs where the DeepSpeed series is installed (the PRs that hand experts to DeepSpeed need it). A PR
that can be merged first, alone, must also not need that series: its tests run in a virtual environment layered on
the running one (its packages visible through a path file) with the pinned DeepSpeed sdist, verified, installed in
the layer's own site-packages, which comes first on `sys.path`.
"""

from __future__ import annotations

import os
import subprocess
import sysconfig
import venv
from pathlib import Path

from loadpolicy.upstream.fetch import fetch_sdist
from loadpolicy.upstream.installer import pip_command
from loadpolicy.upstream.pin import Pin, UpstreamError


def released_deepspeed_python(where: Path, pin: Pin, cache: Path) -> Path:
    """The layer's interpreter at `where` (made anew) with DeepSpeed `pin` released; an error unless it imports that
    DeepSpeed from the layer, not the series below it."""
    # no pip of its own: the layer's own setuptools (the one `ensurepip` brings) would shadow the environment's
    venv.EnvBuilder(clear=True, with_pip=False).create(where)
    python = where / "bin" / "python"
    layer = Path(_ask(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    # plain paths, not `site.addsitedir`: the running environment's path files (an editable install's finder) stay
    # out of the layer, so nothing below it can shadow its DeepSpeed
    below = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    (layer / "zz_stack_environment.pth").write_text("\n".join(dict.fromkeys(below)) + "\n", encoding="utf-8")
    sdist = fetch_sdist(pin, cache)
    # built against the torch below (an isolated build would fetch another one, on Linux the CUDA build of GBs)
    command = [*pip_command(str(python)), "install", "--quiet", "--no-deps", "--no-build-isolation", str(sdist)]
    # the verified sdist as it is, without its dependencies: the environment's constraints (which pin DeepSpeed's
    # version, the series' too) are not for it
    environment = {key: value for key, value in os.environ.items() if key != "PIP_CONSTRAINT"}
    done = subprocess.run(
        command, capture_output=True, text=True, env=environment | {"PIP_NO_INPUT": "1"}, check=False
    )
    if done.returncode:
        raise UpstreamError(f"installing {sdist.name} in {where} failed:\n{done.stderr.strip()[-3000:]}")
    # the last line: importing DeepSpeed prints its accelerator's warning before
    found = (
        _ask(python, "import deepspeed; print(deepspeed.__version__, deepspeed.__file__)")
        .splitlines()[-1]
        .split(" ", 1)
    )
    if found[0] != pin.version or not Path(found[1]).is_relative_to(layer):
        raise UpstreamError(f"{python} imports DeepSpeed {found[0]} from {found[1]}, not the release {pin.version}")
    return python


def _ask(python: Path, code: str) -> str:
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    if done.returncode:
        raise UpstreamError(f"{python} -c {code!r} failed:\n{done.stderr.strip()[-2000:]}")
    return done.stdout.strip()
