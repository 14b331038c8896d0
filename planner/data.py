"""Every file the planner reads or writes goes through here: bounded JSON in, atomic files out.

Catalogs (data/models.json, gpus.json, coefficients.json) are read once per process. Files named
by users (a config.json, later calibration profiles and DeepSpeed configs) are bounded in size
and nesting depth before they are parsed, so a hostile file costs at most MAX_FILE_BYTES of
reading and never recurses deeply.
"""

from __future__ import annotations

import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

from planner.errors import InputError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
MAX_FILE_BYTES = 4 * 2**20
"""Largest user file read (4 MiB; a Hugging Face config.json is a few KiB)."""
MAX_DEPTH = 32
"""Deepest JSON nesting accepted (config.json files nest 2-4 levels)."""


def _depth_exceeds(text: str, limit: int) -> bool:
    """True when brackets outside strings nest deeper than `limit` (checked before json.loads
    recurses: CPython's parser raises RecursionError near 1000 levels)."""
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def read_json(path, flag: str, max_bytes: int = MAX_FILE_BYTES, max_depth: int = MAX_DEPTH):
    """Parse a user's JSON file; any problem is one InputError naming `flag`."""
    where = str(path)
    try:
        if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
            # a FIFO or socket would block open() or read() forever; a device need not end
            raise InputError(f"{flag}: {where!r} is not a regular file")
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise InputError(f"{flag}: no such file {where!r}") from None
    except IsADirectoryError:
        raise InputError(f"{flag}: {where!r} is a directory, not a JSON file") from None
    except OSError as exc:
        raise InputError(f"{flag}: cannot read {where!r} ({exc.strerror or exc})") from None
    except ValueError as exc:  # e.g. an embedded NUL character in the path
        if isinstance(exc, InputError):
            raise
        raise InputError(f"{flag}: cannot read {where!r} ({exc})") from None
    if len(raw) > max_bytes:
        raise InputError(f"{flag}: {where!r} is larger than {max_bytes // 2**20} MiB; not a config file")
    return parse_json(raw, flag, where, max_depth)


def parse_json(raw: bytes | str, flag: str, where: str = "input", max_depth: int = MAX_DEPTH):
    """Parse bounded JSON text (bytes or str); errors name `flag`."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, (bytes, bytearray)) else raw
    except UnicodeDecodeError:
        raise InputError(f"{flag}: {where!r} is not UTF-8 text") from None
    if len(text) > MAX_FILE_BYTES:
        raise InputError(f"{flag}: {where!r} is larger than {MAX_FILE_BYTES // 2**20} MiB; not a config file")
    if _depth_exceeds(text, max_depth):
        raise InputError(f"{flag}: {where!r} nests deeper than {max_depth} levels; not a config file")
    try:
        # JSON has no NaN/Infinity; Python's parser accepts them unless told otherwise
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except ValueError as exc:
        raise InputError(f"{flag}: {where!r} is not valid JSON ({str(exc).splitlines()[0]})") from None


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} overflows a 64-bit float")
    return value


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


@lru_cache(maxsize=None)
def catalog(name: str) -> dict:
    """One of the shipped catalogs in data/ (models.json, gpus.json, coefficients.json), parsed once."""
    with open(DATA_DIR / name) as f:
        return json.load(f)


def atomic_write(path: Path, text: str, mode: int = 0o644, flag: str = "--emit") -> None:
    """Write `text` to `path` through a temporary file in the same directory and os.replace, so a
    reader, or a writer killed half-way, never sees a partial file; OSError becomes one InputError
    naming `flag`. `mode` is filtered by the process umask like open() would."""
    path = Path(path)
    umask = os.umask(0)
    os.umask(umask)
    fd, tmp = None, None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            fd = None
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode & ~umask)
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise InputError(f"{flag}: cannot write {str(path)!r}: {exc.strerror or exc}") from None
    finally:
        if fd is not None:
            os.close(fd)
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
