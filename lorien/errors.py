"""Exceptions raised by Lorien. Each carries the offending value in its message."""

from __future__ import annotations


class LorienError(Exception):
    """Base class of every error Lorien raises on purpose."""


class TargetError(LorienError, ValueError):
    """A target string that cannot be parsed, or names an unknown kind."""


class WorkloadError(LorienError, ValueError):
    """A workload that cannot be built: unknown operator, wrong shapes or arguments."""


class RecordParseError(LorienError, ValueError):
    """A log line that cannot be decoded; names the file and line."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None):
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(f"{where}{message}")


class UnknownFormatError(LorienError, ValueError):
    """A log whose format cannot be detected."""


class StoreError(LorienError):
    """A store that cannot be opened, read or written."""


class StoreUnreachableError(StoreError):
    """A store whose endpoint or path cannot be reached."""


class DialectError(LorienError, LookupError):
    """An unknown dialect name, or a dialect plugin that fails to load."""


class ConfigError(LorienError, ValueError):
    """A tuning configuration or job specification that does not parse or validate."""
