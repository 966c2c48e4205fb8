"""Errors that the CLI turns into a one-line message and an exit code (never a traceback)."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: a one-line message, exit code 2 by default."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
