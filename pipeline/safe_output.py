"""Outputs that never destroy an input, never leave a partial file, and clean up after a signal.

Every writer of the package goes through here:

* :func:`check_outputs` refuses an output that is one of the inputs (the same resolved path,
  or the same file reached another way: a hard link, a symlink, a bind mount — compared by
  device and inode), two outputs that are the same file, and a target that is a directory,
  a FIFO, a device or a socket. A symlinked output is written through: the link stays and
  the file it points to is replaced.
* :func:`atomic` yields a temporary name beside the target (same directory, so the final
  rename is atomic and never crosses a file system) and renames it over the target only
  when the block succeeds; on failure the temporary file is removed.
* :func:`temp_dir` makes a scratch directory, removed when the block ends.
* :func:`install_signal_handlers` makes SIGINT and SIGTERM remove every temporary file and
  directory still registered, then exit with 128 + the signal number.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from types import FrameType

__all__ = ["UnsafeOutput", "atomic", "check_outputs", "check_target", "cleanup", "commit",
           "discard", "install_signal_handlers", "make_temp_dir", "release", "remove_temp_dir",
           "same_file", "temp_dir", "temp_name"]

_TEMPS: dict[str, bool] = {}  # path -> is a directory
_STOPS: list[Callable[[], object]] = []  # called first on a signal
_LOCK = threading.Lock()
_INSTALLED = False

PathLike = str | os.PathLike[str]


class UnsafeOutput(ValueError):
    """An output that would overwrite an input or cannot be a regular file."""


def _kind(mode: int) -> str | None:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return None


def same_file(a: PathLike, b: PathLike) -> bool:
    """True when ``a`` and ``b`` name one file: equal resolved paths, or one device + inode."""
    try:
        if Path(a).resolve() == Path(b).resolve():
            return True
    except (OSError, RuntimeError):
        pass
    try:
        sa, sb = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_target(path: PathLike, label: str = "output") -> Path:
    """The file to write for ``path`` (a symlink's target); refuse a non-regular target."""
    p = Path(path)
    real = Path(os.path.realpath(p)) if p.is_symlink() else p
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return real
    except OSError as exc:
        raise UnsafeOutput(f"{label} {os.fspath(path)!r}: {exc.strerror}; give a writable "
                           "file path") from None
    kind = _kind(st.st_mode)
    if kind is not None:
        raise UnsafeOutput(f"{label} {os.fspath(path)!r} is {kind}; an output must be a "
                           "regular file (new or existing)")
    return real


def check_outputs(inputs: Iterable[tuple[str, PathLike | None]],
                  outputs: Iterable[tuple[str, PathLike | None]]) -> None:
    """Refuse an output that is an input, two outputs that are one file, a bad target.

    ``inputs`` and ``outputs`` are ``(label, path)`` pairs; a ``None`` path is skipped.
    """
    # An input that does not exist (a scenario *name*) cannot be overwritten.
    ins = [(label, p) for label, p in inputs if p is not None and os.path.lexists(p)]
    outs = [(label, p) for label, p in outputs if p is not None]
    for i, (label, out) in enumerate(outs):
        check_target(out, label)
        for in_label, src in ins:
            if same_file(out, src):
                raise UnsafeOutput(f"{label} {os.fspath(out)!r} is the same file as "
                                   f"{in_label} {os.fspath(src)!r}; write the output elsewhere")
        for other_label, other in outs[:i]:
            if same_file(out, other):
                raise UnsafeOutput(f"{label} {os.fspath(out)!r} is the same file as "
                                   f"{other_label} {os.fspath(other)!r}; give each output its "
                                   "own file")


def _register(path: Path, is_dir: bool) -> None:
    with _LOCK:
        _TEMPS[os.fspath(path)] = is_dir


def release(path: PathLike) -> None:
    """Forget a temporary path (it was renamed into place, or removed)."""
    with _LOCK:
        _TEMPS.pop(os.fspath(path), None)


def temp_name(target: PathLike) -> Path:
    """A registered temporary name beside ``target`` (hidden, unique to this process)."""
    t = Path(target)
    tmp = t.with_name(f".{t.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    _register(tmp, False)
    return tmp


def discard(tmp: PathLike) -> None:
    """Remove a temporary file and forget it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    release(tmp)


def commit(tmp: PathLike, target: PathLike) -> None:
    """Rename a finished temporary file over its target and forget it."""
    os.replace(tmp, target)
    release(tmp)


@contextlib.contextmanager
def atomic(target: PathLike, label: str = "output") -> Iterator[Path]:
    """Yield a temporary path beside ``target``; rename it into place if the block succeeds."""
    real = check_target(target, label)
    real.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_name(real)
    try:
        yield tmp
        commit(tmp, real)
    finally:
        discard(tmp)


def make_temp_dir(parent: PathLike, prefix: str = ".blis-") -> Path:
    """A scratch directory under ``parent``, registered for signal cleanup (remove it with
    :func:`remove_temp_dir`)."""
    Path(parent).mkdir(parents=True, exist_ok=True)
    while True:  # registered before it exists: a signal at any moment finds it
        path = Path(parent) / f"{prefix}{os.getpid()}-{secrets.token_hex(6)}"
        _register(path, True)
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            release(path)


def remove_temp_dir(path: PathLike) -> None:
    shutil.rmtree(path, ignore_errors=True)
    release(path)


@contextlib.contextmanager
def temp_dir(parent: PathLike, prefix: str = ".blis-") -> Iterator[Path]:
    """:func:`make_temp_dir`, removed when the block ends."""
    path = make_temp_dir(parent, prefix)
    try:
        yield path
    finally:
        remove_temp_dir(path)


def on_interrupt(stop: Callable[[], object]) -> Callable[[], object]:
    """Call ``stop`` on SIGINT/SIGTERM before cleaning up (e.g. a DuckDB connection's
    ``interrupt``, so its threads stop spilling into a scratch directory); returns ``stop``
    for :func:`off_interrupt`."""
    with _LOCK:
        _STOPS.append(stop)
    return stop


def off_interrupt(stop: Callable[[], object]) -> None:
    with _LOCK, contextlib.suppress(ValueError):
        _STOPS.remove(stop)


def _remove(items: list[tuple[str, bool]]) -> None:
    for path, is_dir in items:
        if is_dir:
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)


def cleanup(settle: float = 0.0) -> None:
    """Remove every registered temporary file and directory. With ``settle`` (seconds), keep
    removing until they have stayed gone for a moment: threads of a library being stopped
    (a sort spilling to disk) may still write into a scratch directory."""
    with _LOCK:
        items = list(_TEMPS.items())
        _TEMPS.clear()
    _remove(items)
    deadline, quiet = time.monotonic() + settle, 0
    while settle and time.monotonic() < deadline and quiet < 3:
        time.sleep(0.02)
        if any(os.path.lexists(path) for path, _ in items):
            quiet = 0
            _remove(items)
        else:
            quiet += 1


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    with _LOCK:
        stops = list(_STOPS)
    for stop in stops:
        with contextlib.suppress(Exception):
            stop()
    cleanup(settle=2.0)
    # Exit at once: unwinding could wait on writer threads; everything temporary is gone.
    os._exit(128 + signum)


def install_signal_handlers() -> None:
    """SIGINT and SIGTERM clean up and exit non-zero (main thread only; idempotent)."""
    global _INSTALLED
    if _INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _on_signal)
    _INSTALLED = True


def write_text(target: PathLike, text: str, label: str = "output") -> None:
    """Write ``text`` (UTF-8) to ``target`` through :func:`atomic`."""
    with atomic(target, label) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_bytes(target: PathLike, data: bytes, label: str = "output") -> None:
    """Write ``data`` to ``target`` through :func:`atomic`."""
    with atomic(target, label) as tmp:
        tmp.write_bytes(data)


def inside(path: PathLike, directory: PathLike) -> bool:
    """True when ``path`` (resolved) lies under ``directory`` (resolved)."""
    try:
        return Path(path).resolve().is_relative_to(Path(directory).resolve())
    except (OSError, RuntimeError):
        return False
