"""Ids out of a memory-mapped token file, read from the file rather than through the map.

A page a process touches through a file mapping stays counted in its resident memory until the
mapping goes, and on recent kernels one fault maps the whole large folio around it (2 MB on the
machine this was measured on, bench/data_memory.py). A peer drawing random windows through the map
would so come to hold most of its corpus, and a pass of checks all of it. Reads of the file leave
the data to the kernel's page cache, which counts against no process and is reclaimed when memory
is short. Arrays that are not a read-only map of a file are indexed as they are.
"""

from __future__ import annotations

import mmap
import os

import numpy as np


def file_region(ids: np.ndarray) -> tuple[str, int] | None:
    """(file, byte offset of ids[0] in it) for a contiguous slice of a read-only np.memmap."""
    if ids.ndim != 1 or not ids.flags.c_contiguous or ids.flags.writeable:
        return None
    root: object = ids
    while isinstance(root, np.ndarray) and not isinstance(root.base, mmap.mmap):
        root = root.base
    if not isinstance(root, np.memmap) or root.filename is None:
        return None
    delta = ids.__array_interface__["data"][0] - root.__array_interface__["data"][0]
    return str(root.filename), int(root.offset) + delta


def read_span(ids: np.ndarray, start: int, stop: int) -> np.ndarray:
    """ids[start:stop], as a fresh array read from the file where `ids` maps one."""
    region = file_region(ids)
    if region is None:
        return ids[start:stop]
    name, base = region
    count = max(0, min(stop, len(ids)) - start)
    return np.fromfile(name, dtype=ids.dtype, count=count, offset=base + start * ids.dtype.itemsize)


def read_windows(ids: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """Rows ids[s : s + length] for each s in `starts` (each within the array), one read each."""
    region = file_region(ids)
    if region is None:
        return ids[starts[:, None] + np.arange(length)[None, :]]
    name, base = region
    out = np.empty((len(starts), length), dtype=ids.dtype)
    size = ids.dtype.itemsize
    with open(name, "rb", buffering=0) as f:
        for row, start in zip(out, starts, strict=True):
            got = os.preadv(f.fileno(), [row], base + int(start) * size)
            if got != row.nbytes:
                raise OSError(f"{name}: {got} of {row.nbytes} bytes read at id {start}; did it shrink?")
    return out
