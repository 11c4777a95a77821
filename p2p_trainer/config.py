"""Run configuration: one frozen dataclass per component, nested in `RunConfig`.

Every field is documented under it and validated in `__post_init__` with a message that says what
to change. `load_config` reads a TOML file; unknown keys are errors, not silently ignored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomllib

METHODS = ("factored", "noloco", "diloco", "data-parallel", "independent")


class ConfigError(ValueError):
    """A configuration value that cannot work; the message says what to change."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256
    """Byte-level tokens by default."""
    d_model: int = 128
    """Width of the residual stream."""
    n_layers: int = 4
    n_heads: int = 4
    seq_len: int = 128
    """Context length in tokens (learned positions up to this length)."""
    mlp_ratio: int = 4
    dropout: float = 0.0

    def __post_init__(self) -> None:
        _require(self.vocab_size >= 2, f"model.vocab_size={self.vocab_size}: use at least 2 (256 for bytes)")
        _require(self.d_model > 0 and self.n_layers > 0, "model.d_model and model.n_layers must be positive")
        _require(
            self.n_heads > 0 and self.d_model % self.n_heads == 0,
            f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}",
        )
        _require(self.seq_len >= 2, f"model.seq_len={self.seq_len}: use at least 2")
        _require(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout}: use a value in [0, 1)")


@dataclass(frozen=True)
class DataConfig:
    corpus: str = "shakespeare"
    """'shakespeare' (bundled plays) or a path to a text file or a directory of .txt files."""
    val_fraction: float = 0.1
    """Share of documents (whole plays/files) held out for validation, never trained on."""
    batch_size: int = 16
    """Sequences per micro-batch."""
    val_batches: int = 8
    """Micro-batches per validation-loss estimate (fixed, so estimates are comparable)."""

    def __post_init__(self) -> None:
        _require(
            0.0 < self.val_fraction < 1.0, f"data.val_fraction={self.val_fraction}: use a value in (0, 1)"
        )
        _require(self.batch_size > 0, f"data.batch_size={self.batch_size}: use a positive number")
        _require(self.val_batches > 0, f"data.val_batches={self.val_batches}: use a positive number")


@dataclass(frozen=True)
class InnerConfig:
    lr: float = 1e-3
    """Peak AdamW learning rate."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    """Cosine decays to lr * min_lr_ratio at the end of the run."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    grad_accum: int = 1
    """Micro-batches per inner step."""
    bf16: bool = False
    """bf16 autocast for forward/backward (use on GPU)."""
    eval_every: int = 50
    """Validation loss every this many inner steps; 0 = only at the end."""

    def __post_init__(self) -> None:
        _require(self.lr > 0, f"inner.lr={self.lr}: use a positive learning rate")
        _require(self.weight_decay >= 0, f"inner.weight_decay={self.weight_decay}: use >= 0")
        _require(all(0 <= b < 1 for b in self.betas), f"inner.betas={self.betas}: use values in [0, 1)")
        _require(self.warmup_steps >= 0, "inner.warmup_steps must be >= 0")
        _require(0 <= self.min_lr_ratio <= 1, "inner.min_lr_ratio must be in [0, 1]")
        _require(self.grad_clip >= 0, "inner.grad_clip must be >= 0 (0 disables)")
        _require(self.grad_accum >= 1, f"inner.grad_accum={self.grad_accum}: use at least 1")
        _require(self.eval_every >= 0, "inner.eval_every must be >= 0")


# Reference hyperparameters per method (docs/algorithms.md §1–§3).
WIRE_DTYPES = ("float32", "float16")
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "diloco": {"outer_lr": 0.7, "outer_momentum": 0.9, "num_inner_steps": 50},
    "noloco": {"outer_lr": 0.7, "outer_momentum": 0.5, "num_inner_steps": 50, "group_size": 2},
    # β = 0.5 as NoLoCo: with pair-sized groups the pseudo-gradient is noisy, and DiLoCo's 0.9 over-amplifies
    # it (measured in-process: 2.502 vs 2.472 nats/byte after 300 steps; see the core issue's closing note).
    "factored": {
        "outer_lr": 0.7,
        "outer_momentum": 0.5,
        "num_inner_steps": 50,
        "group_size": 2,
        "align_rounds": True,  # no barrier: round-keyed Mix1 pairs meet only if rounds start together
    },
    "data-parallel": {"num_inner_steps": 50},
    "independent": {"num_inner_steps": 50},
}


