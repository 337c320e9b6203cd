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

One output policy for every command (docs/decisions.md RL1, RL2):

* Inside :func:`command_scope` (the CLI runs every command in one) each reader records what
  it read (:func:`note_read`: a trace, a scenario and every document it loaded, a config, a
  calibration, a database; :func:`note_read_dir`: a catalog or registry folder). Every
  temporary name and every final rename checks its target against them, so no command, not
  even one added later, can write over what it read, whatever its own checks.
* Temporaries carry their owner (pid and the process's start time) in their names, and the
  first temporary a run makes in a directory removes those whose owner is gone (a kill -9
  leaves them), RL5.
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

__all__ = ["UnsafeOutput", "atomic", "check_outputs", "check_reads", "check_target", "cleanup",
           "command_scope", "commit", "discard", "install_signal_handlers", "make_temp_dir",
           "note_read", "note_read_dir", "owner_tag", "release", "remove_stale",
           "remove_temp_dir", "same_file", "temp_dir", "temp_name"]

_TEMPS: dict[str, bool] = {}  # path -> is a directory
_STOPS: list[Callable[[], object]] = []  # called first on a signal
_LOCK = threading.Lock()
_INSTALLED = False
# What the running command read: None outside a command (the library API records nothing).
_READS: list[tuple[str, str, bool]] | None = None  # (label, path, is a directory)
_SWEPT: set[str] = set()  # directories whose stale temporaries this process has removed

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
    check_reads(real, label)
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


def check_output_dir(label: str, out_dir: PathLike,
                     inputs: Iterable[tuple[str, PathLike | None]]) -> None:
    """Refuse an output directory that holds an input, or lies inside an input directory
    (for writers whose files are named inside it, some by other processes)."""
    for in_label, src in inputs:
        if src is None or not os.path.lexists(src):
            continue
        if same_file(out_dir, src) or inside(src, out_dir):
            raise UnsafeOutput(f"{label} {os.fspath(out_dir)!r} holds {in_label} "
                               f"{os.fspath(src)!r}; write the output elsewhere")
        if os.path.isdir(src) and inside(out_dir, src):
            raise UnsafeOutput(f"{label} {os.fspath(out_dir)!r} is inside {in_label} "
                               f"{os.fspath(src)!r}; write the output elsewhere")


def _register(path: Path, is_dir: bool) -> None:
    with _LOCK:
        _TEMPS[os.fspath(path)] = is_dir


def release(path: PathLike) -> None:
    """Forget a temporary path (it was renamed into place, or removed)."""
    with _LOCK:
        _TEMPS.pop(os.fspath(path), None)


def temp_name(target: PathLike) -> Path:
    """A registered temporary name beside ``target`` (hidden, unique to this process, named
    for its owner); refuses a target the running command read, and removes the temporaries
    a dead process left in that directory."""
    t = Path(target)
    check_reads(t)
    remove_stale(t.parent)
    name = t.name[:160]  # room for the owner tag within NAME_MAX
    tmp = t.with_name(f".{name}.{owner_tag()}.{secrets.token_hex(4)}.tmp")
    _register(tmp, False)
    return tmp


def discard(tmp: PathLike) -> None:
    """Remove a temporary file and forget it."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    release(tmp)


def commit(tmp: PathLike, target: PathLike) -> None:
    """Rename a finished temporary file over its target and forget it (refused, the
    temporary removed, if the command read ``target`` since the temporary was made)."""
    try:
        check_reads(target)
    except UnsafeOutput:
        discard(tmp)
        raise
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
    remove_stale(parent)
    while True:  # registered before it exists: a signal at any moment finds it
        path = Path(parent) / f"{prefix}{owner_tag()}-{secrets.token_hex(6)}"
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


# -- what the running command read (RL1) ----------------------------------------------------


@contextlib.contextmanager
def command_scope() -> Iterator[None]:
    """Record, for the block, every path read through :func:`note_read`/:func:`note_read_dir`
    and refuse any output onto them (the CLI runs each command in one)."""
    global _READS
    with _LOCK:
        outer, _READS = _READS, []
        _SWEPT.clear()  # each command looks again for what a dead run left
    try:
        yield
    finally:
        with _LOCK:
            _READS = outer


def note_read(label: str, path: PathLike | None) -> None:
    """Record that the running command read the file ``path`` (no-op outside a command)."""
    if _READS is None or path is None:
        return
    with _LOCK:
        if _READS is not None:
            _READS.append((label, os.fspath(path), False))


def note_read_dir(label: str, path: PathLike | None) -> None:
    """Record that the running command read the folder ``path`` (a catalog, a registry, a
    trace directory): nothing may be written inside it."""
    if _READS is None or path is None:
        return
    with _LOCK:
        if _READS is not None:
            _READS.append((label, os.fspath(path), True))


def reads() -> list[tuple[str, str, bool]]:
    """What the running command has read so far (empty outside a command)."""
    with _LOCK:
        return list(_READS or ())


def check_reads(target: PathLike, label: str = "output") -> None:
    """Refuse ``target`` if the running command read it, or reads inside a folder it read."""
    noted = reads()
    if not noted:
        return
    for in_label, src, is_dir in noted:
        if is_dir:
            if inside(target, src):
                raise UnsafeOutput(f"{label} {os.fspath(target)!r} is inside {in_label} "
                                   f"{src!r}, which this command reads; write the output "
                                   "elsewhere")
        elif os.path.lexists(src) and same_file(target, src):
            raise UnsafeOutput(f"{label} {os.fspath(target)!r} is the same file as {in_label} "
                               f"{src!r}, which this command reads; write the output elsewhere")


# -- temporaries that name their owner (RL5) ------------------------------------------------

_TAG_PID = r"(\d+)-(\d+)"


def _start_time(pid: int) -> int:
    """The start time of process ``pid`` in clock ticks since boot (Linux), 0 if unknown;
    -1 when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat_line = f.read()
    except FileNotFoundError:
        return -1
    except OSError:
        return 0
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = stat_line[stat_line.rfind(b")") + 2:].split()
    try:
        return int(fields[19])  # field 22 of proc(5)
    except (IndexError, ValueError):
        return 0


_OWNER: str | None = None


def owner_tag() -> str:
    """``blis<pid>-<start time>``: which process made a temporary, across pid reuse."""
    global _OWNER
    pid = os.getpid()
    if _OWNER is None or not _OWNER.startswith(f"blis{pid}-"):  # (a forked worker: its own)
        _OWNER = f"blis{pid}-{max(_start_time(pid), 0)}"
    return _OWNER


def _owner_gone(pid: int, start: int) -> bool:
    if pid == os.getpid():
        return False
    now = _start_time(pid)
    if now == -1:
        if os.path.isdir("/proc/self"):
            return True
        try:  # no /proc: ask the kernel whether the pid exists
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    return start != 0 and now != 0 and now != start


def remove_stale(directory: PathLike) -> list[str]:
    """Remove the temporaries in ``directory`` whose owner process is gone (once per
    directory per process); returns the names removed."""
    import re

    key = os.path.abspath(directory)
    with _LOCK:
        if key in _SWEPT:
            return []
        _SWEPT.add(key)
    pattern = re.compile(rf"^\..*[.-]blis{_TAG_PID}[.-][0-9a-f]+(\.tmp)?$")
    removed = []
    try:
        names = os.listdir(key)
    except OSError:
        return []
    for name in names:
        m = pattern.match(name)
        if m is None or not _owner_gone(int(m.group(1)), int(m.group(2))):
            continue
        path = os.path.join(key, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(path)
        removed.append(name)
    return removed
