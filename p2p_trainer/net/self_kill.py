"""A test tool: the node SIGKILLs itself (its process group: DHT process and p2pd) at a phase.

From outside, a phase that lasts milliseconds (a blocking exchange on loopback) cannot be hit by
a signal. The node calls `SelfKill` at its phase points instead; it acts once, at the chosen
phase and round, like a machine that loses power there:

- "inner": in the middle of the round's inner steps;
- "mix1": once the round's Mix1 (background) exchange has delivered its contributions;
- "exchange": once a blocking exchange has delivered its contributions (phase 1), before this
  peer averages its own part: the rest of its group then waits for a part that never comes;
- "download": a joining peer, once it has announced itself and starts downloading the swarm's
  state (the round is the number of the download attempt, from 1): the swarm has it in view
  (heartbeat) but it never trains;
- "serve": a donor, halfway through sending its state to a joiner (the round is the number of
  the state it serves, from 1): the joiner must fetch it again from another donor.
"""

from __future__ import annotations

import logging
import os
import signal

logger = logging.getLogger(__name__)

PHASES = ("inner", "mix1", "exchange", "download", "serve")


def parse_kill_at(text: str) -> tuple[str, int]:
    """'PHASE:ROUND' -> (phase, round); ValueError with a message that says what to write."""
    phase, _, rnd = text.partition(":")
    if phase not in PHASES or not rnd.isdigit():
        raise ValueError(f"kill point {text!r}: write PHASE:ROUND with PHASE one of {', '.join(PHASES)}")
    return phase, int(rnd)


class SelfKill:
    def __init__(self, phase: str, round: int) -> None:
        self.phase, self.round = phase, round

    def wants(self, phase: str, round: int) -> bool:
        return (phase, round) == (self.phase, self.round)

    def __call__(self, phase: str, round: int) -> None:
        if not self.wants(phase, round):
            return
        logger.warning("fault injection: SIGKILL at %s of round %d", phase, round)
        for handler in logging.getLogger().handlers:
            handler.flush()
        if os.getpgrp() == os.getpid():  # our own session (as `local` and the tests start us)
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
