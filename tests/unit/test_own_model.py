"""A workload of one's own (`train/workload.py`, `p2p_trainer.api`): a Peer trains any module with
any loss and batches, and the run definition names the model, so other models are refused."""

from __future__ import annotations

import dataclasses
import threading
from collections import namedtuple
from typing import Any

import pytest
import torch
from torch import nn

from bench.fuzz.fakes import DictDHT
from p2p_trainer.api import OwnModelRun, _checked, run_config
from p2p_trainer.config import OuterConfig, RunConfig, load_config
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.net import records
from p2p_trainer.net.records import RunDefinition, RunDefinitionMismatch
from p2p_trainer.train.trainer import Peer, RoundMetrics
from p2p_trainer.train.workload import (
    BatchesExhausted,
    IterableBatches,
    Workload,
    model_fingerprint,
    to_device,
)
from tests.unit.test_record_bounds import SIGNERS


def mlp(seed: int = 0, hidden: int = 16) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, hidden), nn.Tanh(), nn.Linear(hidden, 1))


def mse(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.mse_loss(model(x), y)


def regression(seed: int, n: int = 8) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(16, 4, generator=g) for _ in range(n)]
    return [(x, x.sum(1, keepdim=True).sin()) for x in xs]


def workload(model: nn.Module, data: list[Any]) -> Workload:
    initial = tuple(p.detach().clone() for p in model.parameters())
    return Workload(
        model=model,
        loss_fn=_checked(mse),
        batches=IterableBatches(data),
        tokens_per_batch=16,
        initial_weights=lambda: initial,
        val_batches=regression(99, 2),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
        lr_schedule=lambda step: 1.0,
    )


def test_peers_train_their_own_module_and_merge() -> None:
    cfg = RunConfig(rounds=4, outer=OuterConfig.for_method("diloco", num_inner_steps=5))
    swarm = InProcessSwarm(2, cfg.seed)
    peers = [
        Peer(cfg, swarm.exchange(i), workload=workload(mlp(), regression(i)), self_id=f"p{i}")
        for i in range(2)
    ]
    history: list[list[RoundMetrics]] = [[], []]

    def train(i: int) -> None:
        history[i] = peers[i].train(cfg.rounds)

    threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for rounds in history:
        assert len(rounds) == cfg.rounds and all(m.merged_with == 2 for m in rounds)
        assert rounds[-1].train_loss < rounds[0].train_loss
        assert rounds[-1].tokens == cfg.rounds * 5 * 16  # each micro-batch weighs tokens_per_batch
    for a, b in zip(peers[0].state.anchor, peers[1].state.anchor, strict=True):  # DiLoCo: one φ
        torch.testing.assert_close(a, b)
    assert peers[0].evaluate() < peers[0].evaluate(list(peers[0].workload.initial_weights()))


def test_the_fingerprint_names_layout_and_initial_weights() -> None:
    same, other_init, other_shape = (
        model_fingerprint(mlp(0)),
        model_fingerprint(mlp(1)),
        model_fingerprint(mlp(0, 8)),
    )
    assert model_fingerprint(mlp(0)) == same
    assert other_init.parameters == same.parameters and other_init.initial_weights != same.initial_weights
    assert other_shape.parameters != same.parameters and other_shape.num_params < same.num_params


def own_run(model: nn.Module, name: str = "mine") -> OwnModelRun:
    f = model_fingerprint(model)
    base = {field.name: getattr(RunConfig(), field.name) for field in dataclasses.fields(RunConfig)}
    return OwnModelRun(
        **base,
        run_name=name,
        model_parameters=f.parameters,
        model_num_params=f.num_params,
        model_initial_weights=f.initial_weights,
    )


def _refusal(ours: RunConfig, swarm: RunConfig) -> str:
    dht = DictDHT()
    swarm_def = RunDefinition(swarm.run_definition())
    records.check_run_definition(dht, "run", swarm_def, 30, SIGNERS[0], verify=False)
    with pytest.raises(RunDefinitionMismatch) as raised:
        records.check_run_definition(
            dht, "run", RunDefinition(ours.run_definition()), 30, SIGNERS[1], verify=False
        )
    return str(raised.value)


def test_a_peer_with_another_model_is_refused_with_the_reason() -> None:
    mine = own_run(mlp(0))
    assert "model" not in mine.run_definition() and "data_hash" not in mine.run_definition()  # no corpus read
    assert own_run(mlp(0)).run_id() == mine.run_id() != own_run(mlp(0), "theirs").run_id()
    message = _refusal(own_run(mlp(1)), mine)
    assert "1 field(s): own_model.initial_weights" in message and "torch.manual_seed" in message
    message = _refusal(own_run(mlp(0, 8)), mine)
    assert "own_model.parameters" in message and "other parameter names, shapes or dtypes" in message


def test_run_config_takes_the_shortcuts_on_top_of_the_config() -> None:
    cfg = run_config(method="diloco", inner_steps=7, rounds=3, seed=5)
    assert (cfg.outer.method, cfg.outer.outer_momentum, cfg.outer.num_inner_steps) == ("diloco", 0.9, 7)
    assert (cfg.rounds, cfg.seed) == (3, 5)
    with pytest.raises(ValueError, match="give the method in one place"):
        run_config(RunConfig(outer=OuterConfig.for_method("noloco")), method="diloco")
    with pytest.raises(ValueError, match="target_tokens_per_round"):
        run_config(RunConfig(outer=OuterConfig.for_method("diloco", target_tokens_per_round=10**6)))


def test_the_api_runs_what_the_command_line_runs_by_default() -> None:
    # the shipped default run: DiLoCo with int8 updates, models in float16, whole groups
    default = run_config()
    assert (default.outer.method, default.outer.num_inner_steps) == ("diloco", 20)
    assert (default.exchange.update_codec, default.exchange.wire_dtype) == ("int8", "float16")
    assert default.exchange.quorum_fraction == 1.0
    assert default == load_config(None)
    # a method changes only the method, as `--method` does: the exchange settings stay
    noloco = run_config(method="noloco")
    assert noloco == load_config(None, method="noloco")
    assert (noloco.outer.method, noloco.outer.num_inner_steps) == ("noloco", 20)
    assert noloco.exchange == default.exchange


def test_batches_start_over_unless_they_are_a_one_shot_iterator() -> None:
    epochs = IterableBatches([1, 2])
    assert [epochs.next_batch() for _ in range(5)] == [1, 2, 1, 2, 1] and epochs.position == 5
    once = IterableBatches(iter([1]))
    once.next_batch()
    with pytest.raises(BatchesExhausted, match="ended after 1 batches"):
        once.next_batch()


def test_nested_batches_move_to_the_device() -> None:
    pair = namedtuple("pair", "x y")
    batch = {"a": [torch.ones(1), pair(torch.zeros(1), 3)], "b": "text"}
    moved = to_device(batch, torch.device("meta"))
    assert moved["a"][0].is_meta and moved["a"][1].x.is_meta and moved["a"][1].y == 3 and moved["b"] == "text"


def test_a_loss_without_gradient_says_why() -> None:
    model, batch = mlp(), regression(0, 1)[0]
    with pytest.raises(ValueError, match=r"torch\.no_grad"):
        _checked(lambda m, b: mse(m, b).detach())(model, batch)
    with pytest.raises(TypeError, match="scalar tensor"):
        _checked(lambda m, b: 0.5)(model, batch)  # type: ignore[arg-type, return-value]
