"""tox.ini: every environment that installs this package installs it editable, the lab with it.

A derived environment (`base = testenv:X`) reads `package` from its own section or from X's, not from [testenv]:
without its own `package = editable` it would install an sdist, whose wheel carries no lab.
"""

from __future__ import annotations

import configparser
from pathlib import Path


TOX = Path(__file__).resolve().parents[2] / "tox.ini"


def test_every_environment_that_installs_the_package_installs_it_editable() -> None:
    config = configparser.ConfigParser(interpolation=None)
    config.read(TOX, encoding="utf-8")
    assert config["testenv"]["package"] == "editable"
    sections = [name for name in config.sections() if name.startswith("testenv:")]
    wrong = [
        name
        for name in sections
        if config[name].get("skip_install", "false").strip() != "true"
        and "base" in config[name]
        and config[name].get("package") != "editable"
    ]
    assert sections
    assert wrong == []
