"""The one exception type for problems a user can fix."""

from __future__ import annotations

import reprlib


class FedrcError(Exception):
    """A bad option, a missing or corrupt file: the CLI prints the message on one line and exits 2.

    The message names the option or file and says what was expected.
    """


def counted(n: int, noun: str) -> str:
    """A count in a message: "1 cluster", "2 clusters" (a noun whose plural takes an s)."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def first_few(names: list[str], most: int = 3) -> str:
    """Up to `most` names for a message, with "…" when there are more."""
    return ", ".join(names[:most]) + (", …" if len(names) > most else "")


class FedrcWarning(UserWarning):
    """Something a user should know that does not stop the command: the CLI prints the
    message on one line (`warnings.warn(FedrcWarning(...))` in the library)."""


def brief(value: object, most: int = 80) -> str:
    """`repr(value)` for a message, at most `most` characters: a value read from a user's file
    may be huge (a long list, a YAML alias expanded), and a message is one line."""
    text = _SHORT.repr(value)
    return text if len(text) <= most else text[: most - 1] + "…"


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxtuple = 3, 6, 4, 6
_SHORT.maxstring = _SHORT.maxother = 60
