"""The one marker for errors a user can fix.

Every room raises its own exception type (``DataFormatError``, ``BundleError``, ``BusError``,
...); each also derives from ``UserError``, whose message already says what went wrong, where
(file, column, row, servo) and what to do. The CLI prints such an error as one line and exits
2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = ["UserError"]


class UserError(Exception):
    """A problem with the user's input, files or hardware, explained by its message."""
