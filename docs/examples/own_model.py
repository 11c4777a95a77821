"""Train a model of one's own with a swarm: a small MLP learns a fixed function (docs/python-api.md).

The first peer starts the swarm and prints how others join it; start the others, on this machine
or others, with that line:

    python docs/examples/own_model.py
    python docs/examples/own_model.py --initial-peers /ip4/192.168.1.5/tcp/41337/p2p/Qm...

(or start every peer with the `--initial-peers` line that `p2p-trainer bootstrap` prints).
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterator

import torch
from torch import nn

import p2p_trainer

FEATURES = 16


def mlp(hidden: int) -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def batches(
    target: nn.Module, generator: torch.Generator, size: int = 64
) -> Iterator[tuple[torch.Tensor, ...]]:
    """An endless stream of (input, target output) pairs."""
    while True:
        x = torch.randn(size, FEATURES, generator=generator)
        with torch.no_grad():  # (never yield inside it: gradients would stay off for the caller)
            y = target(x)
        yield x, y


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--initial-peers", action="append", default=[], help="a running peer's address")
    parser.add_argument("--host", default="0.0.0.0", help="the address to listen on")
    parser.add_argument("--rounds", type=int, default=20, help="outer rounds of the run")
    parser.add_argument("--peers", type=int, default=2, help="wait for this many peers before training")
    parser.add_argument("--save", help="write the trained model's state_dict to this file")
    args = parser.parse_args()

    torch.manual_seed(0)  # every peer builds the same function to learn and the same initial model
    target, model = mlp(hidden=8), mlp(hidden=64)
    own_data = torch.Generator()
    own_data.seed()  # but each peer draws its own samples
    val_batches = list(itertools.islice(batches(target, torch.Generator().manual_seed(1)), 4))

    with p2p_trainer.Swarm(
        "own-model-example",
        args.initial_peers,
        host=args.host,
        method="diloco",
        inner_steps=20,
        rounds=args.rounds,
        wait_for_peers=args.peers,
    ) as swarm:
        if not args.initial_peers:
            print("others join with:", *(f"--initial-peers {a}" for a in swarm.addresses), flush=True)
        trainer = swarm.trainer(
            model,
            loss_fn,
            batches(target, own_data),
            optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
            val_batches=val_batches,
        )
        for m in trainer.rounds():
            print(f"round {m.round}: loss {m.train_loss:.5f}, merged with {m.merged_with} peers", flush=True)
        final = trainer.finish()  # one last average with every peer: all keep the same model
        merged = final.agreement.group_size if final.agreement and final.agreement.merged else 1
        print(f"final: validation loss {final.val_loss:.5f}, agreed with {merged} peers", flush=True)
    if args.save:
        torch.save(model.state_dict(), args.save)


if __name__ == "__main__":
    main()
