"""Atomic file output: nothing half-written, inputs never touched.

Every file dphub produces is written to a temporary sibling and renamed into place with
``os.replace`` (atomic on POSIX and Windows within one file system) after an ``fsync``. A crash at
any point leaves either the old file or the new one, never a torn one.

A full disk (``ENOSPC``, ``EDQUOT``) while writing is not a bug but a condition the user must fix:
it becomes :class:`DiskFullError`, one readable line and exit 2, with the temp file removed. So does
an output location that cannot be written at all (a read-only file system ``EROFS``, no permission
``EACCES``/``EPERM``): :class:`UnwritableError`. :func:`os_error_message` words both for the CLI,
which maps any such ``OSError`` that escapes a command to the same kind of line.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from dphub.errors import ConfigError, DphubError, InputError

#: errno values that mean "the disk (or the user's quota) is full".
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: errno values that mean "this location cannot be written (or read) by this user, at all".
UNWRITABLE_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


class DiskFullError(DphubError):
    """No space left while writing an output; whatever was being written was removed."""


class UnwritableError(DphubError):
    """An output location is on a read-only file system or not writable by this user."""


@contextlib.contextmanager
def disk_full_as_error(where: str | os.PathLike[str] | None) -> Iterator[None]:
    """Turn an ``OSError`` ENOSPC/EDQUOT raised in the block into :class:`DiskFullError`, and
    EROFS/EACCES/EPERM into :class:`UnwritableError`.

    Why: an ``OSError`` is an unexpected crash for the CLI (exit 1, crash log), but a full disk
    or a read-only output location is the user's to fix; the message names the output path only
    (never data).
    """
    try:
        yield
    except OSError as e:
        if e.errno in DISK_FULL_ERRNOS:
            raise _disk_full(where, e.errno) from None
        if e.errno in UNWRITABLE_ERRNOS:
            raise _unwritable(where, e) from None
        raise


def _unwritable(where: str | os.PathLike[str] | None, e: OSError) -> UnwritableError:
    return UnwritableError(os_error_message(e, where))


def os_error_message(e: OSError, where: str | os.PathLike[str] | None = None) -> str:
    """One PHI-free line for an ``OSError`` the user must fix (full disk, read-only, denied).

    ``where`` (the output the user named) is preferred to the file the call failed on, which may
    be a temporary sibling; else the error's own file name. Overlong paths are shortened.
    """
    path = where if where is not None else e.filename
    place = f"{_short_path(path)}: " if path is not None else ""
    reason = e.strerror or os.strerror(e.errno or 0)
    if e.errno in DISK_FULL_ERRNOS:
        return (f"{place}disk full ({reason}); nothing half-written was kept: free some space "
                "and run again")
    if e.errno == errno.EROFS:
        return (f"{place}cannot write ({reason}); choose an output location on a writable "
                "file system")
    if e.errno in (errno.EACCES, errno.EPERM):
        return (f"{place}cannot write or read ({reason}); choose a location you may write, or "
                "fix its permissions")
    return f"{place}{reason}"


def _short_path(path: str | os.PathLike[str] | bytes) -> str:
    text = os.fsdecode(path) if isinstance(path, bytes) else os.fspath(path)
    return text if len(text) <= 200 else text[:100] + "..." + text[-80:]


def _disk_full(where: str | os.PathLike[str] | None, code: int = errno.ENOSPC) -> DiskFullError:
    return DiskFullError(os_error_message(OSError(code, os.strerror(code)), where))


def read_small_file(path: str | os.PathLike[str], cap: int, *, what: str) -> bytes:
    """The bytes of the regular file ``path``, refused (:class:`ConfigError`) unless it is a
    regular file of at most ``cap`` bytes. ``FileNotFoundError`` propagates (callers decide
    whether a missing file is a default or an error); other ``OSError`` s do too.

    Why: ``read_bytes`` then a size check blocked forever on a FIFO and read a link to
    ``/dev/zero`` until ``MemoryError``. The file is opened non-blocking (a FIFO opens at once),
    its type is checked on the open descriptor (no race with a swapped path), and at most
    ``cap + 1`` bytes are read, whatever ``st_size`` says (``/proc`` files report 0).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = ("a named pipe (FIFO)" if stat.S_ISFIFO(mode) else "a directory"
                    if stat.S_ISDIR(mode) else "a device" if stat.S_ISCHR(mode) or
                    stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "special")
            raise ConfigError(f"{_short_path(path)}: {what} must be a regular file, not {kind}")
        chunks: list[bytes] = []
        size = 0
        while size <= cap:
            block = os.read(fd, min(1 << 16, cap + 1 - size))
            if not block:
                break
            chunks.append(block)
            size += len(block)
    finally:
        os.close(fd)
    if size > cap:
        raise ConfigError(f"{_short_path(path)}: {what} is larger than {_size(cap)}")
    return b"".join(chunks)


