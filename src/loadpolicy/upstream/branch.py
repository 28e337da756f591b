"""`loadpolicy dev series branch NAME TREE`: one PR of a series as its upstream receives it.

NAME is a stable name of docs/upstream/names.md. In TREE (a checkout with that series applied, `loadpolicy checkout`)
the PR becomes a branch `upstream/NAME`: its own commits on the pristine sources where it needs nothing, else the
series up to its last commit (it is opened after the PRs it needs, and rebased on them as they merge). Beside it, a
description file: what the branch holds (base, commits, sizes, the tests it adds) and, below, the PR's description
as docs/upstream writes it (its page, or its section of the README), which says why, what changes and how it was
measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from loadpolicy.upstream.git import git
from loadpolicy.upstream.pin import UpstreamError
from loadpolicy.upstream.series import GroupSize, group_sizes, read_series
from loadpolicy.upstream.size_table import NEEDS, SERIES_FOLDERS, read_positions, table_rows


_DESCRIPTION = re.compile(r"^\| `(?P<name>[a-z0-9:-]+)` \|.*\| \[[^]]*\]\((?P<page>[^)#]+)(?:#(?P<anchor>[^)]+))?\)")


@dataclass(frozen=True, slots=True)
class PullRequest:
    name: str
    series: str  # "transformers", "DeepSpeed series", "PEFT series"
    number: int
    size: GroupSize
    first: int  # its patches in the series, 1-based and inclusive
    end: int
    needs: str  # the README's "needs" cell: "nothing", or the PRs it is opened after
    description: str  # its page, or its section of a page


def find_pull_request(name: str, docs: Path, patches: Path) -> PullRequest:
    """The PR `name` names (docs: docs/upstream; patches: the transformers series' folder)."""
    positions = read_positions(docs / "names.md")
    if name not in positions:
        known = ", ".join(sorted(n for n in positions if not n.startswith("fork-only:")))
        raise UpstreamError(f"no PR is named {name!r} in {docs / 'names.md'}; accepted: {known}")
    series_name, number = positions[name]
    series = read_series(patches / SERIES_FOLDERS[series_name])
    first = 1
    for size in group_sizes(series):
        if size.label.startswith(f"PR {number}:"):
            rows = {row.name: row for row in table_rows((docs / "README.md").read_text(encoding="utf-8"))}
            needs = rows[name].cells.get(NEEDS, "nothing") if name in rows else "nothing"
            end = first + size.patches - 1
            return PullRequest(name, series_name, number, size, first, end, needs, _description(name, docs))
        first += size.patches
    raise UpstreamError(f"{name}: the series in {patches / SERIES_FOLDERS[series_name]} has no PR {number}")


def _description(name: str, docs: Path) -> str:
    """The PR's description: its own page, or the section of a page its names.md row links to."""
    for line in (docs / "names.md").read_text(encoding="utf-8").splitlines():
        if (match := _DESCRIPTION.match(line)) and match["name"] == name:
            text = (docs / match["page"]).read_text(encoding="utf-8")
            return _own_paragraphs(_section(text, match["anchor"]), name) if match["anchor"] else text
    raise UpstreamError(f"{name}: names.md links no description")


def _section(text: str, anchor: str) -> str:
    """The section of `text` whose heading GitHub anchors as `anchor`, up to the next heading of its level or above."""
    lines, found, level = text.splitlines(), list[str](), 0
    for line in lines:
        heading = re.match(r"^(#+) (.*)$", line)
        if heading and found and len(heading[1]) <= level:
            break
        if heading and not found and _anchor(heading[2]) == anchor:
            level = len(heading[1])
        if level:
            found.append(line)
    if not found:
        raise UpstreamError(f"no section #{anchor}")
    return "\n".join(found) + "\n"


def _own_paragraphs(section: str, name: str) -> str:
    """Where a section describes several PRs, each from a paragraph that opens with its bold name: that PR's part."""
    paragraphs = section.split("\n\n")
    opens = [i for i, text in enumerate(paragraphs) if text.startswith("**[`")]
    mine = next((i for i in opens if paragraphs[i].startswith(f"**[`{name}`]")), None)
    if mine is None:
        return section
    end = next((i for i in opens if i > mine), len(paragraphs))
    return "\n\n".join([paragraphs[0], *paragraphs[mine:end]]).rstrip() + "\n"


def _anchor(heading: str) -> str:
    return re.sub(r"[^a-z0-9 _-]", "", heading.lower()).replace(" ", "-")


def write_branch(pr: PullRequest, tree: Path, base: str) -> tuple[str, list[str]]:
    """`upstream/NAME` in `tree` (the series applied on `base`): its name and its commits' subjects, oldest first."""
    commits = git(tree, "rev-list", "--reverse", f"{base}..loadpolicy").stdout.split()
    if len(commits) < pr.end:
        raise UpstreamError(f"{tree} has {len(commits)} commits on {base}; {pr.name} ends at patch {pr.end}")
    branch = f"upstream/{pr.name.replace(':', '-')}"
    start = base if pr.size.alone else commits[pr.end - 1]
    git(tree, "branch", "--force", branch, start)
    if pr.size.alone:
        worktree = tree.parent / f"{tree.name}-{branch.replace('/', '-')}"
        git(tree, "worktree", "add", "--force", str(worktree), branch)
        try:
            picked = git(worktree, "cherry-pick", *commits[pr.first - 1 : pr.end], check=False)
            if picked.returncode:
                raise UpstreamError(f"{pr.name} does not apply alone to {base}:\n{picked.stderr.strip()}")
        finally:
            git(tree, "worktree", "remove", "--force", str(worktree))
    subjects = git(tree, "log", "--reverse", "--format=%s", f"{base}..{branch}").stdout.splitlines()
    return branch, subjects


def render_description(pr: PullRequest, branch: str, subjects: list[str], tests: list[str], base: str) -> str:
    """What the branch holds, then the PR's description."""
    size = pr.size
    on = f"the pristine sources ({base})" if size.alone else f"the series up to it (it needs {pr.needs})"
    own = subjects[-size.patches :]
    lines = [
        f"<!-- written by `loadpolicy dev series branch {pr.name}`: the branch, then docs/upstream's description -->",
        f"Branch `{branch}`: {len(own)} commit(s) of its own on {on}; {size.label.split(': ', 1)[1]}.",
        "",
        f"- Size: src +{size.source_added} / -{size.source_removed}, tests +{size.tests_added}.",
        "- Commits: " + "; ".join(own) + ".",
        "- Tests it adds: " + (", ".join(f"`{test}`" for test in tests) or "none") + ".",
        "",
        pr.description.rstrip(),
        "",
    ]
    return "\n".join(lines)


def added_test_files(tree: Path, branch: str, pr: PullRequest) -> list[str]:
    """The test files the PR's own commits add."""
    own = f"{branch}~{pr.size.patches}..{branch}"
    added = git(tree, "diff", "--name-only", "--diff-filter=A", own, "--", "tests").stdout.split()
    return sorted(added)
