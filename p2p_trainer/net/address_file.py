"""A bootstrap node's multiaddrs in a file, for peers that start before its peer id is known.

`bootstrap --address-file PATH` writes the file once the node accepts connections, and removes it
when the node stops, so the file exists only while there is a node to dial (a stale one would send
peers to an address nobody answers). The file is written to a temporary name beside it and renamed
into place, so a reader sees the whole text or no file, never half a line. `join
--initial-peers-file PATH` waits for it (on a volume shared between containers, say).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

from p2p_trainer.net.addresses import AddressError, validate_initial_peer

logger = logging.getLogger(__name__)


class AddressFileTimeout(AddressError):
    """The address file did not appear in time; the message says who writes it and what to check."""


def write_address_file(path: str | Path, maddrs: list[str]) -> None:
    """Write `maddrs`, one a line, to `path` atomically (mode 0644: any peer may read it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write("".join(f"{maddr}\n" for maddr in maddrs))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def remove_address_file(path: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        Path(path).unlink()


def read_address_file(path: str | Path) -> list[str] | None:
    """The multiaddrs in `path` (None while it is missing or empty). Each line is a multiaddr; the
    `--initial-peers A --initial-peers B` text `bootstrap` prints is accepted too."""
    try:
        text = Path(path).read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise AddressError(f"cannot read the initial peers file {path}: {exc}") from None
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    words = [w for line in lines for w in line.split() if w != "--initial-peers"]
    if not words:
        return None
    try:
        return [validate_initial_peer(word) for word in words]
    except AddressError as exc:
        raise AddressError(f"initial peers file {path}: {exc}") from None


def wait_for_address_file(
    path: str | Path, timeout_s: float, stop: threading.Event | None = None, poll_s: float = 0.25
) -> list[str]:
    """The multiaddrs in `path` once it exists; raises `AddressFileTimeout` after `timeout_s`, and
    `InterruptedError` if `stop` is set first."""
    deadline = time.monotonic() + timeout_s
    logged = False
    while True:
        found = read_address_file(path)
        if found is not None:
            return found
        if time.monotonic() >= deadline:
            raise AddressFileTimeout(
                f"the initial peers file {path} did not appear within {timeout_s:g} s. A bootstrap "
                f"node started with `p2p-trainer bootstrap --address-file {path}` writes it once it "
                f"accepts connections: check that one runs and writes to this path (in Docker, a "
                f"volume both containers mount), raise --initial-peers-timeout-s, or give "
                f"--initial-peers ADDR instead"
            )
        if not logged:
            logger.info("waiting up to %g s for the bootstrap node's address in %s", timeout_s, path)
            logged = True
        wait_s = min(poll_s, max(0.0, deadline - time.monotonic()))
        if stop is not None and stop.wait(wait_s):
            raise InterruptedError(f"stopped while waiting for {path}")
        if stop is None:
            time.sleep(wait_s)
