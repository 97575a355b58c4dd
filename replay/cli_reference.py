"""The CLI reference, docs/cli.md, written from every command's own --help:

    python -m replay.cli_reference > docs/cli.md

tests/cli/test_docs.py regenerates it and fails when the committed page differs.
"""
import sys

import typer

from replay.cli import app

# A fixed width, so that the page does not depend on the terminal that made it.
WIDTH = 100
HEADER = """# Command-line reference

Every command's `--help`, as `python -m replay.cli_reference` prints it: do not edit this page
by hand, regenerate it. What the options do together is in the other pages of the
[documentation](../README.md#where-to-read-more).
"""


def context(command, name, parent=None):
    # Plain text, not rich's boxes: Typer formats with Click's own formatter when a command
    # has no markup mode. (Typer carries its own copy of Click: the command makes its context.)
    command.rich_markup_mode = None
    return command.context_class(command, info_name=name, parent=parent, terminal_width=WIDTH,
                                 max_content_width=WIDTH)


def commands(command, ctx):
    """(context, command) for COMMAND and every command under it, depth first, in the order
    the group lists them."""
    yield ctx, command
    if isinstance(command, typer.core.TyperGroup):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            yield from commands(sub, context(sub, name, ctx))


def reference() -> str:
    root = typer.main.get_command(app)
    ctx = context(root, "replay")
    parts = [HEADER]
    for sub_ctx, command in commands(root, ctx):
        text = command.get_help(sub_ctx).rstrip()
        parts.append(f"\n## {sub_ctx.command_path}\n\n```\n{text}\n```\n")
    return "".join(parts)


if __name__ == "__main__":
    sys.stdout.write(reference())
