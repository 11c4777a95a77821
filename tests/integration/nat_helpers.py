"""Helpers of the NAT tests: testbed layouts with NAT routers, the skip, stopping a node."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

import pytest

from p2p_trainer.lab.testbed import HostSpec, Testbed
from p2p_trainer.lab.testbed import nat as tb_nat
from p2p_trainer.lab.testbed import netns as tb_netns


def nat_hosts(*behind: tuple[str, str], public: tuple[str, ...] = ("pub",)) -> tuple[HostSpec, ...]:
    """Uncapped hosts without CPU quotas: `public` ones on the switch, then one router per distinct
    router name in `behind` ((host, router) pairs), each followed by the hosts behind it."""
    hosts = [HostSpec(name, None, None, None) for name in public]
    for router in dict.fromkeys(r for _, r in behind):
        hosts.append(HostSpec(router, None, None, None, nat=True))
        hosts += [HostSpec(host, None, None, None, behind=router) for host, r in behind if r == router]
    return tuple(hosts)


def skip_without_nat() -> None:
    problem = tb_netns.support_problem() or tb_nat.support_problem()
    if problem is not None:
        pytest.skip(f"NAT testbed unavailable: {problem}")


def stop(tb: Testbed, proc: subprocess.Popen[Any]) -> None:
    """SIGTERM (the node logs what it relayed as it stops), SIGKILL if it does not exit."""
    if proc.poll() is None:
        tb.signal(proc.pid, signal.SIGTERM, tree=False)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        tb.kill(proc.pid)
