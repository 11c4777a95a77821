"""Open a testbed with one host running a sleeper (and its child), report it, then end in a mode.

    python hold_testbed.py wait|die|exit

Prints one JSON line {"name", "pids", "cgroup"} once the host runs. Then `wait` sleeps until it is
signalled (SIGINT/SIGTERM must clean up); `die` SIGKILLs itself, leaving debris for
`cleanup_stale`; `exit` returns without closing the testbed, leaving it to the atexit hook.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from p2p_trainer.lab.testbed import HostSpec, Testbed, TestbedConfig

SLEEPER = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)"


def main() -> None:
    mode = sys.argv[1]
    # stand in for a tool run from a terminal: a shell starts background jobs (nohup, `&`) with
    # SIGINT ignored, and the guard leaves an ignored signal alone
    signal.signal(signal.SIGINT, signal.default_int_handler)
    tb = Testbed(TestbedConfig(hosts=(HostSpec("solo", cpu_cores=0.3),)))
    tb.start()
    devnull = subprocess.DEVNULL  # the sleepers must not hold the caller's pipes open
    tb.run("solo", [sys.executable, "-c", SLEEPER], stdout=devnull, stderr=devnull)
    deadline = time.monotonic() + 20
    while len(tb.pids("solo")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    cgroup = tb.host("solo").cgroup
    info = {"name": tb.name, "pids": sorted(tb.pids("solo")), "cgroup": str(cgroup.path if cgroup else "")}
    sys.stdout.write(json.dumps(info) + "\n")
    sys.stdout.flush()
    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "wait":
        # short sleeps, not one long one: a signal that lands between the interpreter's last check
        # and the start of the sleep's system call is only handled when that call returns
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.1)
        tb.close()


if __name__ == "__main__":
    main()
