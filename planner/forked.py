"""Independent pieces of one answer side by side: each in a forked process (POSIX os.fork), its
result pickled back through a pipe. Where os.fork is missing or fails the piece runs at once in
this process; the answer is the same either way.

Only for single-threaded callers, the CLI: forking a process whose other threads hold locks can
deadlock the child (the planning API defaults to one worker).
"""

from __future__ import annotations

import os
import pickle


def start(fn, *args):
    """Run fn(*args) in a forked child; return a function that waits for it and returns what it
    returned (or raises what it raised)."""
    read = write = None
    try:
        read, write = os.pipe()
        pid = os.fork()
    except (AttributeError, OSError):  # no fork here (Windows), or none allowed now: run it at once
        for fd in (read, write):
            if fd is not None:
                os.close(fd)
        outcome = _outcome(fn, args)
        return lambda: _unwrap(outcome)
    if pid == 0:  # the child: its answer down the pipe, then out without the parent's exit handlers
        try:
            os.close(read)
            with os.fdopen(write, "wb") as pipe:
                pipe.write(pickle.dumps(_outcome(fn, args)))
        finally:
            os._exit(0)
    os.close(write)

    def wait():
        with os.fdopen(read, "rb") as pipe:
            data = pipe.read()
        os.waitpid(pid, 0)
        if not data:
            raise RuntimeError(f"a forked search (process {pid}) ended without an answer")
        return _unwrap(pickle.loads(data))

    return wait


def _outcome(fn, args) -> tuple:
    try:
        return True, fn(*args)
    except Exception as exc:  # handed to the parent, raised there
        return False, exc


def _unwrap(outcome: tuple):
    ok, value = outcome
    if not ok:
        raise value
    return value
