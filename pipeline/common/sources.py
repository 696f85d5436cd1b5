"""The code a run is made of, as digests of its source files.

A run's numbers depend on fedrc's training code and on the modules its algorithm, model and
dataset come from: a plugin's file, or an installed plugin package. DVC sees a stage's code
only through the files its `deps` list, which cannot name a plugin chosen in params.yaml; so
`fedrc check` writes these digests into the resolved configuration each stage depends on, and
a sweep records them with each point: editing a plugin (its default, say) reruns what used it.

A module is digested with the top-level package it belongs to (every `.py` file under it), or
alone when it is a single file: a plugin's helper modules inside its package count, a module
of another top-level package that it imports does not.
"""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

from pipeline.common.errors import FedrcError


def files_digest(files: list[Path], root: Path) -> str:
    """SHA-256 over each file's path (relative to `root`) and bytes, in path order."""
    hashed = hashlib.sha256()
    for path in sorted(files):
        hashed.update(str(path.relative_to(root)).encode() + b"\0")
        hashed.update(path.read_bytes() + b"\0")
    return hashed.hexdigest()


def package_files(top: str) -> tuple[list[Path], Path]:
    """The `.py` files of the importable top-level package or module `top`, and their root."""
    try:
        module = sys.modules.get(top) or importlib.import_module(top)
    except Exception as e:  # the component loaded, so this is rare: say which
        raise FedrcError(f"{top}: its source cannot be found ({type(e).__name__}: {e})") from None
    paths = [Path(p) for p in getattr(module, "__path__", [])]
    if paths:
        return [f for p in paths for f in p.rglob("*.py") if "__pycache__" not in f.parts], paths[0]
    file = getattr(module, "__file__", None)
    if file is None:
        raise FedrcError(f"{top}: a module without source files; its code cannot be tracked")
    return [Path(file)], Path(file).parent


def module_digest(module: str) -> tuple[str, str]:
    """(the top-level package `module` belongs to, the digest of its source files)."""
    top = module.split(".")[0]
    files, root = package_files(top)
    return top, files_digest(files, root)


def subpackages_digest(package: str, names: tuple[str, ...]) -> str:
    """The digest of the named subpackages of `package` (fedrc's training code)."""
    root = Path(importlib.import_module(package).__path__[0])
    files = [f for name in names for f in (root / name).rglob("*.py")]
    return files_digest([f for f in files if "__pycache__" not in f.parts], root)
