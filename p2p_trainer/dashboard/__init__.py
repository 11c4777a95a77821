"""`p2p-trainer dashboard`: a live web page of a swarm, served by the command itself.

`history.py` accumulates what the swarm's heartbeats said over time, `exchanges.py` adds each
peer's exchange outcomes from a run directory's metrics files, `poller.py` reads both every few
seconds, `server.py` serves the page (`page.html`, no external assets: it works offline) and the
JSON it polls, `command.py` is the click command. Only the command imports hivemind (through
`net/status_client.py`), after its port is bound.
"""
