"""Small C libraries compiled at run time with the system C compiler and cached on disk.

Lorien ships C as source text (the engine's thread pool, the C kernel renderer, the log
scanner of :mod:`lorien.formats.native`). Each is compiled once per source hash into
``~/.cache/lorien`` (``LORIEN_CACHE_DIR`` overrides it); files are published with an atomic
rename, so processes compiling the same library at once never load half a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from lorien.errors import LorienError


class NativeBuildError(LorienError, RuntimeError):
    """A C library could not be compiled (no C compiler, or it failed)."""


def cache_dir() -> Path:
    """Where compiled libraries and kernels are kept (created on first use)."""
    path = Path(os.environ.get("LORIEN_CACHE_DIR", Path.home() / ".cache" / "lorien"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def install(built: Path, target: Path) -> None:
    """Move a freshly built file into the cache atomically (readers never see half a file)."""
    staging = target.with_suffix(f".{os.getpid()}.tmp")
    shutil.copyfile(built, staging)
    os.replace(staging, target)


def compile_shared(source: str, stem: str, flags: Sequence[str] = ("-O2",), subdir: str = "",
                   error: type[NativeBuildError] = NativeBuildError, libs: Sequence[str] = ()) -> Path:
    """Path of the shared object built from C ``source`` (compiled on first use, then cached).

    The file is named ``<stem>-<hash of source and flags>.so``; ``$CC`` picks the compiler
    (default ``gcc``); ``libs`` go after the source (``-lm``). A failed compile raises ``error``
    with the compiler's message.
    """
    digest = hashlib.sha256("\0".join([source, *flags, *libs]).encode()).hexdigest()[:16]
    directory = cache_dir() / subdir if subdir else cache_dir()
    so_path = directory / f"{stem}-{digest}.so"
    if so_path.exists():
        return so_path
    directory.mkdir(parents=True, exist_ok=True)
    compiler = os.environ.get("CC", "gcc")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{stem}.c"
        src.write_text(source)
        out = Path(tmp) / f"{stem}.so"
        try:
            proc = subprocess.run([compiler, *flags, "-shared", "-fPIC", str(src), "-o", str(out), *libs],
                                  capture_output=True, text=True)
        except OSError as exc:
            raise error(f"cannot run the C compiler {compiler!r}: {exc}") from exc
        if proc.returncode != 0:
            raise error(f"compiling {stem} with {compiler!r} failed:\n{proc.stderr[-4000:]}")
        install(out, so_path)
    return so_path


def load_shared(source: str, stem: str, flags: Sequence[str] = ("-O2",), mode: int = ctypes.DEFAULT_MODE,
                error: type[NativeBuildError] = NativeBuildError, libs: Sequence[str] = ()) -> ctypes.CDLL:
    """The loaded library of :func:`compile_shared`."""
    return ctypes.CDLL(str(compile_shared(source, stem, flags, error=error, libs=libs)), mode=mode)
