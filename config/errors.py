"""The one user-facing error type, and the one place that prints it.

Every command-line entry point of the project (`python -m config`, the charts' and stacks' tools, the workload's
launch, preflight, plan and verify, `tools.*`) raises `UserError` (or a subclass) for a failure its user can fix,
and runs its `main` through `run_cli`, which prints the error and exits with the error's code. Nothing else prints
a user-facing failure or calls `sys.exit` with one.

This module sits on the lowest floor (`config`): every other folder may import it, it imports nothing of theirs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import NoReturn, TextIO

# 2: input refused before anything ran (argparse's and the variable-file loader's convention).
# 1: a failure found while running (a command that ran and did not succeed).
REFUSED = 2
FAILED = 1


class UserError(Exception):
    """A failure the user can fix.

    `str()` is the text as printed: one line per problem, each `FILE: FIELD: what is wrong; the fix`, with the
    parts that apply (`file`: the file the value came from, `field`: the dotted field or the command-line option,
    `fix`: what to change). `exit_code` is `REFUSED` (2) unless the failure was found while running (`FAILED`, 1).
    """

    exit_code: int = REFUSED

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 fix: str | None = None, exit_code: int | None = None):
        self.file, self.field, self.message, self.fix = file, field, message, fix
        if exit_code is not None:
            self.exit_code = exit_code
        text = f"{message}; {fix}" if fix else message
        super().__init__(": ".join(part for part in (file, field, text) if part))

    @classmethod
    def of(cls, lines: Iterable[object], *, exit_code: int | None = None) -> UserError:
        """One error listing several problems (each already `FILE: FIELD: message`), one per line."""
        return cls("\n".join(str(line) for line in lines), exit_code=exit_code)


def report(error: UserError, stream: TextIO | None = None) -> int:
    """Print `error` to stderr (or `stream`) and return its exit code."""
    print(str(error), file=stream if stream is not None else sys.stderr)
    return error.exit_code


def run_cli(main: Callable[..., int | None], *args: object) -> NoReturn:
    """Run a command's `main(*args)` and exit: with its return code, or with a `UserError`'s printed and its code."""
    try:
        code = main(*args)
    except UserError as error:
        code = report(error)
    raise SystemExit(code or 0)
