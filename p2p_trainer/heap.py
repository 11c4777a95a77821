"""Keep freed memory for reuse: glibc's allocator settings for a process that trains and exchanges.

Why: an inner step and an exchange each allocate and free blocks of megabytes (activations and
their gradients; frames, decoded parts, sums). glibc serves large blocks with fresh `mmap`s, and
returns the top of its heap to the system once more than a few MB is free there, so the next step
touches new pages and takes a page fault per 4 KiB. Measured on the default model (one thread):
an inner step took about 11,000 page faults and 135 ms without these settings, under 50 faults and
120 ms with them, and 315-332 ms against 280-300 ms under a 0.45-core CPU cap (the faults' kernel
time counts against the cap). On loopback (4 members, default model) the faults were about a fifth
of an exchange's CPU; a float64 sum of four parts took 1.43 ms with them and 0.75 ms without.

So blocks up to `MMAP_THRESHOLD` come from the heap and the heap keeps up to `TRIM_THRESHOLD` free:
the process holds on to its high-water mark (freed by one step or exchange, reused by the next)
instead of giving it back and faulting it in again. Settings the user made through glibc's own
environment variables (`MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`) are kept. Anywhere else
(not glibc) this does nothing. The settings are process-wide: a program that trains through the
Python API gets them too.
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
        logger.debug(
            "glibc refused a malloc setting: freed blocks go back to the system and are faulted in again"
        )
    return took
