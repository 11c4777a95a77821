"""pytest fixtures for tests that need the emulated WAN.

    from p2p_trainer.lab.testbed.pytest_fixture import testbed_factory  # noqa: F401  (a fixture)

    def test_something(testbed_factory):
        tb = testbed_factory(TestbedConfig(hosts=uniform_hosts(2)))
        ...

The factory starts each testbed and closes it at teardown (asserting that cleanup left nothing).
Tests using it are skipped, with the reason, when not root or `ip netns`/`tc` is unavailable.
Leftovers of earlier, dead test processes are removed once per session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from p2p_trainer.lab.testbed.layout import TestbedConfig
from p2p_trainer.lab.testbed.netns import support_problem
from p2p_trainer.lab.testbed.stale import cleanup_stale
from p2p_trainer.lab.testbed.testbed import Testbed

TestbedFactory = Callable[[TestbedConfig], Testbed]

_stale_checked: set[str] = set()


def skip_unless_supported() -> None:
    """Skip the calling test with the reason when this machine cannot run a testbed."""
    problem = support_problem()
    if problem is not None:
        pytest.skip(f"WAN testbed unavailable: {problem}")


@pytest.fixture
def testbed_factory() -> Iterator[TestbedFactory]:
    """Build started testbeds; all are closed after the test, in reverse order."""
    skip_unless_supported()
    opened: list[Testbed] = []

    def make(config: TestbedConfig) -> Testbed:
        if config.name_prefix not in _stale_checked:
            cleanup_stale(config.name_prefix)
            _stale_checked.add(config.name_prefix)
        tb = Testbed(config)
        tb.start()
        opened.append(tb)
        return tb

    yield make
    for tb in reversed(opened):
        tb.close()