@dataclass(frozen=True)
class OuterConfig:
    method: str = "factored"
    """One of: factored, noloco, diloco, data-parallel, independent."""
    num_inner_steps: int = 50
    """H: inner steps per outer round."""
    outer_lr: float = 0.7
    """α."""
    outer_momentum: float = 0.5
    """β (0.9 for DiLoCo, 0.5 for NoLoCo and factored)."""
    gamma: float | None = None
    """NoLoCo's γ (pull towards the group's anchors); None means γ = α."""
    group_size: int = 2
    """g: NoLoCo's group and factored Mix1's group G1 (0 = all peers)."""
    mix2_group_size: int = 2
    """g2: factored Mix2's group on pseudo-gradients (0 = all peers, i.e. an all-reduce)."""
    mix2_rounds: int = 1
    """k2: consecutive Mix2 gossip rounds per blocking phase (0 skips Mix2)."""
    mix2_every: int = 1
    """Run Mix2 every K outer rounds (the knob between utilisation and agreement)."""
    token_weighted: bool = True
    """Weight group means by tokens processed since the last merge (docs/algorithms.md §5)."""
    exchange_timeout_s: float = 60.0
    """Upper bound on a blocking exchange; a timed-out exchange is a Failed value."""
    mix1_grace_s: float = 5.0
    """Extra wait for Mix1 at round end before falling back to the own anchor (§3, §4)."""
    quorum_fraction: float = 0.5
    """§4: a blocking exchange proceeds once ceil(fraction · group size) members (self included)
    have contributed, then waits at most the grace window for the rest. 1.0 waits for everyone
    (still bounded by `quorum_wait_max_s`)."""
    quorum_wait_max_s: float = 15.0
    """Longest wait for the quorum itself; past it the exchange merges whatever arrived."""
    grace_overlap_steps: float = 5.0
    """τ: inner steps' worth of time one accepts to wait for stragglers after the quorum."""
    grace_gamma: float = 1.0
    """γ_g: scale of the adaptive grace window."""
    grace_min_s: float = 1.0
    """Floor of the grace window (ours: covers network jitter when steps are very short)."""
    grace_max_s: float = 5.0
    """Cap of the grace window; a survivor's pause is at most `pause_bound_s`."""
    align_rounds: bool = False
    """Factored gossip: a peer that starts a round behind the earliest peer of its round (DHT
    heartbeats) leaves out the inner steps it is late by (at most H − 1), so round starts line up and
    round-keyed Mix1 pairs meet; token weighting (§5) counts the shorter round less. On by default
    for factored. Off whenever target_tokens_per_round > 0: constant work fixes each round's tokens."""
    target_tokens_per_round: int = 0
    """T (§6, constant work per round): tokens the whole swarm processes per outer round. Each live
    peer takes an equal share and tops up with extra micro-batches (gradient accumulation) when peers
    vanish, so every update sees the same amount of data as in a failure-free run. 0 disables it:
    each peer then does num_inner_steps × inner.grad_accum micro-batches whatever the swarm's size.
    Set it to peers × num_inner_steps × grad_accum × batch_size × seq_len for the planned swarm."""
    wire_dtype: str = "float32"
    """Number format of exchanged values on the wire: float32, or float16 (half the bytes, so half
    the time on a slow link; values are averaged in float64 either way, and a part holding a value
    beyond float16's range is sent as float32). Every member of a group gets identical results."""

    def __post_init__(self) -> None:
        _require(self.method in METHODS, f"outer.method={self.method!r}: choose one of {', '.join(METHODS)}")
        _require(self.num_inner_steps >= 1, f"outer.num_inner_steps={self.num_inner_steps}: use at least 1")
        _require(self.outer_lr > 0, f"outer.outer_lr={self.outer_lr}: use a positive value (0.7 is standard)")
        _require(0 <= self.outer_momentum < 1, f"outer.outer_momentum={self.outer_momentum}: use [0, 1)")
        _require(self.gamma is None or self.gamma >= 0, f"outer.gamma={self.gamma}: use >= 0 or leave unset")
        _require(self.group_size >= 0 and self.group_size != 1, "outer.group_size: use 0 (all) or >= 2")
        _require(
            self.mix2_group_size >= 0 and self.mix2_group_size != 1, "outer.mix2_group_size: use 0 or >= 2"
        )
        _require(self.mix2_rounds >= 0, "outer.mix2_rounds must be >= 0 (0 skips Mix2)")
        _require(self.mix2_every >= 1, "outer.mix2_every must be >= 1")
        _require(self.exchange_timeout_s > 0, "outer.exchange_timeout_s must be positive")
        _require(self.mix1_grace_s >= 0, "outer.mix1_grace_s must be >= 0")
        _require(
            self.wire_dtype in WIRE_DTYPES,
            f"outer.wire_dtype={self.wire_dtype!r}: choose one of {', '.join(WIRE_DTYPES)}",
        )
        _require(
            0 < self.quorum_fraction <= 1,
            f"outer.quorum_fraction={self.quorum_fraction}: use a value in (0, 1] (0.5 = half the group)",
        )
        _require(self.quorum_wait_max_s > 0, "outer.quorum_wait_max_s must be positive")
        _require(self.grace_overlap_steps >= 0, "outer.grace_overlap_steps must be >= 0")
        _require(self.grace_gamma >= 0, "outer.grace_gamma must be >= 0")
        _require(
            0 <= self.grace_min_s <= self.grace_max_s,
            f"outer.grace_min_s={self.grace_min_s} and grace_max_s={self.grace_max_s}: need 0 <= min <= max",
        )

        _require(
            self.target_tokens_per_round >= 0,
            f"outer.target_tokens_per_round={self.target_tokens_per_round}: use >= 0 (0 disables)",
        )

    @property
    def pause_bound_s(self) -> float:
        """Longest a blocking exchange can hold a peer: quorum wait, grace, then results (≤ 2 · grace),
        and never more than `exchange_timeout_s`."""
        return min(self.exchange_timeout_s, self.quorum_wait_max_s + 3 * self.grace_max_s)

    @property
    def effective_gamma(self) -> float:
        return self.outer_lr if self.gamma is None else self.gamma

    @classmethod
    def for_method(cls, method: str, **overrides: Any) -> OuterConfig:
        """The reference hyperparameters of `method`, with `overrides` on top."""
        _require(method in METHODS, f"method {method!r}: choose one of {', '.join(METHODS)}")
        return cls(method=method, **{**METHOD_DEFAULTS[method], **overrides})


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0
    """Run seed: initial weights, data order and groups derive from it (with peer id and round)."""
    rounds: int = 8
    """Outer rounds to train; the inner schedule spans rounds * num_inner_steps steps."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    inner: InnerConfig = field(default_factory=InnerConfig)
    outer: OuterConfig = field(default_factory=OuterConfig)

    def __post_init__(self) -> None:
        _require(self.rounds >= 1, f"rounds={self.rounds}: use at least 1")
        micro = self.data.batch_size * self.model.seq_len
        target = self.outer.target_tokens_per_round
        _require(
            target == 0 or target >= self.outer.num_inner_steps * micro,
            f"outer.target_tokens_per_round={target} is less than one micro-batch per inner step "
            f"({self.outer.num_inner_steps} × {micro} tokens); raise it or set 0",
        )

    @property
    def total_inner_steps(self) -> int:
        return self.rounds * self.outer.num_inner_steps

    def run_definition(self) -> dict[str, Any]:
        """What every peer of one swarm must agree on (model shape, method, data, seed, work target)."""
        definition = {
            "model": dataclasses.asdict(self.model),
            "method": self.outer.method,
            "num_inner_steps": self.outer.num_inner_steps,
            "corpus": self.data.corpus,
            "val_fraction": self.data.val_fraction,
            "seed": self.seed,
        }
        if self.outer.target_tokens_per_round:  # only when set, so existing swarms keep their run id
            definition["target_tokens_per_round"] = self.outer.target_tokens_per_round
        return definition

    def run_id(self) -> str:
        blob = json.dumps(self.run_definition(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


_SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "inner": InnerConfig,
    "outer": OuterConfig,
}


def config_from_dict(raw: dict[str, Any], where: str = "config") -> RunConfig:
    """Build a RunConfig from nested dicts; unknown keys are errors naming the allowed ones."""
    kwargs: dict[str, Any] = {}
    top_fields = {f.name for f in dataclasses.fields(RunConfig)}
    for key, value in raw.items():
        _require(key in top_fields, f"{where}: unknown key {key!r}; allowed: {', '.join(sorted(top_fields))}")
        if key in _SECTIONS:
            _require(isinstance(value, dict), f"{where}: [{key}] must be a table")
            kwargs[key] = _section(_SECTIONS[key], value, f"{where} [{key}]")
        else:
            kwargs[key] = value
    if "outer" in raw and "method" in raw["outer"]:
        # Unset fields take the chosen method's reference values, not factored's.
        defaults = {**METHOD_DEFAULTS[kwargs["outer"].method], **raw["outer"]}
        kwargs["outer"] = _section(OuterConfig, defaults, f"{where} [outer]")
    try:
        return RunConfig(**kwargs)
    except TypeError as exc:  # wrong value types reach here as TypeErrors from comparisons
        raise ConfigError(f"{where}: {exc}") from exc


def _section(cls: type, values: dict[str, Any], where: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(values) - names
    _require(not unknown, f"{where}: unknown key(s) {sorted(unknown)}; allowed: {', '.join(sorted(names))}")
    if "betas" in values:
        values = {**values, "betas": tuple(values["betas"])}
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def load_config(path: str | Path) -> RunConfig:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    return config_from_dict(raw, where=str(path))


def to_toml(cfg: RunConfig) -> str:
    """The config as TOML (flat tables), so every peer process loads exactly this run."""
    lines = [f"seed = {cfg.seed}", f"rounds = {cfg.rounds}"]
    for name in ("model", "data", "inner", "outer"):
        lines.append(f"\n[{name}]")
        for key, value in dataclasses.asdict(getattr(cfg, name)).items():
            if value is None:
                continue
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, str):
                lines.append(f"{key} = {json.dumps(value)}")
            elif isinstance(value, tuple | list):
                lines.append(f"{key} = [{', '.join(repr(v) for v in value)}]")
            else:
                lines.append(f"{key} = {value!r}")
    return "\n".join(lines) + "\n"
