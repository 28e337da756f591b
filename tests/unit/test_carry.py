"""The policy module can be carried into transformers as is: standard library only, Python 3.11, one source."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from loadpolicy.upstream.carry import SOURCE, NotCarriableError, check_carriable, render_transformers_module


def test_policy_source_is_carriable() -> None:
    check_carriable(SOURCE.read_text(encoding="utf-8"))


def test_rendered_module_is_header_plus_source() -> None:
    source = SOURCE.read_text(encoding="utf-8")
    rendered = render_transformers_module(source)
    assert rendered.endswith(source)
    header = rendered[: -len(source)]
    assert header.startswith("# Copyright 2026 The HuggingFace Team.")
    assert "edit it there and regenerate" in header
    assert all(line.startswith("#") for line in header.splitlines())


def test_rendered_module_runs_standalone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Imported from a bare directory, away from our package, the copy selects EPMeta for EP under ZeRO-3."""
    path = tmp_path / "load_policy.py"
    path.write_text(render_transformers_module(SOURCE.read_text(encoding="utf-8")), encoding="utf-8")
    spec = importlib.util.spec_from_file_location("carried_load_policy", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "carried_load_policy", module)
    spec.loader.exec_module(module)
    inputs = module.LoadInputs(zero3_enabled=True, sizes=module.ParallelSizes(tp=2, ep=2))
    assert module.select_load_policy(inputs) == module.EPMeta(ep_size=2)


@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("import torch\n", "imports 'torch'"),
        ("from loadpolicy.sizes import RawSizes\n", "imports 'loadpolicy.sizes'"),
        ("from .sizes import RawSizes\n", "relative import"),
    ],
)
def test_non_carriable_sources_are_refused(source: str, needle: str) -> None:
    with pytest.raises(NotCarriableError, match=needle):
        check_carriable(source)


def test_syntax_newer_than_311_is_refused() -> None:
    with pytest.raises(SyntaxError):
        check_carriable("type Alias = int\n")
