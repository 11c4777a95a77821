"""Networking over hivemind: the only package that imports it.

- `identity`: persistent Ed25519 keys in p2pd's format, peer ids, the same-machine lock;
- `addresses`: multiaddr checks with messages that show a good value;
- `dht`: start/stop a DHT node (retries, duplicate-identity check, no leftover p2pd or sockets);
- `records`: typed, expiring msgpack records (heartbeats, run definition, liveness);
- `join`: a training peer entering a swarm; `bootstrap`, `bootstrap_command`: the entry node.
"""
