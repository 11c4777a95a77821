"""Keep freed memory for reuse: glibc's allocator settings for a process that exchanges models.

Why: each exchange allocates and frees buffers of megabytes (frames, decoded parts, sums). glibc
serves large blocks with fresh `mmap`s, and returns the top of its heap to the system once more
than a few MB is free there, so the next exchange touches new pages and takes a page fault per
4 KiB. On loopback (4 members, default model) that was about a fifth of an exchange's CPU; a
float64 sum of four parts took 1.43 ms with those faults and 0.75 ms without.

So blocks up to `MMAP_THRESHOLD` come from the heap and the heap keeps up to `TRIM_THRESHOLD` free:
the process holds on to its high-water mark of exchange buffers (freed by one exchange, reused by
the next) instead of giving it back and faulting it in again. Settings the user made through
glibc's own environment variables (`MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`) are kept.
Anywhere else (not glibc) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
TRIM_THRESHOLD = 1 << 30
MMAP_THRESHOLD = 32 << 20
"""glibc's largest (on 64-bit): larger blocks (a whole GPU-sized model) are still mmap'd."""


@functools.cache
def keep_freed_memory() -> bool:
    """Apply the settings once per process; True if glibc took them (every call says the same)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    took = True
    for option, env, value in (
        (M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", TRIM_THRESHOLD),
        (M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD),
    ):
        if env not in os.environ:
            took = bool(mallopt(option, value)) and took
    if not took:
        logger.debug("glibc refused a malloc setting: freed exchange buffers go back to the system")
    return took
