"""Default port and key paths of DHT nodes (no imports, so the command line can use them cheaply)."""

from __future__ import annotations

DEFAULT_BOOTSTRAP_PORT = 31337
"""A bootstrap node's fixed port (peers are given it, so it should not change between restarts)."""
DEFAULT_BOOTSTRAP_IDENTITY = "~/.p2p-trainer/bootstrap.key"
"""A bootstrap node's key file; the key keeps its peer id (and so its address) stable."""
DEFAULT_PEER_IDENTITY = "~/.p2p-trainer/peer.key"
"""A training peer's key file."""
