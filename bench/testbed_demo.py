"""Bring up 4 hosts at 10 Mbit/s, time TCP transfers between pairs against bytes / rate, clean up.

    python -m bench.testbed_demo

First each link of the ring h0->h1->h2->h3->h0 alone, then all four at once (every host uploads
one stream and downloads one, so each should still get its full rate). Needs root.
"""

from __future__ import annotations

import logging
import sys
from concurrent.futures import ThreadPoolExecutor

from p2p_trainer.lab.testbed import (
    Testbed,
    TestbedConfig,
    TransferResult,
    measure_transfer,
    support_problem,
    uniform_hosts,
)

N_HOSTS = 4
RATE_MBIT = 10.0
TRANSFER_BYTES = 2_000_000


def _row(label: str, result: TransferResult) -> str:
    ratio = result.ratio_to_bound or float("nan")
    bound_s = result.bound_s or float("nan")
    return (
        f"{label:<10} {result.src}->{result.dst:<4} {result.n_bytes / 1e6:6.2f} MB  "
        f"measured {result.elapsed_s:6.3f} s  bound {bound_s:6.3f} s  ratio {ratio:5.3f}  "
        f"{result.rate_mbit:6.2f} Mbit/s" + (f"  ERROR {result.error}" if result.error else "")
    )


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    problem = support_problem()
    if problem is not None:
        print(f"cannot run the testbed here: {problem}")
        return 2
    config = TestbedConfig(hosts=uniform_hosts(N_HOSTS, rate_mbit=RATE_MBIT))
    ring = [(f"h{i}", f"h{(i + 1) % N_HOSTS}") for i in range(N_HOSTS)]
    with Testbed(config) as tb:
        print(f"testbed {tb.name}: {N_HOSTS} hosts at {RATE_MBIT} Mbit/s up and down")
        before = {name: tb.counters(name) for name in tb.hosts}
        for src, dst in ring:
            print(_row("alone", measure_transfer(tb, src, dst, TRANSFER_BYTES)))
        with ThreadPoolExecutor(max_workers=N_HOSTS) as pool:
            futures = [pool.submit(measure_transfer, tb, src, dst, TRANSFER_BYTES) for src, dst in ring]
            for future in futures:
                print(_row("concurrent", future.result()))
        for name in tb.hosts:
            delta = tb.counters(name) - before[name]
            print(
                f"{name}: sent {delta.tx_bytes / 1e6:.3f} MB, received {delta.rx_bytes / 1e6:.3f} MB "
                f"(payload {2 * TRANSFER_BYTES / 1e6:.3f} MB each way)"
            )
    print("cleaned up")
    return 0


if __name__ == "__main__":
    sys.exit(main())
