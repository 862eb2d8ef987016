"""The chat's terminal: what streams above, the line a person types below, kept apart.

The terminal is put in cbreak mode (no echo, keys one by one; Ctrl-C still sends SIGINT), so
keystrokes are never mixed into the streamed text.  :class:`Screen` is the file the chat's
console writes to.  It keeps the last line of output that is not finished yet (the *tail*)
and draws one *bottom* line under it: the input line (the prompt and what was typed so far)
when the person is typing, is asked a question or may type; otherwise the spinner of the
tools running, if any.  Each write of output erases the bottom line, puts the cursor back at
the end of the tail (it prints the tail's last row again), writes, and draws the bottom line
again.  Enter erases it and the typed line is written as output, as the person's line.

Who owns what
    :func:`cbreak` restores the terminal's settings however the chat ends.  The reader of
    the keys is one worker thread at a time (``os.read`` on stdin, abandoned on cancel: a
    blocked read cannot be interrupted; it ends with the process).  Every :class:`Screen`
    method runs in the trio thread; a lock still serialises writes, in case a library writes
    to the console from a thread of its own.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import re
import shutil
import sys
import termios
import threading
import tty
from collections.abc import Callable, Iterator
from typing import TextIO

from rich.cells import cell_len

__all__ = ["Keys", "Screen", "cbreak"]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


@contextlib.contextmanager
def cbreak(fd: int) -> Iterator[None]:
    """The terminal ``fd`` in cbreak mode (no echo, no line editing) for the block."""
    saved = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd, termios.TCSANOW)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


def _rows(cells: int, width: int) -> int:
    """How many rows ``cells`` cells take (at least one)."""
    return max(1, -(-cells // width))


class Screen:
    """Output above, one bottom line below (see the module docstring).  ``bottom`` says what
    the bottom line is now: a callable returning its text with ANSI styles, or ``""``."""

    def __init__(self, stream: TextIO, bottom: Callable[[], str]) -> None:
        self.stream = stream
        self.bottom = bottom
        self.tail = ""  # the output's unfinished last line, with its styles
        self._drawn = 0  # cells of the bottom line on the screen; -1: none
        self._shown = False
        self._frame = 0
        self._lock = threading.RLock()
        self._out: list[str] = []  # what this change of the screen writes

    # ---- the file the console writes to ---------------------------------------------------

    def write(self, text: str) -> int:
        if not text:
            return 0
        with self._lock:
            self._erase()
            self._output(text)
            self._draw()
            self._send()
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        return self.stream.fileno()

    # ---- the bottom line --------------------------------------------------------------------

    def redraw(self) -> None:
        """Draw the bottom line again (what was typed changed, or the spinner turned)."""
        with self._lock:
            self._frame += 1
            self._erase()
            self._draw()
            self._send()

    def spinner(self) -> str:
        return _SPINNER[self._frame % len(_SPINNER)]

    def end_line(self) -> None:
        """Finish the output's unfinished line, if there is one."""
        if self.tail:
            self.write("\n")

    def _width(self) -> int:
        return max(10, shutil.get_terminal_size().columns)

    def _send(self) -> None:
        """Write what one change of the screen wrote, at once (a reader never sees half)."""
        self.stream.write("".join(self._out))
        self.stream.flush()
        self._out.clear()

    def _output(self, text: str) -> None:
        self._out.append(text)
        _, newline, rest = text.rpartition("\n")
        self.tail = rest if newline else self.tail + text

    def _erase(self) -> None:
        """Take the bottom line off; the cursor goes back to the end of the tail."""
        if not self._shown:
            return
        self._shown = False
        width = self._width()
        up = _rows(self._drawn, width) - 1
        self._out.append("\r" + (f"\x1b[{up}A" if up else "") + "\x1b[J")
        if self.tail:
            self._out.append("\x1b[A\r" + self._last_row(width))

    def _draw(self) -> None:
        text = self.bottom()
        if not text:
            return
        self._out.append(("\n" if self.tail else "") + text)
        self._drawn = cell_len(_ANSI.sub("", text))
        self._shown = True

    def _last_row(self, width: int) -> str:
        """The tail's last row on the screen: the whole tail (styled) when it fits one row,
        else the plain text of its last row."""
        plain = _ANSI.sub("", self.tail)
        if cell_len(plain) <= width:
            return self.tail
        start, used = 0, 0
        for i, char in enumerate(plain):
            cells = cell_len(char)
            if used + cells > width:
                start, used = i, 0
            used += cells
        return plain[start:]


class Keys:
    """Turns the bytes a person types into edits of ``line`` and finished lines: Enter ends
    a line, Backspace, Ctrl-U and Ctrl-W edit it, Ctrl-D on an empty line is the end of
    input (``None``); escape sequences (arrow keys, ...) are ignored."""

    def __init__(self) -> None:
        self.line = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._escape = ""  # an escape sequence being skipped

    def feed(self, data: bytes) -> list[str | None]:
        """The lines finished by ``data`` (``None`` for the end of input), in order."""
        done: list[str | None] = []
        for char in self._decoder.decode(data):
            if self._escape:
                self._escape += char
                if len(self._escape) == 2 and char not in "[O":
                    self._escape = ""  # Alt+key: ignored
                elif len(self._escape) > 2 and ("@" <= char <= "~"):
                    self._escape = ""
                continue
            if char == "\x1b":
                self._escape = char
            elif char in "\r\n":
                done.append(self.line)
                self.line = ""
            elif char in "\x7f\x08":
                self.line = self.line[:-1]
            elif char == "\x15":  # Ctrl-U
                self.line = ""
            elif char == "\x17":  # Ctrl-W
                self.line = self.line.rstrip().rpartition(" ")[0]
                self.line += " " if self.line else ""
            elif char == "\x04":  # Ctrl-D
                if not self.line:
                    done.append(None)
            elif char == "\t":
                self.line += " "
            elif char >= " ":
                self.line += char
        return done


def read_keys() -> bytes:
    """What the person typed since the last call (blocks; run it in a worker thread)."""
    return os.read(sys.stdin.fileno(), 1024)
