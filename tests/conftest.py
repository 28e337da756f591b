from __future__ import annotations

import importlib.util
import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `live` need transformers; tox sets LOADPOLICY_REQUIRE_LIVE=1 so a missing install fails loudly."""
    if importlib.util.find_spec("transformers") is not None:
        return
    if os.environ.get("LOADPOLICY_REQUIRE_LIVE") == "1":
        raise pytest.UsageError("LOADPOLICY_REQUIRE_LIVE=1 but transformers is not installed (the `live` extra)")
    skip = pytest.mark.skip(reason="transformers is not installed (install the `live` extra)")
    for item in items:
        if "live" in item.keywords:
            item.add_marker(skip)
