"""The documentation stays true to the code: docs/cli.md is what the commands' --help prints
today, every command is in it with help of its own, and every relative link of the Markdown
pages leads to a file and heading that exist."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLI_MD = REPO / "docs" / "cli.md"
PAGES = sorted([REPO / "README.md", REPO / "bench" / "README.md", REPO / "traces" / "README.md",
                *(REPO / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_cli_reference_is_current():
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-m", "replay.cli_reference"], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == CLI_MD.read_text(), \
        "docs/cli.md is stale: run `python -m replay.cli_reference > docs/cli.md`"


def test_every_command_has_help_and_is_in_the_cli_reference():
    import typer

    from replay.cli import app
    from replay.cli_reference import commands, context

    page = CLI_MD.read_text()
    root = typer.main.get_command(app)
    seen = 0
    for ctx, command in commands(root, context(root, "replay")):
        assert command.help, f"`{ctx.command_path}` has no help"
        assert f"\n## {ctx.command_path}\n" in page, f"`{ctx.command_path}` is not in docs/cli.md"
        seen += 1
    assert seen > len(root.commands), "the reference walked no subcommands"


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def prose(path: Path):
    """The lines of a Markdown page outside fenced code blocks."""
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield line


def anchors(path: Path) -> set:
    return {slug(line.lstrip("#")) for line in prose(path) if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page):
    links = [m for line in prose(page) for m in LINK.findall(line)]
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue  # an absolute URL: not checked offline
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        assert path.exists(), f"{page.relative_to(REPO)}: link to missing {target}"
        if anchor:
            assert path.suffix == ".md" and anchor in anchors(path), \
                f"{page.relative_to(REPO)}: no heading #{anchor} in {path.relative_to(REPO)}"
