"""Fault points: the one vocabulary of where a fault can strike, and the injector the node obeys.

The same names serve the node's own test option (`join --kill-self-at POINT:ROUND`, which the
node carries out itself, exactly at the point) and the chaos scenarios (`lab/chaos`, which time a
SIGKILL from outside, approximately):

- "inner": in the middle of the round's inner steps;
- "mix1": during the round's Mix1 (background) exchange, or DiLoCo's background re-agreement
  of anchors: the node itself strikes once it has delivered its contributions;
- "blocking": during the round's blocking exchange: the node itself strikes once it has delivered
  its contributions (phase 1), before it averages its own part, so the rest of its group waits
  for a part that never comes;
- "download": a joining peer, once it has announced itself and starts downloading the swarm's
  state (the node's round is the number of the download attempt, from 1; a joiner that waits to
  enter the groups downloads again, `entry.py`, and that attempt counts too): the swarm has it in
  view (heartbeat) but it never trains;
- "serve": a donor, halfway through sending its state to a joiner (the node's round is the number
  of the state it serves, from 1): the joiner must fetch it again from another donor.

Chaos scenarios add "any" (no particular point). Components with fault points take a
`FaultInjector` at construction and call `faults.reached(point, round)` there; the default,
`NO_FAULTS`, does nothing.
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Literal, get_args

logger = logging.getLogger(__name__)

FaultPoint = Literal["inner", "mix1", "blocking", "download", "serve"]
FAULT_POINTS: tuple[FaultPoint, ...] = get_args(FaultPoint)
CHAOS_POINTS: tuple[str, ...] = ("any", *FAULT_POINTS)
"""Where a chaos scenario's kill lands: a fault point, or "any" (at the event's time)."""


def parse_fault_point(text: str) -> tuple[FaultPoint, int]:
    """'POINT:ROUND' -> (point, round); ValueError with a message that says what to write."""
    point, _, rnd = text.partition(":")
    for known in FAULT_POINTS:
        if point == known and rnd.isdigit():
            return known, int(rnd)
    raise ValueError(f"fault point {text!r}: write POINT:ROUND with POINT one of {', '.join(FAULT_POINTS)}")


class FaultInjector:
    """SIGKILLs this node's process group (its DHT process and p2pd too) once, at `kill_at`.

    Like a machine that loses power there. Without `kill_at` it never acts (production).
    """

    def __init__(self, kill_at: tuple[FaultPoint, int] | None = None) -> None:
        self.kill_at = kill_at

    def wants(self, point: FaultPoint, round: int) -> bool:
        """Whether `reached(point, round)` would act (lets a caller prepare the exact moment)."""
        return self.kill_at == (point, round)

    def reached(self, point: FaultPoint, round: int) -> None:
        if not self.wants(point, round):
            return
        logger.warning("fault injection: SIGKILL at %s of round %d", point, round)
        for handler in logging.getLogger().handlers:
            handler.flush()
        if os.getpgrp() == os.getpid():  # our own session (as `local` and the tests start us)
            os.killpg(os.getpid(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


NO_FAULTS = FaultInjector()
"""The injector of a production node: no fault point ever acts."""
