"""`loadpolicy explain`, end to end through the console entry point."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from loadpolicy.cli import EXAMPLES, main


@pytest.fixture
def stage3(tmp_path: Path) -> Path:
    path = tmp_path / "ds_zero3.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3}, "train_batch_size": 2}), encoding="utf-8")
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadpolicy", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_stage3_with_ep_is_ep_meta(stage3: Path) -> None:
    result = run("explain", "--deepspeed-config", str(stage3), "--tp-size", "2", "--ep-size", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("policy: EPMeta")
    assert "admit_mesh_bound" in result.stdout


def test_stage3_without_ep_is_zero3_init(stage3: Path) -> None:
    result = run("explain", "--deepspeed-config", str(stage3))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("policy: Zero3Init")


def test_no_deepspeed_config_is_meta_shard_on_read() -> None:
    result = run("explain", "--tp-size", "2", "--ep-size", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("policy: MetaShardOnRead")


def test_stage3_with_fsdp_and_ep_is_token_dispatch(stage3: Path) -> None:
    result = run("explain", "--deepspeed-config", str(stage3), "--fsdp-size", "2", "--ep-size", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("policy: EPMeta")
    assert "ZeRO-3 owns the 2 data-parallel ranks, tokens reach their experts by all-to-all" in result.stdout


def test_stage3_with_fsdp_is_a_clear_error(stage3: Path) -> None:
    result = run("explain", "--deepspeed-config", str(stage3), "--fsdp-size", "2")
    assert result.returncode == 2
    assert result.stdout == ""
    assert "fsdp_size=2" in result.stderr
    assert "Accepted under ZeRO-3" in result.stderr


def test_json_output_parses(stage3: Path) -> None:
    result = run("explain", "--deepspeed-config", str(stage3), "--tp-size", "2", "--ep-size", "2", "--json")
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["policy"] == "EPMeta"
    assert payload["inputs"]["ep_size"] == 2
    assert payload["inputs"]["zero3_enabled"] is True
    assert payload["decisions"]["loading_branch"]["value"] == "zero3_read_partitions"
    assert payload["decisions"]["missing_keys"]["value"] == "leave_to_zero3"
    assert payload["decisions"]["device_map"]["value"] == "admit_mesh_bound"


def test_enable_expert_parallel_alone_warns_that_ep_is_off(stage3: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--deepspeed-config", str(stage3), "--enable-expert-parallel", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["policy"] == "Zero3Init"  # EP is off, so it loads as dense ZeRO-3
    assert any("expert parallelism is OFF" in warning for warning in payload["warnings"])


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--policy", "fast"], "accepted: 'Zero3Init', 'MetaShardOnRead', 'EPMeta'"),
        (["--deepspeed-config", "/nonexistent/ds.json"], "Cannot read DeepSpeed config"),
        (["--tp-size", "2", "--ep-size", "3"], "`ep_size` (3) must be a multiple of `tp_size` (2)"),
        (["--policy", "EPMeta"], "--policy EPMeta loads under DeepSpeed ZeRO-3"),
    ],
)
def test_bad_input_exits_non_zero_with_message(
    args: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", *args]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert needle in captured.err


def test_bad_size_is_refused_by_the_parser() -> None:
    result = run("explain", "--ep-size", "0")
    assert result.returncode == 2
    assert "expected an integer >= 1, got 0" in result.stderr


@pytest.mark.parametrize(
    ("example", "policy"),
    [
        ("ep-zero3", "EPMeta"),
        ("ep-zero3-dispatch", "EPMeta"),
        ("dense-zero3", "Zero3Init"),
        ("plain-ep", "MetaShardOnRead"),
        ("zero3-fsdp", None),
    ],
)
def test_examples(example: str, policy: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    assert example in EXAMPLES
    code = main(["explain", "--example", example])
    out = capsys.readouterr().out
    if policy is None:
        assert code == 2
    else:
        assert code == 0
        assert out.startswith(f"policy: {policy}")


@pytest.mark.parametrize(
    ("zero", "branch"),
    [({"stage": 3}, "zero3_read_partitions"), ({"stage": 3, "zero_hpz_partition_size": 2}, "zero3_gather_and_copy")],
)
def test_explain_dense_zero3_reads_partitions_unless_hpz(tmp_path: Path, zero: dict[str, object], branch: str) -> None:
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": zero}), encoding="utf-8")
    result = run("explain", "--deepspeed-config", str(config), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["decisions"]["loading_branch"]["value"] == branch


def _readme_commands(prefixes: tuple[str, ...]) -> list[tuple[str, str]]:
    """(command, its trailing `# comment`) for each line of README.md and docs/cli.md in an sh block that starts with
    one of `prefixes`."""
    root = Path(__file__).resolve().parents[2]
    pages = "".join((root / page).read_text(encoding="utf-8") for page in ("README.md", "docs/cli.md"))
    found = []
    for block in re.findall(r"```sh\n(.*?)```", pages, re.DOTALL):
        for line in block.splitlines():
            command, _, comment = line.partition("#")
            if command.startswith(prefixes):
                found.append((command.strip(), comment.strip()))
    return found


README_EXAMPLES = _readme_commands(("loadpolicy explain", "loadpolicy doctor"))


def test_the_readme_shows_explain_and_doctor() -> None:
    assert len(README_EXAMPLES) >= 6, README_EXAMPLES


@pytest.mark.parametrize(("command", "comment"), README_EXAMPLES, ids=[c for c, _ in README_EXAMPLES])
def test_readme_examples_do_what_their_comments_say(command: str, comment: str) -> None:
    """Run from the repository root as the README's reader does; `# EPMeta` means that policy, `# error` exit 2."""
    result = subprocess.run(
        [sys.executable, "-m", "loadpolicy", *shlex.split(command)[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert "Traceback" not in result.stderr
    if "error" in comment:
        assert result.returncode == 2
        assert result.stderr.startswith("loadpolicy ")
        return
    assert result.returncode == 0, result.stderr
    policy = comment.split(",")[0].split()[0] if comment else ""
    if policy in ("EPMeta", "Zero3Init", "MetaShardOnRead"):
        shown = json.loads(result.stdout)["policy"] if "--json" in command else result.stdout.split()[1]
        assert shown == policy


README_PLANS = [(c, note) for c, note in _readme_commands(("loadpolicy plan launch",)) if "path/to" not in c]


def test_the_readme_shows_plan() -> None:
    assert len(README_PLANS) >= 2, README_PLANS


@pytest.mark.live
@pytest.mark.parametrize(("command", "comment"), README_PLANS, ids=[c for c, _ in README_PLANS])
def test_readme_plan_examples_run(command: str, comment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(shlex.split(command)[1:]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "rank(s)" in out
    assert "EPMeta on" in out


def test_world_size_the_sizes_do_not_span_is_refused(stage3: Path) -> None:
    result = run(
        "explain", "--deepspeed-config", str(stage3), "--fsdp-size", "4", "--ep-size", "2", "--world-size", "2"
    )
    assert result.returncode == 2
    assert "= 4 ranks, but this launch has 2" in result.stderr
    spanned = run(
        "explain", "--deepspeed-config", str(stage3), "--fsdp-size", "4", "--ep-size", "2", "--world-size", "4"
    )
    assert spanned.returncode == 0, spanned.stderr


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"loadpolicy \S+\n", result.stdout), result.stdout


# The user's commands and every help page: none may import the heavy packages (they take seconds to import, and the
# Quick start installs none of them).
LIGHT_COMMANDS = [
    ["--help"],
    ["--version"],
    ["dev", "--help"],
    ["plan", "--help"],
    ["checkout", "--help"],
    ["explain", "--example", "ep-zero3"],
    ["doctor", "--deepspeed-config", "examples/ds_zero3.json", "--fsdp-size", "4", "--ep-size", "2"],
]


@pytest.mark.parametrize("argv", LIGHT_COMMANDS, ids=" ".join)
def test_user_commands_import_neither_torch_nor_transformers(argv: list[str]) -> None:
    probe = (
        "import sys\nfrom loadpolicy.cli import main\n"
        "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'deepspeed', 'accelerate') if m in sys.modules)\n"
        "print('HEAVY', heavy, file=sys.stderr)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert "HEAVY []" in result.stderr, result.stderr


def test_every_command_listed_lazily_is_the_one_its_module_adds() -> None:
    """The top-level help lists each lazy command by the help its own module gives it."""
    from loadpolicy.cli import DEV_COMMANDS, USER_COMMANDS, build_parser

    every = build_parser()  # None: every command's module, as they were
    listed = build_parser([])  # no command named: placeholders only

    def helps(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> dict[str, str | None]:
        for word in path:
            parser = _subparsers(parser).choices[word]
        return {choice.dest: choice.help for choice in _subparsers(parser)._choices_actions}

    for path, commands in (((), USER_COMMANDS), (("dev",), DEV_COMMANDS)):
        real, placeholder = helps(every, path), helps(listed, path)
        for command in commands:
            assert placeholder[command.name] == real[command.name], command.name


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
