"""Runners: a peer joining a real swarm (`join`), a local swarm of processes on loopback
(`local_swarm`), N peers as threads over the in-process backend (`threads`)."""
