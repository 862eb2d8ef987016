"""The files of ``trio-agents batch``: the jobs JSONL it reads and the outcomes JSONL it writes.

A jobs file has one job per line: a JSON object with ``prompt`` (required) and optionally
``key``, ``session_id``, ``user_id`` and ``metadata`` (camelCase spellings too), or a JSON
string (the prompt).  Blank lines are skipped.  A line that is none of these is reported
with its number; the command refuses the file, or skips the line with ``--skip-bad``.

The outcomes file gets one line per job that ended on its own (completed or failed), exactly
once across re-runs: on opening, the keys it holds are read (a last line cut off by a crash is
removed), and lines are appended only for keys it does not hold.

One writer at a time.  That rule holds only while a single process appends, so the process
that opens the file (:func:`open_outcomes`) holds an exclusive ``flock`` on ``OUT.lock`` beside
it for as long as it may write, and another ``trio-agents batch`` given the same file is
refused at once (:class:`OutcomesBusy`, naming the writer's pid, host and batch), before it
touches the store.  The kernel drops the lock when its process dies, however it dies, so a
killed run never blocks the next one.  The lock file is removed when the writer is done; the
promise is per file: two runs of one batch writing two files (two machines sharing a
PostgreSQL store) each get every job once.  ``flock`` works between processes of one machine,
and across machines only on a network file system that supports locks.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from .._exceptions import UsageError
from ..stores._batches import FinishedJob, Job

__all__ = ["BadLine", "OutcomesBusy", "OutcomesFile", "open_outcomes", "read_jobs"]

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


class OutcomesBusy(UsageError):
    """Another process writes the outcomes file (see the module docstring)."""


@contextlib.contextmanager
def open_outcomes(
    path: Path, *, batch_id: str, forget_status: Iterable[str] = ()
) -> Iterator[OutcomesFile]:
    """The outcomes file at ``path``, with this process its only writer until the block is
    left: the lock is taken before the file is read, and released (its lock file removed)
    after the block.  Raises :class:`OutcomesBusy` if another process holds it, and
    :class:`~trio_agents.UsageError` if the file cannot be written or is not an outcomes
    file.  Jobs whose line says a status in ``forget_status`` lose it (they run again)."""
    lock = path.with_name(path.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = _lock(lock, path, batch_id)
    except OSError as exc:
        raise UsageError(f"cannot write the outcomes file {str(path)!r}: {exc}") from None
    try:
        yield OutcomesFile(path, forget_status=forget_status)
    finally:
        # Removed while still locked: a process that opened it meanwhile finds, once it has
        # the lock, that the file it locked is no longer the one at the path, and opens anew.
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def _lock(lock: Path, path: Path, batch_id: str) -> int:
    """Lock ``lock`` (created if needed), the lock file of ``path``, exclusively; write who
    holds it; return its fd.  Raises :class:`OutcomesBusy` if another process holds it."""
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutcomesBusy(
                f"{str(path)!r} is being written by another "
                f"trio-agents batch ({holder}); wait for it to end, or give this run "
                "another --out"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        try:
            mine = os.path.samestat(os.stat(lock), os.fstat(fd))
        except FileNotFoundError:
            mine = False
        if mine:
            break
        os.close(fd)  # its writer removed it after we opened it: take the one at the path
    since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    about = {"pid": os.getpid(), "host": socket.gethostname(), "batch": batch_id, "since": since}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(about).encode() + b"\n", 0)
    return fd


def _holder(fd: int) -> str:
    """Who holds the lock, as its file says.  The holder writes it just after taking the lock,
    so a file still empty is read again for up to :data:`_HOLDER_SAYS_WITHIN` seconds."""
    give_up = time.monotonic() + _HOLDER_SAYS_WITHIN
    while True:
        try:
            about = json.loads(os.pread(fd, 4096, 0))
            return (
                f"pid {int(about['pid'])} on {about['host']}, batch {about['batch']}, "
                f"since {about['since']}"
            )
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() >= give_up:
                return "a process that has not said which yet"
            time.sleep(0.01)


_HOLDER_SAYS_WITHIN = 1.0


class OutcomesFile:
    """Appends one line per finished job, each key once (see the module docstring).  Made by
    :func:`open_outcomes`, which makes this process the file's only writer."""

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
        if len(kept) != raw[:cut].count(b"\n"):
            # Jobs that run again lose their lines: rewrite what stays, atomically.
            temp = self.path.with_suffix(self.path.suffix + ".tmp")
            with temp.open("wb") as f:
                f.writelines(line + b"\n" for line in kept)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.path)
        elif cut != len(raw):
            # The last line was cut off by a crash (its job's line is written again).
            os.truncate(self.path, cut)

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
