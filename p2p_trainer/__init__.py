"""p2p-trainer: decentralized peer-to-peer training over slow, unreliable links.

`p2p_trainer.Swarm` and `p2p_trainer.Trainer` are the Python API (docs/python-api.md). They are
imported on first use, so that importing the package (every command and helper process does)
does not import torch and hivemind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from p2p_trainer.api import Swarm, Trainer

__version__ = "0.1.0"
__all__ = ["Swarm", "Trainer", "__version__"]


def __getattr__(name: str) -> object:
    if name in ("Swarm", "Trainer"):
        from p2p_trainer import api

        return getattr(api, name)
    raise AttributeError(f"module 'p2p_trainer' has no attribute {name!r}")
