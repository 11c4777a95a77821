"""p2p-trainer: decentralized peer-to-peer training over slow, unreliable links."""

__version__ = "0.1.0"
