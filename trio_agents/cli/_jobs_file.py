"""The files of ``trio-agents batch``: the jobs JSONL it reads and the outcomes JSONL it writes.

A jobs file has one job per line: a JSON object with ``prompt`` (required) and optionally
``key``, ``session_id``, ``user_id`` and ``metadata`` (camelCase spellings too), or a JSON
string (the prompt).  Blank lines are skipped.  A line that is none of these is reported
with its number; the command refuses the file, or skips the line with ``--skip-bad``.

The outcomes file gets one line per job that ended on its own (completed or failed), exactly
once across re-runs: on opening, the keys it holds are read (a last line cut off by a crash is
removed), and lines are appended only for keys it does not hold.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from .._exceptions import UsageError
from ..stores._batches import FinishedJob, Job

__all__ = ["BadLine", "OutcomesFile", "read_jobs"]

_FIELDS = {
    "prompt": "prompt",
    "key": "key",
    "session_id": "session_id",
    "sessionId": "session_id",
    "user_id": "user_id",
    "userId": "user_id",
    "metadata": "metadata",
}


@attrs.frozen
class BadLine:
    line: int
    problem: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.problem}"


def _job_of(value: Any) -> Job:
    if isinstance(value, str):
        return Job(prompt=value)
    if not isinstance(value, dict):
        raise UsageError(f"a job is a JSON object or string, not {type(value).__name__}")
    unknown = sorted(set(value) - set(_FIELDS))
    if unknown:
        raise UsageError(f"unknown field(s) {', '.join(map(repr, unknown))}")
    if "prompt" not in value:
        raise UsageError("the job has no prompt")
    return Job(**{_FIELDS[k]: v for k, v in value.items()})


def read_jobs(path: Path) -> tuple[list[Job], list[BadLine]]:
    """The jobs of ``path`` and the lines that are not jobs.  Raises
    :class:`~trio_agents.UsageError` if the file cannot be read or holds no line at all."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the jobs file {str(path)!r}: {exc}") from None
    jobs: list[Job] = []
    bad: list[BadLine] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            jobs.append(_job_of(json.loads(line)))
        except json.JSONDecodeError as exc:
            bad.append(BadLine(number, f"not JSON ({exc.msg} at column {exc.colno})"))
        except (UsageError, TypeError) as exc:
            bad.append(BadLine(number, str(exc)))
    if not jobs and not bad:
        raise UsageError(f"the jobs file {str(path)!r} is empty: one JSON job per line")
    return jobs, bad


def outcome_line(job: FinishedJob) -> dict[str, Any]:
    return {
        "key": job.key,
        "invocation_id": job.invocation_id,
        **dict(job.outcome),
        "status": job.status,
        "metadata": dict(job.metadata),
    }


class OutcomesFile:
    """Appends one line per finished job, each key once (see the module docstring)."""

    def __init__(self, path: Path, *, forget_status: Iterable[str] = ()) -> None:
        self.path = path
        self.keys: set[str] = set()
        self.cursor = 0  # the last finished_seq written or found written
        self._load(set(forget_status))

    def _load(self, forget: set[str]) -> None:
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
            return
        raw = self.path.read_bytes()
        cut = raw.rfind(b"\n") + 1
        kept: list[bytes] = []
        for number, line in enumerate(raw[:cut].splitlines(), start=1):
            try:
                found = json.loads(line)
                key, status = found["key"], found["status"]
            except (ValueError, KeyError, TypeError):
                raise UsageError(
                    f"{str(self.path)!r} line {number} is not an outcome line; "
                    "give another --out file"
                ) from None
            if status in forget:
                continue
            self.keys.add(key)
            kept.append(line)
        if cut != len(raw) or len(kept) != raw[:cut].count(b"\n"):
            # A line cut off by a crash, or jobs that run again: rewrite what stays, atomically.
            temp = self.path.with_suffix(self.path.suffix + ".tmp")
            temp.write_bytes(b"".join(line + b"\n" for line in kept))
            os.replace(temp, self.path)

    def append(self, jobs: Iterable[FinishedJob]) -> int:
        """Write the jobs whose key the file does not hold; return how many."""
        lines: list[str] = []
        for job in jobs:
            self.cursor = max(self.cursor, job.finished_seq)
            if job.key not in self.keys:
                self.keys.add(job.key)
                lines.append(json.dumps(outcome_line(job), ensure_ascii=False) + "\n")
        if lines:
            with self.path.open("a", encoding="utf-8") as f:
                f.writelines(lines)
                f.flush()
                os.fsync(f.fileno())
        return len(lines)


def statuses(counts: Mapping[str, int]) -> str:
    return "  ".join(f"{status} {n}" for status, n in counts.items() if n)
