"""At a peer's start: the reachability check, the lines it prints, and what a peer behind NAT runs.

`--relay auto` (the default): messages to a peer this one cannot open a stream to go through the
bootstrap nodes' relay (`message_relay.py`); a peer that nobody can dial also keeps connections open to
the peers it can dial (`keeper.py`), so those reach it directly. `--relay off`: neither; the
check still runs and says what that means.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from p2p_trainer.net import reach
from p2p_trainer.net.dht import NetNode
from p2p_trainer.net.keeper import ConnectionKeeper
from p2p_trainer.net.transport import Transport

logger = logging.getLogger(__name__)

RELAY_MODES = ("auto", "off")
MAX_CHECKERS = 3
CHECK_TIMEOUT_S = 10.0
"""Per checker: its dial back gives up after reach.DIAL_TIMEOUT_S."""


@dataclass
class NatSetup:
    reachability: reach.Reachability
    keeper: ConnectionKeeper | None = None

    def close(self) -> None:
        if self.keeper is not None:
            self.keeper.close()


def _check(node: NetNode, transport: Transport, checkers: list[str]) -> reach.Reachability:
    try:
        own = node.visible_maddrs()
        ask = reach.check(transport.p2p, checkers, own, CHECK_TIMEOUT_S)
        return transport.run(ask, timeout_s=CHECK_TIMEOUT_S * len(checkers) + 5)
    except Exception as exc:  # the check informs; a node that cannot run it still trains
        return reach.Reachability(None, 0, (), detail=f"the check failed: {exc!r}")


def set_up(relay: str, node: NetNode, transport: Transport, live_peers: Callable[[], list[str]]) -> NatSetup:
    """Check reachability, print what was found, and start what `relay` asks for (module doc)."""
    if relay not in RELAY_MODES:
        raise ValueError(f"relay mode {relay!r}: use one of {', '.join(RELAY_MODES)}")
    transport.run(reach.add_dialback(transport.gate), timeout_s=30)  # answers other peers' checks
    checkers = node.bootstrap_ids()
    found = _check(node, transport, checkers[:MAX_CHECKERS])
    log = logger.info if found.dialable else logger.warning
    for line in reach.advice(found, relay):
        log("%s", line)
    if relay == "off":
        return NatSetup(found)
    transport.relays = checkers
    keeper = None if found.dialable else ConnectionKeeper(transport, live_peers)
    return NatSetup(found, keeper)