def _size(n: int) -> str:
    return f"{n // (1 << 20)} MB" if n >= 1 << 20 and n % (1 << 20) == 0 else \
        f"{n // 1024} kB" if n % 1024 == 0 else f"{n} bytes"


def cache_root() -> Path:
    """``$DPHUB_CACHE_DIR`` or the platform's user cache directory for dphub: the root of every
    rebuildable cache (the public warm start, ONNX graphs), each in its own subdirectory."""
    env = os.environ.get("DPHUB_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("dphub"))


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w", encoding: str | None = "utf-8",
                newline: str | None = None) -> Iterator[IO]:
    """Open a temp file next to ``path``; on clean exit fsync and rename it over ``path``."""
    path = Path(path)
    with disk_full_as_error(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    binary = "b" in mode
    try:
        with os.fdopen(fd, mode, encoding=None if binary else encoding,
                       newline=None if binary else newline) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS | UNWRITABLE_ERRNOS:
            with disk_full_as_error(path):
                raise
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    with atomic_open(path, "w", newline="") as fh:
        fh.write(text)


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_open(path, "wb") as fh:
        fh.write(data)


def move_into_place(tmp: Path, path: Path, *, overwrite: bool) -> None:
    """Rename the finished directory ``tmp`` to ``path`` (one rename on the same filesystem).

    An existing non-empty ``path`` is replaced with ``overwrite`` (moved aside first, removed
    after the rename, so ``path`` is never missing a complete directory), else a
    :class:`~dphub.errors.ConfigError` naming ``--force``; an empty one is simply replaced.
    """
    if path.exists() and any(path.iterdir()):
        if not overwrite:
            raise ConfigError(f"{path}: output directory exists and is not empty (use --force)")
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
        return
    if path.exists():
        path.rmdir()
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike[str], *, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory under a temp name and move it to ``path`` only when the block succeeds.

    With ``overwrite`` an existing ``path`` is replaced (moved aside first, removed after the
    rename), otherwise an existing non-empty ``path`` is an error for the caller to prevent.
    """
    path = Path(path)
    with disk_full_as_error(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        move_into_place(tmp, path, overwrite=overwrite)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, DiskFullError) or (
            isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS
        ):
            # name the directory the user asked for, not a file inside its temp copy
            raise _disk_full(path) from None
        if isinstance(e, OSError) and e.errno in UNWRITABLE_ERRNOS:
            raise _unwritable(path, e) from None
        raise


def dphub_home() -> Path:
    """The per-user data directory: ``$DPHUB_HOME`` or the platform's user data dir."""
    env = os.environ.get("DPHUB_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("dphub", appauthor=False))


def private_key(path: Path, nbytes: int) -> bytes:
    """A per-user random secret of ``nbytes`` at ``path``, created (0600) on first use.

    Created whole or not at all: written to a private temporary file, then hard-linked to its
    name, which fails if another process made it first (that key is then used). A file that is
    not a regular 0600 file of this user with the right size is refused, not replaced, so the
    user sees why. A full disk or read-only place while creating it is
    :class:`DiskFullError` / :class:`UnwritableError`; other failures raise :class:`OSError`, and
    a file that is not a private key :class:`ValueError`, which callers name in their own error.
    """
    if not path.exists():
        with disk_full_as_error(path):  # a full disk is the user's to fix: one line naming it
            _create_private_key(path, nbytes)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        key = fh.read(nbytes + 1)
    if (not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077
            or len(key) != nbytes):
        raise ValueError(f"not a private key file ({nbytes} bytes, mode 600)")
    return key


def _create_private_key(path: Path, nbytes: int) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(nbytes))
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        os.unlink(tmp)


def hash_file(h: Any, path: str | os.PathLike[str]) -> Any:
    """Feed the file's bytes to the hash object ``h`` in 1 MiB blocks (any size, flat memory)."""
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h


def file_sha256(path: str | os.PathLike[str]) -> str:
    return hash_file(hashlib.sha256(), path).hexdigest()


def jsonl_lines(path: str | os.PathLike[str], *, errors: str = "strict"
                ) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a JSON Lines file, split on ``\\n`` only, one line at a time.

    Why not ``str.splitlines()`` or a text-mode file: JSON Lines separates records with ``\\n``
    alone, and ``json.dumps(..., ensure_ascii=False)`` writes U+2028, U+2029 and U+0085 raw
    inside strings (note text holds them: pasted notes, old EHR exports). ``splitlines`` cuts a
    record at each of them, and text mode turns a stray ``\\r`` into a line end; reading bytes
    and splitting on ``b"\\n"`` keeps every record whole. The line keeps its ``\\n`` (and a CRLF
    file's ``\\r``: both are JSON whitespace). ``errors`` is the UTF-8 decoding's; with
    ``strict`` a bad byte raises :class:`InputError` naming the file and line (never the bytes).
    """
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = raw.decode("utf-8", errors)
            except UnicodeDecodeError:
                raise InputError(f"{path}:{lineno}: not valid UTF-8") from None
            yield lineno, line
