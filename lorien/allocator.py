"""Memory-allocator settings for a long bulk job (an ingest), set before pyarrow is loaded.

Arrow's default memory pool is its bundled mimalloc, which reads its options from the
environment once, when pyarrow's library is loaded. By default it returns freed pages to the
system a second after they are freed, and lets the kernel back its arenas with transparent huge
pages; an ingest frees a batch's worth of Arrow buffers every commit, and over a long log those
kept pages and half-used huge pages add up (docs/warehouse.md, "Large logs and TenSet trees").
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

#: mimalloc options an ingest sets unless the user set them: freed pages go back to the system
#: after 10 ms (default 1,000 ms), and its arenas get no transparent huge pages.
INGEST_ALLOCATOR_ENV = {"MIMALLOC_PURGE_DELAY": "10", "MIMALLOC_ALLOW_THP": "0"}


def set_ingest_allocator_env(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Put :data:`INGEST_ALLOCATOR_ENV`'s options in ``environ`` (default ``os.environ``) where the
    user has not set them; returns the ones it set. They take effect in a process that loads
    pyarrow afterwards (the ingest's decoding workers are forked from it and inherit them), so
    ``lorien ingest`` calls this before it imports pyarrow. A process that has loaded pyarrow
    already keeps its ``os.environ`` as it is (the options would come too late)."""
    if environ is None:
        if "pyarrow" in sys.modules:
            return {}
        environ = os.environ
    chosen = {name: value for name, value in INGEST_ALLOCATOR_ENV.items() if name not in environ}
    environ.update(chosen)
    return chosen


def release_freed_memory() -> None:
    """Give memory this process has freed back to the system: Python's cycles collected, Arrow's
    pool told to release what it keeps, and the C library's free pages returned (``malloc_trim``,
    glibc only). An ingest calls it between its commits and the serving index build, whose peak
    otherwise sits on what the commits left resident."""
    import ctypes
    import ctypes.util
    import gc

    import pyarrow as pa

    gc.collect()
    pa.default_memory_pool().release_unused()
    libc_name = ctypes.util.find_library("c")
    if libc_name is not None:
        trim = getattr(ctypes.CDLL(libc_name), "malloc_trim", None)
        if trim is not None:
            trim(0)
