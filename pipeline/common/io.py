"""Atomic writes: a reader never sees a half-written file or folder."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.common.errors import FedrcError, FedrcWarning


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError raised inside (a full disk, say) names `path` if it names no file itself."""
    try:
        yield
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise


@contextmanager
def _inside(tmp: Path, target: Path) -> Iterator[None]:
    """An OSError naming a file inside the temporary folder `tmp` names it where it was
    going to be, inside `target`."""
    try:
        yield
    except OSError as e:
        if isinstance(e.filename, str) and Path(e.filename).is_relative_to(tmp):
            e.filename = str(target / Path(e.filename).relative_to(tmp))
        raise


def user_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


# The names fedrc gives temporaries beside an output NAME: `.NAME.tmp-` and the 8 characters
# tempfile draws (`atomic_file`, `atomic_dir`) or a pid (a momentum snapshot), `.NAME.old-` and
# a pid (`atomic_dir`, between its two renames). Only names of exactly this form are fedrc's:
# `.notes.tmp-mine` is a user's file.
TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?:tmp-(?:[a-z0-9_]{8}|[0-9]+)|old-[0-9]+)")
OLD = ".old-"


def leftovers(folder: Path, names: Sequence[str], patterns: Sequence[str] = ()) -> list[Path]:
    """The temporary files and folders that killed atomic writes of `names` (and of names
    matching the glob `patterns`) left in `folder`: `.NAME.tmp-*` (`atomic_file`, `atomic_dir`)
    and `.NAME.old-*` (`atomic_dir`, between its two renames), in fedrc's exact forms."""
    found: set[Path] = set()
    for stem in [*map(glob.escape, names), *patterns]:
        for kind in ("tmp", "old"):
            found.update(p for p in folder.glob(f".{stem}.{kind}-*") if is_temporary(p.name))
    return sorted(found)


def is_temporary(name: str) -> bool:
    """Whether `name` has the form of a temporary fedrc writes beside an output."""
    return TEMPORARY.fullmatch(name) is not None


def remove_leftovers(folder: Path, names: Sequence[str], patterns: Sequence[str] = ()) -> None:
    """Remove `leftovers(folder, names, patterns)`; call it only while holding the folder's
    writer lock (`pipeline.common.run_lock`), so that no live write's temporary path is among
    them. A folder that `atomic_dir` moved aside and a kill kept from coming back (the output
    is gone, its old copy is there) is put back first, with a warning (`recover_dir`)."""
    for name in names:
        recover_dir(folder / name)
    for path in leftovers(folder, names, patterns):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def recover_dir(target: Path) -> None:
    """Undo an `atomic_dir` replacement of `target` stopped between its two renames (killed):
    `target` is gone and its previous version waits beside it as `.NAME.old-PID`; it is put
    back (the newest, if several), and a warning says so. The new version is not used: nothing
    says it was finished."""
    if os.path.lexists(target):
        return
    aside = [p for p in leftovers(target.parent, [target.name]) if OLD in p.name and p.is_dir()]
    if not aside:
        return
    newest = max(aside, key=lambda p: p.stat().st_mtime)
    newest.rename(target)
    warnings.warn(
        FedrcWarning(
            f"{target}: put back from {newest.name}, where a replacement of it was stopped "
            "half-way (killed between its two renames); the unfinished new version is removed"
        ),
        stacklevel=2,
    )


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside `target`; on success it replaces `target` whole: the old
    one is moved aside, the new one renamed into place, then the old one removed. A failure of
    either rename puts the old one back; a kill between them is undone by `recover_dir`."""
    shown, target = target, Path(os.path.abspath(target))  # "." and "x/.." have a name here
    with naming(shown):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        tmp.chmod(0o777 & ~user_umask())  # mkdtemp makes 0700 folders; the user's umask rules
    old = target.parent / f".{target.name}{OLD}{os.getpid()}"
    try:
        with naming(shown), _inside(tmp, shown):
            yield tmp
        moved = False
        try:
            if os.path.lexists(target):
                target.rename(old)
                moved = True
            tmp.rename(target)
        except BaseException:
            if moved and not os.path.lexists(target):
                old.rename(target)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_file(target: Path) -> Iterator[Path]:
    """Yield a temporary path beside `target`; on success it is renamed onto `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    tmp.chmod(0o666 & ~user_umask())  # mkstemp makes 0600 files; give the usual permissions
    try:
        with naming(target):
            yield tmp
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_files(*targets: Path) -> Iterator[list[Path]]:
    """Like `atomic_file` for several files that belong together: each is written to its
    temporary path first, then all are renamed, in the order given (a kill between two renames
    leaves the first ones new: order them so that any prefix is a state the reader accepts).
    An error in the body leaves every target as it was; an OSError there names the target
    whose temporary path it names, else the last target."""
    with ExitStack() as stack:
        tmps = []
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
            os.close(fd)
            tmps.append(Path(name))
            stack.callback(tmps[-1].unlink, missing_ok=True)
            tmps[-1].chmod(0o666 & ~user_umask())  # mkstemp makes 0600 files
        try:
            yield tmps
        except OSError as e:
            named = {str(tmp): target for tmp, target in zip(tmps, targets)}
            e.filename = str(named.get(str(e.filename), e.filename or targets[-1]))
            raise
        for tmp, target in zip(tmps, targets):
            with naming(target):
                os.replace(tmp, target)


def json_text(data: Any) -> str:
    """`data` as fedrc writes a JSON file: sorted keys, indented, a final newline."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def write_json(path: Path, data: Any) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(json_text(data))


def read_parquet(
    path: Path, missing: str, check: Callable[[bytes], None] | None = None
) -> pa.Table:
    """A Parquet table, or a one-line FedrcError naming the file; `missing` explains absence.
    `check` sees the file's bytes before they are parsed (a shard's SHA-256): the bytes checked
    are the bytes read, which a second read of the file could not promise.

    Read as one buffer on this thread: `pq.read_table` would first discover a dataset at the
    path and read it on Arrow's thread pool, 8 ms a file against 0.3 ms for a client's small
    shard on a loaded 2-core CPU, 25 s for a benchmark of 3,000 clients
    (`benchmarks/many_clients.py`)."""
    if not path.is_file():
        raise FedrcError(f"{path}: {missing}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise FedrcError(f"{path}: cannot be read ({e.strerror or e})") from None
    if check is not None:
        check(data)
    try:
        with pq.ParquetFile(pa.py_buffer(data), pre_buffer=False) as file:
            return file.read(use_threads=False)
    except (pa.ArrowException, OSError) as e:
        raise FedrcError(f"{path}: corrupt Parquet file ({str(e).splitlines()[0]})") from None
