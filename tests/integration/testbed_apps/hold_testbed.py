"""Open a testbed with one host running a sleeper (and its child), report it, then wait.

    python hold_testbed.py [--die]

Prints one JSON line {"name", "pids", "cgroup"} once the host runs. Without --die it then waits
to be signalled (SIGINT/SIGTERM must clean up); with --die it SIGKILLs itself, leaving debris for
`cleanup_stale`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from p2p_trainer.testbed import HostSpec, Testbed, TestbedConfig

SLEEPER = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"


def main() -> None:
    tb = Testbed(TestbedConfig(hosts=(HostSpec("solo", cpu_cores=0.3),)))
    with tb:
        tb.run("solo", [sys.executable, "-c", SLEEPER], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while len(tb.pids("solo")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        cgroup = tb.host("solo").cgroup
        info = {
            "name": tb.name,
            "pids": sorted(tb.pids("solo")),
            "cgroup": str(cgroup.path if cgroup else ""),
        }
        sys.stdout.write(json.dumps(info) + "\n")
        sys.stdout.flush()
        if "--die" in sys.argv:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)


if __name__ == "__main__":
    main()
