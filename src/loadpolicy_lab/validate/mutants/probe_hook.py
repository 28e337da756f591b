"""Whether the lines a mutation changes run: copied beside the code a check's baseline runs on, as `_loadpolicy_probe`.

`loadpolicy dev mutants` appends a call of `watch` to every module a mutation of the table changes, in the copy its
check's baseline runs on. Each process that imports the module (every rank, every subprocess of a test) then traces
calls into it and, the first time one of a row's lines runs, writes a file named after the row into the folder the call
names. Python 3.11 has no `sys.monitoring`: the trace is `sys.settrace` (and `threading.settrace` for the threads
started later), which looks only at frames of watched code objects and is taken off once every row of this process has
run. A row whose lines run when the module is imported (a class attribute, a module constant) is recorded by `watch`
itself. Standard library only: it runs inside the code under test.
"""

from __future__ import annotations

import os
import sys
import threading
from types import CodeType, FrameType
from typing import Any


TraceFunction = Any  # sys.settrace's callback type is private to typeshed
_LOCK = threading.Lock()
_PENDING: dict[str, dict[str, frozenset[int]]] = {}  # file -> row -> its lines, for the rows not seen yet here
_FOLDER: dict[str, str] = {}  # row -> the folder its record goes to
_CODES: dict[int, tuple[CodeType, frozenset[int]]] = {}  # id(code) -> (code, its lines): code objects stay alive


def watch(rows: dict[str, list[int]], at_import: list[str], folder: str) -> None:
    """Record `at_import` now, and each row of `rows` once one of its lines runs in a function of the calling
    module."""
    filename = sys._getframe(1).f_code.co_filename
    for row in at_import:
        _record(folder, row, "at import")
    with _LOCK:
        watched = _PENDING.setdefault(filename, {})
        for row, lines in rows.items():
            watched[row] = frozenset(lines)
            _FOLDER[row] = folder
    if rows:
        threading.settrace(_on_call)
        sys.settrace(_on_call)


def _record(folder: str, row: str, where: str) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, row), "a", encoding="utf-8") as file:
        file.write(f"{where} (pid {os.getpid()})\n")


def _lines(code: CodeType) -> frozenset[int]:
    known = _CODES.get(id(code))
    if known is None or known[0] is not code:
        known = (code, frozenset(line for _, _, line in code.co_lines() if line is not None))
        _CODES[id(code)] = known
    return known[1]


def _on_call(frame: FrameType, event: str, arg: object) -> TraceFunction:
    """The global trace: a local trace for a frame of a watched module whose code holds a watched line, else none."""
    watched = _PENDING.get(frame.f_code.co_filename)
    if not watched or event != "call":
        return None
    lines = _lines(frame.f_code)
    if not any(lines & rows for rows in watched.values()):
        return None
    return _on_line


def _on_line(frame: FrameType, event: str, arg: object) -> TraceFunction:
    if event != "line":
        return _on_line
    filename = frame.f_code.co_filename
    with _LOCK:
        watched = _PENDING.get(filename, {})
        hit = [row for row, lines in watched.items() if frame.f_lineno in lines]
        for row in hit:
            del watched[row]
            _record(_FOLDER[row], row, f"line {frame.f_lineno}")
        if not watched:
            _PENDING.pop(filename, None)
        done = not _PENDING
    if done:  # nothing left to see in this process: tracing off for new calls and threads
        threading.settrace(None)
        sys.settrace(None)
        return None
    return _on_line
