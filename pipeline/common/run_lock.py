"""One writer per output folder: a lock that a command holds while it writes there.

`fedrc train` holds its run folder, `fedrc eval` and `fedrc plot` the run folder they write
into, `fedrc partition` and `fedrc report` their `--out`. A second command that would write the
same folder gets one line naming the holder (pid, command, start time) and touches nothing.

The lock is an OS advisory lock (`fcntl.flock`) on a small file, `.fedrc.lock` inside a run
folder and `.<name>.fedrc.lock` beside a benchmark folder (`fedrc partition` replaces that
folder whole). Its text says who holds it, for the message. The kernel drops the lock when its
holder dies, even by SIGKILL, so a lock file left behind by a killed process is taken over
silently; a normal exit removes the file. Where flock is unavailable (no `fcntl`, a file
system that refuses it) the file itself is the lock, created exclusively: one whose pid no
longer runs on this host is stale and taken over.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from pipeline.common.errors import FedrcError
from pipeline.common.reading import parse_json

try:
    import fcntl
except ImportError:  # not a POSIX system: the exclusive-file fallback
    fcntl = None  # type: ignore[assignment]

LOCK = ".fedrc.lock"
UNSUPPORTED = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}
BUSY = {errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES}


def lock_path(folder: Path, beside: bool = False) -> Path:
    """Where `folder`'s lock lives: inside it, or (`beside`) next to it."""
    if not beside:
        return folder / LOCK
    absolute = Path(os.path.abspath(folder))  # "." and "x/.." have a name here
    return absolute.parent / f".{absolute.name}{LOCK}"


@contextmanager
def writer_lock(
    folder: Path | str,
    option: str,
    command: str,
    *,
    beside: bool = False,
    create: bool = True,
) -> Iterator[None]:
    """Hold `folder` for this process while the body writes there; a FedrcError naming
    `option` and the holder when another fedrc holds it. Folders made for the lock file are
    removed again on the way out if they are still empty; with `create` False a folder that
    does not exist is not locked (the command has nothing there to write into)."""
    folder = Path(folder)
    path = lock_path(folder, beside)
    if not create and not path.parent.is_dir():
        yield
        return
    made = [p for p in [path.parent, *path.parent.parents] if not os.path.lexists(p)]
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        release = _acquire(path, option, folder, command)
    except BaseException:
        _remove_empty(made)
        raise
    try:
        yield
    finally:
        release()
        _remove_empty(made)


def _remove_empty(folders: list[Path]) -> None:
    for folder in folders:  # deepest first
        try:
            folder.rmdir()
        except OSError:
            break


def _holder_text(command: str) -> bytes:
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "since": datetime.now().isoformat(timespec="seconds"),
    }
    return (json.dumps(record) + "\n").encode()


def _read_holder(path: Path, fd: int | None = None) -> dict[str, Any]:
    """Who holds the lock, from its text; a holder that has just taken it may not have
    written it yet, so an empty file is read again for a moment."""
    for _ in range(10):
        try:
            data = os.pread(fd, 4096, 0) if fd is not None else path.read_bytes()
        except OSError:
            data = b""
        try:
            record = parse_json(data)
            if isinstance(record, dict):
                return record
        except ValueError:
            pass
        time.sleep(0.05)
    return {}


def busy_message(option: str, folder: Path, holder: dict[str, Any]) -> str:
    pid = holder.get("pid", "unknown")
    host = holder.get("host")
    where = f"pid {pid}" + (f" on {host}" if host and host != socket.gethostname() else "")
    since = ""
    try:
        start = datetime.fromisoformat(str(holder["since"]))
        shown = "%H:%M:%S" if start.date() == datetime.now().date() else "%Y-%m-%d %H:%M:%S"
        since = f", since {start.strftime(shown)}"
    except (KeyError, ValueError):
        pass
    command = holder.get("command", "fedrc")
    return (
        f"{option}: {folder} is being written by another fedrc ({where}, {command}{since}); "
        "wait for it or stop it"
    )


def _acquire(path: Path, option: str, folder: Path, command: str):
    """Take the lock; returns the function that releases it."""
    if fcntl is not None:
        try:
            return _acquire_flock(path, option, folder, command)
        except OSError as e:
            if e.errno not in UNSUPPORTED:
                raise
    return _acquire_exclusive(path, option, folder, command)


# The lock file is fedrc's own: never a link to someone's file (which it would truncate).
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _open(path: Path, option: str, flags: int) -> int:
    """The lock file opened with `flags` (never through a symbolic link), or a FedrcError
    naming `option` and what is in the way."""
    try:
        return os.open(path, flags | NOFOLLOW, 0o666)
    except FileExistsError:
        raise
    except OSError as e:
        if e.errno in UNSUPPORTED:
            raise
        what = {
            errno.ELOOP: "is a symbolic link (fedrc's lock file never is one); remove it",
            errno.EISDIR: "is a folder where fedrc keeps its lock file; remove it",
            errno.EACCES: "cannot be opened (permission denied: another user's lock, or a "
            "folder you cannot write)",
            errno.EPERM: "cannot be opened (permission denied)",
            errno.EROFS: "cannot be created (read-only file system)",
        }.get(e.errno or 0, f"cannot be opened ({e.strerror or e})")
        raise FedrcError(f"{option}: lock file {path} {what}") from None


def _acquire_flock(path: Path, option: str, folder: Path, command: str):
    while True:
        fd = _open(path, option, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            try:
                if e.errno in BUSY:
                    raise FedrcError(busy_message(option, folder, _read_holder(path, fd))) from None
                if os.fstat(fd).st_size == 0:  # flock unsupported here: leave no empty file
                    path.unlink(missing_ok=True)
                raise
            finally:
                os.close(fd)
        # The holder before us removes the file when it lets go: if it did so after we opened
        # it, we hold a lock on a file nobody else will see; open the path again.
        try:
            same = os.path.samestat(os.stat(path), os.fstat(fd))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)  # a killed holder's text: ours now
        os.pwrite(fd, _holder_text(command), 0)
    except BaseException:
        os.close(fd)
        raise

    def release() -> None:
        try:
            os.unlink(path)  # while still held: nobody can take the lock on this file after
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    return release


def _alive(holder: dict[str, Any]) -> bool:
    """Whether the process a lock file names still runs (on another host: assumed so)."""
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    if holder.get("host") not in (None, socket.gethostname()):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _acquire_exclusive(path: Path, option: str, folder: Path, command: str):
    """Without flock: the lock file itself, created exclusively; a dead holder's is removed."""
    for _ in range(10):
        try:
            fd = _open(path, option, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            holder = _read_holder(path)
            if holder and _alive(holder):
                raise FedrcError(busy_message(option, folder, holder)) from None
            if not holder and time.time() - _mtime(path) < 5:
                raise FedrcError(busy_message(option, folder, holder)) from None  # being written
            path.unlink(missing_ok=True)  # stale: its holder is gone
            continue
        try:
            os.write(fd, _holder_text(command))
        finally:
            os.close(fd)
        return lambda: path.unlink(missing_ok=True)
    raise FedrcError(busy_message(option, folder, _read_holder(path)))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
