"""Every input a user can type gets `loadpolicy <command>: error: ...` (exit 2), never a traceback.

The table in docs/bad-inputs.md is this file's cases and the messages they print; the last test checks it is
current (regenerate: `LOADPOLICY_WRITE_DOCS=1 pytest tests/unit/test_bad_inputs.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from loadpolicy.cli import main


ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "bad-inputs.md"
ZERO3 = {"zero_optimization": {"stage": 3}}
FILES: dict[str, object] = {
    "ds_zero3.json": ZERO3,
    "offload-as-string.json": {"zero_optimization": {"stage": 3, "offload_param": "cpu"}},
    "offload-device.json": {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}},
    "autoep-string.json": ZERO3 | {"expert_parallel": {"enabled": "false"}},
    "stage-4.json": {"zero_optimization": {"stage": 4}},
    "ds_zero2.json": {"zero_optimization": {"stage": 2}},
    "config-no-type.json": {"hidden_size": 8},
    "config-unknown-type.json": {"model_type": "not_a_model"},
}

# (what the user typed after `loadpolicy`, text the error must contain); files are relative to the working directory
CASES: list[tuple[str, str]] = [
    ("explain --example ep-zero3 --ep-size 4", "would ignore --ep-size"),
    ("explain --example dense-zero3 --fsdp-size 2 --world-size 2", "would ignore --fsdp-size, --world-size"),
    ("explain --policy Zero3Init", "pass --deepspeed-config FILE with zero_optimization.stage = 3"),
    ("explain --policy fast", "accepted: 'Zero3Init', 'MetaShardOnRead', 'EPMeta'"),
    ("explain --deepspeed-config ds_zero3.json --ep-size 2", "DistributedConfig(fsdp_size=<world size>, ep_size=2)"),
    ("explain --deepspeed-config ds_zero3.json --fsdp-size 2", "Accepted under ZeRO-3"),
    ("explain --deepspeed-config missing.json", "Cannot read DeepSpeed config 'missing.json'"),
    ("explain --tp-size 2 --ep-size 3", "must be a multiple of `tp_size`"),
    ("explain --deepspeed-config stage-4.json", "accepted: 0, 1, 2, 3"),
    ("explain --deepspeed-config offload-as-string.json", "`zero_optimization.offload_param` must be an object"),
    ("explain --deepspeed-config offload-device.json", "accepted: 'none', 'cpu', 'nvme'"),
    ("explain --ep-size 0", "expected an integer >= 1, got 0"),
    (
        "explain --deepspeed-config ds_zero2.json --fsdp-size 2 --ep-size 2",
        "which DeepSpeed cannot wrap: from_pretrained refuses",
    ),
    ("explain --deepspeed-config ds_zero3.json --fsdp-size 4 --ep-size 2 --world-size 2", "but this launch has 2"),
    ("doctor --deepspeed-config ds_zero3.json --fsdp-size 2", "Accepted under ZeRO-3"),
    ("doctor --deepspeed-config ds_zero2.json --tp-size 2 --ep-size 2", "Accepted: zero_optimization.stage = 3"),
    ("doctor --deepspeed-config ds_zero3.json --ep-size 3 --fsdp-size 2", "`ep_size` (3) must divide"),
    ("doctor --deepspeed-config autoep-string.json", "`expert_parallel.enabled` must be true or false"),
    ("doctor --deepspeed-config offload-as-string.json", "`zero_optimization.offload_param` must be an object"),
    ("doctor --deepspeed-config ds_zero3.json --deepspeed-version latest", "Cannot read DeepSpeed version 'latest'"),
    ("doctor --deepspeed-config ds_zero3.json --tp-size x", "expected an integer >= 1, got 'x'"),
    ("plan launch --config missing.json --ranks 4", "'missing.json' does not exist"),
    ("plan launch --config empty-dir --ranks 4", "'empty-dir' has no config.json"),
    ("plan launch --config stage-4.json --ranks 4", "names no model type"),
    ("plan launch --config not-json.txt --ranks 4", "is not valid JSON"),
    ("plan launch --config config-unknown-type.json --ranks 4", "unknown model_type 'not_a_model'"),
    ("plan launch --model Qwen3-30B-A3B --ranks 4 --ep 3", "ep=3 must divide ranks=4"),
    ("plan launch --model Qwen3-30B-A3B --ranks 0", "expected an integer >= 1, got 0"),
    ("dev perf calibrate --bench missing-bench", "holds no bench.json"),
    ("checkout tf", "no patch series at 'patches'"),
    ("dev series lint", "no patch series at 'patches'"),
    ("dev series export not-a-checkout --patches patches-copy", "not a git checkout with the pristine tag"),
    ("dev series export missing-dir --patches patches-copy", "'missing-dir' is not a directory"),
    ("dev validate --timeout -5", "expected a number of seconds > 0, got -5"),
    ("dev perf bench --repeats 0", "expected an integer >= 1, got 0"),
]
# Cases that need a missing package: (argv, the module hidden from it, expected text)
WITHOUT: list[tuple[str, str, str]] = [
    ("plan launch --model Qwen3-30B-A3B --ranks 4", "transformers", "pip install 'loadpolicy[live]'"),
    ("plan project --models Qwen3-30B-A3B --ranks 4 --out out", "matplotlib", "pip install matplotlib, or --no-plot"),
]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, content in FILES.items():
        (tmp_path / name).write_text(json.dumps(content), encoding="utf-8")
    (tmp_path / "not-json.txt").write_text("{", encoding="utf-8")
    (tmp_path / "empty-dir").mkdir()
    (tmp_path / "not-a-checkout").mkdir()
    shutil.copytree(ROOT / "patches", tmp_path / "patches-copy")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _error(argv: str, capsys: pytest.CaptureFixture[str]) -> str:
    """Run `loadpolicy argv` in this process; the error text it printed, after checking its form."""
    try:
        code = main(argv.split())
    except SystemExit as exc:  # argparse refuses it before any handler runs
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    words = argv.split()
    command = " ".join(
        words[: 3 if words[:2] in (["dev", "series"], ["dev", "perf"]) else 2 if words[0] in ("plan", "dev") else 1]
    )
    assert code == 2, captured
    assert captured.out == ""
    assert "Traceback" not in captured.err
    line = captured.err.strip().splitlines()[-1]
    assert line.startswith(f"loadpolicy {command}: error: "), captured.err
    return line.removeprefix(f"loadpolicy {command}: error: ")


@pytest.mark.parametrize(("argv", "needle"), CASES, ids=[argv for argv, _ in CASES])
def test_bad_input_is_a_named_error(argv: str, needle: str, workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert needle in _error(argv, capsys)


@pytest.mark.parametrize(("argv", "module", "needle"), WITHOUT, ids=[argv for argv, _, _ in WITHOUT])
def test_a_missing_package_is_named(
    argv: str,
    module: str,
    needle: str,
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now fails as if it were not installed
    assert needle in _error(argv, capsys)


def test_series_export_into_a_bad_tree_leaves_the_patches_untouched(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.name: p.read_bytes() for p in (workdir / "patches-copy").iterdir() if p.is_file()}
    _error("dev series export not-a-checkout --patches patches-copy", capsys)
    after = {p.name: p.read_bytes() for p in (workdir / "patches-copy").iterdir() if p.is_file()}
    assert after == before
    assert [p.name for p in (workdir / "patches-copy").iterdir() if p.name.startswith(".export-")] == []


def test_a_closed_pipe_is_silent() -> None:
    """`loadpolicy explain ... | head`: the reader is gone before the first write."""
    process = subprocess.Popen(
        [sys.executable, "-m", "loadpolicy", "explain", "--example", "ep-zero3", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=os.environ | {"PYTHONPATH": str(ROOT / "src")},
    )
    assert process.stdout is not None
    assert process.stderr is not None
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 0
    assert stderr == ""


def _table(rows: list[tuple[str, str]]) -> str:
    lines = ["| you type | loadpolicy answers (exit 2) |", "|---|---|"]
    escaped = [(argv, message.replace("|", "\\|")) for argv, message in rows]
    lines += [f"| `loadpolicy {argv}` | {message} |" for argv, message in escaped]
    return "\n".join(lines) + "\n"


def test_the_docs_table_is_current(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [(argv, _error(argv, capsys)) for argv, _ in CASES]
    for argv, module, _ in WITHOUT:
        with monkeypatch.context() as hidden:
            hidden.setitem(sys.modules, module, None)
            rows.append((f"{argv}  (without {module})", _error(argv, capsys)))
    text = DOC.read_text(encoding="utf-8") if DOC.exists() else ""
    head, marker, _ = text.partition("<!-- table -->\n")
    table = _table(rows)
    if os.environ.get("LOADPOLICY_WRITE_DOCS") == "1":
        text = head + marker + table
        DOC.write_text(text, encoding="utf-8")
    assert marker, f"{DOC} has no `<!-- table -->` line"
    assert text.partition("<!-- table -->\n")[2] == table, "docs/bad-inputs.md is stale: LOADPOLICY_WRITE_DOCS=1"
