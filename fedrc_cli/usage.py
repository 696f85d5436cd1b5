"""Mistakes on the command line itself, one line each, like every other error of fedrc.

Click reports a bad option (`--lr abc`, `--lrr`, a missing value) in a box of several lines;
`OneLineGroup` prints it as one red line naming the option, exit code 2.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import typer.core

# Typer 0.29 carries its own copy of Click (`typer._click`); older Typer (the Flower extra's
# environment) uses Click itself: the exceptions are those of the copy in use.
CLICK = "typer._click" if hasattr(typer.core, "_click") else "click"
errors: Any = importlib.import_module(f"{CLICK}.exceptions")
HELP_SHOWN: Any = getattr(errors, "NoArgsIsHelpError", ())  # Click 8.2+: the help, not an error


class OneLineGroup(typer.core.TyperGroup):
    """fedrc's command groups: a usage error is one line naming the option, exit code 2."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:
        try:
            code = super().main(*args, standalone_mode=False, **kwargs)
        except HELP_SHOWN as e:  # the help is printed already
            code = e.exit_code
        except errors.ClickException as e:
            from fedrc_cli.common import fail  # the console: imported once a line is due

            ctx = getattr(e, "ctx", None)
            hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
            code = fail(e.format_message() + hint, e.exit_code).exit_code
        except typer.Abort:
            code = 1
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)
