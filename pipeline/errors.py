"""Errors that say which file, which key and what was wrong."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One finding about one document: where it is, what is wrong, how bad."""

    file: str
    path: str
    message: str
    severity: str = "error"  # "error" or "warning"
    rule: str = ""  # rules-pack rule id; empty for field problems
    line: int = 0  # 1-based source line, 0 when unknown

    def __str__(self) -> str:
        where = self.file
        if self.line:
            where += f":{self.line}"
        tag = self.severity if not self.rule else f"{self.severity} [{self.rule}]"
        path = self.path or "(document)"
        return f"{tag}: {where}: {path}: {self.message}"


class DocumentError(ValueError):
    """A document could not be read or failed validation.

    Carries every problem found (not just the first) so a caller can print them all.
    """

    def __init__(self, problems: list[Problem] | Problem):
        self.problems: list[Problem] = problems if isinstance(problems, list) else [problems]
        super().__init__("\n".join(str(p) for p in self.problems))

    @property
    def file(self) -> str:
        return self.problems[0].file

    @property
    def path(self) -> str:
        return self.problems[0].path


class RefusalError(ValueError):
    """The kernel refuses a deployment: names the setting, the value and why."""

    def __init__(self, setting: str, value: object, reason: str):
        self.setting = setting
        self.value = value
        self.reason = reason
        super().__init__(f"{setting} = {value!r}: {reason}")
