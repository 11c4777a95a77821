"""`outer.offload`: φ, m and θ's staging copy on the host (train/host_state.py).

On the CPU the offloaded path is forced (a separate staging copy of θ, synchronous copies) and
must give exactly the plain path's values; the CUDA specifics run where a device is visible.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from p2p_trainer.config import ConfigError, DataConfig, InnerConfig, ModelConfig, OuterConfig, RunConfig
from p2p_trainer.config.toml_io import config_from_dict
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.train.checkpoint import load_checkpoint, save_checkpoint
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.host_state import HostMirror, offloads
from p2p_trainer.train.trainer import Peer

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible to torch")


def _cfg(method: str, offload: str = "auto", **outer: object) -> RunConfig:
    return RunConfig(
        rounds=3,
        model=ModelConfig(d_model=16, n_layers=1, n_heads=2, seq_len=16),
        data=DataConfig(batch_size=2, val_batches=1),
        inner=InnerConfig(eval_every=0, warmup_steps=1),
        outer=OuterConfig.for_method(method, num_inner_steps=3, offload=offload, **outer),  # type: ignore[arg-type]
    )


def _train(cfg: RunConfig, forced: bool, device: str = "cpu") -> list[Peer]:
    """Two peers over the in-process backend, `cfg.rounds` rounds each; `forced`: through a
    separate staging copy of θ, as on an accelerator."""
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    swarm = InProcessSwarm(2, cfg.seed)
    peers = [Peer(cfg, swarm.exchange(i), corpus, f"p{i}", device=device) for i in range(2)]
    if forced:
        for p in peers:
            p.mirror = HostMirror(p.params, offload=True)
            assert p.mirror.fast[0] is not p.params[0]
    threads = [threading.Thread(target=p.train, args=(cfg.rounds,)) for p in peers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return peers


def test_offload_modes() -> None:
    cpu, cuda, mps = torch.device("cpu"), torch.device("cuda"), torch.device("mps")
    assert not any(offloads(mode, cpu) for mode in ("auto", "on", "off"))
    assert offloads("auto", cuda) and offloads("on", cuda) and not offloads("off", cuda)
    assert offloads("on", mps) and not offloads("auto", mps)


def test_a_bad_offload_value_says_what_to_choose() -> None:
    with pytest.raises(ConfigError, match=r"outer\.offload='yes': choose one of auto, on, off"):
        OuterConfig(offload="yes")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"outer\.offload=True: choose one of auto, on, off"):
        config_from_dict({"outer": {"offload": True}})
    assert config_from_dict({"outer": {"offload": "off"}}).outer.offload == "off"


def test_on_the_cpu_the_outer_step_uses_the_parameters_themselves() -> None:
    cfg = _cfg("diloco", offload="on")
    peer = Peer(cfg, InProcessSwarm(1, 0).exchange(0), load_corpus(cfg.data, cfg.model.seq_len), "p0")
    assert not peer.mirror.offload and peer.mirror.pull() is peer.params
    memory = peer.outer_memory()
    model_bytes = sum(p.numel() * 4 for p in peer.params)
    assert (memory.anchor, memory.momentum) == (model_bytes, model_bytes)
    assert (memory.staging, memory.where) == (0, "cpu")


@pytest.mark.parametrize("method", ["diloco", "factored", "noloco", "data-parallel"])
def test_the_offloaded_path_gives_the_plain_paths_values(method: str) -> None:
    cfg = _cfg(method)
    plain, staged = _train(cfg, forced=False), _train(cfg, forced=True)
    for a, b in zip(plain, staged, strict=True):
        assert b.state.round == cfg.rounds
        theirs = b.params + b.state.anchor + b.state.momentum
        for x, y in zip(a.params + a.state.anchor + a.state.momentum, theirs, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        assert b.outer_memory().staging == sum(p.numel() * 4 for p in b.params)


def test_streaming_fragments_through_the_staging_copy() -> None:
    cfg = _cfg("diloco", fragments=2)
    plain, staged = _train(cfg, forced=False), _train(cfg, forced=True)
    for a, b in zip(plain, staged, strict=True):
        for x, y in zip(a.params + a.state.anchor, b.params + b.state.anchor, strict=True):
            torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_a_checkpoint_puts_the_outer_state_where_the_mirror_keeps_it(tmp_path: Path) -> None:
    cfg = _cfg("diloco")
    (peer,) = _train_one(cfg)
    save_checkpoint(peer, tmp_path / "c.safetensors")
    (fresh,) = _train_one(cfg, rounds=0)
    load_checkpoint(fresh, tmp_path / "c.safetensors")
    assert all(a.device == fresh.mirror.state_device for a in fresh.state.anchor + fresh.state.momentum)


def _train_one(cfg: RunConfig, rounds: int = 1, device: str = "cpu") -> list[Peer]:
    corpus = load_corpus(cfg.data, cfg.model.seq_len)
    peer = Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), corpus, "p0", device=device)
    peer.train(rounds)
    return [peer]


def test_the_inner_optimizer_is_fused_on_the_cpu_and_steps_as_the_loop_does() -> None:
    (peer,) = _train_one(_cfg("independent"), rounds=0)
    assert peer.optimizer.defaults.get("fused") is True
    # the fused kernel's step equals torch's per-tensor loop to float32 rounding
    torch.manual_seed(0)
    start = [torch.randn(64, 32), torch.randn(32)]
    grads = [[torch.randn_like(p) for p in start] for _ in range(3)]
    results = []
    for fused in (True, False):
        params = [p.clone().requires_grad_(True) for p in start]
        opt = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
        for step_grads in grads:
            for p, g in zip(params, step_grads, strict=True):
                p.grad = g.clone()
            opt.step()
        results.append([p.detach() for p in params])
    for fused_p, loop_p, p0 in zip(*results, start, strict=True):
        assert not torch.equal(fused_p, p0)  # the steps moved it
        torch.testing.assert_close(fused_p, loop_p, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- CUDA only
@needs_cuda
def test_on_cuda_the_outer_state_is_pinned_host_memory_and_matches_the_device_path() -> None:
    on = _cfg("diloco", offload="auto")
    off = _cfg("diloco", offload="off")
    staged, resident = _train(on, forced=False, device="cuda"), _train(off, forced=False, device="cuda")
    for a, b in zip(staged, resident, strict=True):
        assert a.mirror.offload and all(t.is_pinned() for t in a.mirror.fast)
        assert all(t.device.type == "cpu" for t in a.state.anchor + a.state.momentum)
        assert all(t.device.type == "cuda" for t in b.state.anchor + b.state.momentum)
        assert a.outer_memory().where == "cpu" and b.outer_memory().where == "cuda"
        assert a.optimizer.defaults.get("fused") is True
        for x, y in zip(a.params, b.params, strict=True):
            torch.testing.assert_close(x, y.to(x.device))


@needs_cuda
def test_on_cuda_offload_keeps_the_outer_state_off_the_device() -> None:
    model_bytes = 0
    used = {}
    for mode in ("on", "off"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        (peer,) = _train_one(_cfg("diloco", offload=mode), rounds=1, device="cuda")
        torch.cuda.synchronize()
        used[mode] = torch.cuda.memory_allocated() - before
        model_bytes = sum(p.numel() * 4 for p in peer.params)
        del peer
    assert used["off"] - used["on"] >= 2 * model_bytes  # φ and m


@needs_cuda
def test_on_cuda_the_copy_back_is_queued_not_waited_for() -> None:
    (peer,) = _train_one(_cfg("diloco", offload="on"), rounds=1, device="cuda")
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(8):  # keep the stream busy so a copy queued behind it cannot have finished
        big = big @ big / 4096
    done = torch.cuda.Event()
    peer.mirror.push()
    done.record()
    assert not done.query(), "push waited for the device's queue"
    torch.cuda.synchronize()
