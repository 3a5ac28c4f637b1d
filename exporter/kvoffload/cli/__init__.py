"""The `kvoffload` command: serve (the sidecar), record, analyze, generate, sim, demo and
healthcheck, one file each, registered here."""

from __future__ import annotations

import sys

import click

from kvoffload import __version__

# The command modules, not their commands: a package attribute named like a submodule would
# hide it (monkeypatching `kvoffload.cli.analyze.Progress` must reach the module).
from kvoffload.cli import analyze, demo, generate, healthcheck, record, serve, sim
from kvoffload.cli.flags import ENV_HELP, ExporterGroup, log_options
from kvoffload.cli.options import EXIT_BAD_INPUT
from kvoffload.errors import InputError
from kvoffload.recording import blocks


@click.group(
    cls=ExporterGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    params=log_options(defaults=True),
    epilog=ENV_HELP,
)
@click.version_option(
    __version__,
    prog_name="kvoffload",
    message="%(prog)s %(version)s (recording scan: "
    + ("compiled" if blocks.COMPILED else "pure Python")
    + ")",
)
def cli() -> None:
    """Is vLLM's CPU KV offloading paying off, and how big should the CPU tier be?"""


for _module in (serve, record, analyze, generate, sim, demo, healthcheck):
    cli.add_command(getattr(_module, _module.__name__.rsplit(".", 1)[1]))


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="kvoffload", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_BAD_INPUT if exc.exit_code == 2 else exc.exit_code)
    except InputError as exc:
        click.echo(f"kvoffload: error: {exc}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":  # pragma: no cover
    main()
