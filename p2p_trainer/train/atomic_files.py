"""Files written under a temporary name, synced and renamed: a reader (or a crash) never sees half
a file, and concurrent writers of the same content each leave a whole one."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` whole or not at all; a failed write (a full disk) leaves no
    temporary file behind, so a disk that keeps failing does not fill up with them."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}.{threading.get_ident()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())
