"""What a peer trains, and on what: its model, inner optimizer, loss and batches (a `Workload`).

`Peer` is handed one. `language_model` is ours: the config's GPT or Llama on the corpus's token
stream. `p2p_trainer.api` builds one from a user's own `torch.nn.Module`, loss and batches. Either
way the method exchanges the trainable parameters in `model.named_parameters()` order, and each
micro-batch weighs `tokens_per_batch` in the token-weighted means (docs/algorithms.md §5).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from p2p_trainer.algo.work import micro_batch_tokens
from p2p_trainer.config import RunConfig
from p2p_trainer.train.data import Corpus, TokenStream, validation_batches
from p2p_trainer.train.model import build_model

LossFn = Callable[[torch.nn.Module, Any], torch.Tensor]
"""`loss_fn(model, batch)`: the scalar loss of one micro-batch, the one the inner steps minimise."""


class BatchSource(Protocol):
    position: int
    """Index of the next batch (a checkpoint keeps it)."""

    def next_batch(self) -> Any: ...


@dataclass
class Workload:
    model: torch.nn.Module
    loss_fn: LossFn
    batches: BatchSource
    tokens_per_batch: int
    """What one micro-batch weighs (§5: the work behind a contribution): tokens for a language
    model; for other data any fixed unit, the same on every peer."""
    initial_weights: Callable[[], tuple[torch.Tensor, ...]]
    """The trainable parameters every peer starts from: the final agreement's reference (§10)."""
    val_batches: Sequence[Any] | None = None
    """Batches whose mean loss is the validation loss; None: the peer does not evaluate."""
    optimizer: torch.optim.Optimizer | None = None
    """The inner optimizer; None: AdamW as `cfg.inner` says."""
    lr_schedule: Callable[[int], float] | None = None
    """Factor on each parameter group's base learning rate at inner step s; None: `cfg.inner`'s
    warm-up and cosine over the run."""


def lm_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    loss: torch.Tensor = model(x, y)
    return loss


def seed_weights(cfg: RunConfig) -> tuple[torch.Tensor, ...]:
    """The trainable parameters of the config's model as its seed makes them, the same on every peer."""
    model = build_model(cfg.model, cfg.seed)
    return tuple(p.detach() for p in model.parameters() if p.requires_grad)


def language_model(cfg: RunConfig, corpus: Corpus, peer_key: str) -> Workload:
    """Our workload: the config's model from the seed, on the peer's stream of the corpus (`peer_key`)."""
    seq, batch = cfg.model.seq_len, cfg.data.batch_size
    return Workload(
        model=build_model(cfg.model, cfg.seed),
        loss_fn=lm_loss,
        batches=TokenStream(corpus.train, seq, batch, cfg.seed, peer_key),
        tokens_per_batch=micro_batch_tokens(cfg),
        initial_weights=lambda: seed_weights(cfg),
        val_batches=validation_batches(corpus, seq, batch, cfg.data.val_batches),
    )


class BatchesExhausted(RuntimeError):
    """A one-shot iterator of batches ended before the run did."""


class IterableBatches:
    """Any iterable of batches as a `BatchSource`. A re-iterable one (a list, a DataLoader) starts
    over when it ends, as the next epoch; an iterator or generator that ends is an error, since the
    method's rounds need a batch for every inner step."""

    def __init__(self, batches: Iterable[Any]) -> None:
        self._source = batches
        self._it = iter(batches)
        self.position = 0

    def next_batch(self) -> Any:
        try:
            batch = next(self._it)
        except StopIteration:
            batch = self._next_epoch()
        self.position += 1
        return batch

    def _next_epoch(self) -> Any:
        self._it = iter(self._source)
        if self._it is self._source:
            raise BatchesExhausted(
                f"the batch iterator ended after {self.position} batches: pass a re-iterable "
                "(a list, a DataLoader) or an endless generator"
            ) from None
        try:
            return next(self._it)
        except StopIteration:
            raise BatchesExhausted("the batches are empty") from None


def to_device(batch: Any, device: torch.device) -> Any:
    """`batch` with every tensor in it (nested in tuples, lists and dicts) on `device`."""
    if isinstance(batch, torch.Tensor):
        if device.type == "cuda" and batch.device.type == "cpu" and not batch.is_pinned():
            # from pageable memory the copy first waits for the device's queue to drain, so the
            # host could not queue the next step's kernels while this one runs
            batch = batch.pin_memory()
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple takes fields one by one
        return type(batch)(*(to_device(b, device) for b in batch))
    if isinstance(batch, tuple | list):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch


@dataclass(frozen=True)
class ModelFingerprint:
    """What the peers of one run compare about a model of their own (`model_fingerprint`)."""

    parameters: str
    """Digest of the trainable parameters' names, shapes and dtypes, in order."""
    num_params: int
    initial_weights: str
    """Digest of their values: every peer must start from the same weights, or DiLoCo's anchors,
    which only ever move by the same averaged update, would never meet."""


def model_fingerprint(model: torch.nn.Module) -> ModelFingerprint:
    layout, values, count = hashlib.sha256(), hashlib.sha256(), 0
    for name, p in model.named_parameters():
        if p.requires_grad:
            layout.update(f"{name}:{tuple(p.shape)}:{p.dtype};".encode())
            values.update(p.detach().float().cpu().contiguous().numpy().tobytes())
            count += p.numel()
    return ModelFingerprint(layout.hexdigest()[:16], count, values.hexdigest()[:16])
