"""Networking over hivemind: the only package that imports it.

- `identity`: persistent Ed25519 keys in p2pd's format, peer ids, the same-machine lock;
- `addresses`: multiaddr checks with messages that show a good value; `node_defaults`: ports, key paths;
- `dht`: start/stop a DHT node (retries, duplicate-identity check, no leftover p2pd or sockets);
- `reaper`, `signals`: no p2pd outlives its node; SIGINT/SIGTERM ask for a clean stop;
- `records`: typed, expiring msgpack records (heartbeats, run definition, liveness);
- `swarm_view`, `health`: the live peers from heartbeats, and local suspicion of dead ones;
- `transport`, `allreduce`: messages between peers, and the butterfly all-reduce with a quorum;
- `network_exchange`: the `Exchange` over the network; `exchange_tap`: its test recorder;
- `align`: round alignment for non-blocking methods; `state_sync`: late joiners download the state;
- `swarm_entry`: a training peer entering a swarm; `bootstrap`, `bootstrap_command`: the entry node.
"""
