"""The outer method's config (with per-method defaults) and `RunConfig`, which nests every section."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from p2p_trainer.config.checks import check_fields, choices, require
from p2p_trainer.config.sections import (
    DataConfig,
    ExchangeConfig,
    InnerConfig,
    LogConfig,
    ModelConfig,
    NetworkConfig,
)
from p2p_trainer.config.security import SecurityConfig

Method = Literal["factored", "noloco", "diloco", "data-parallel", "independent"]
METHODS: tuple[str, ...] = choices(Method)
Offload = Literal["auto", "on", "off"]


# Reference hyperparameters per method (docs/algorithms.md §1–§3): each method names every field
# whose default depends on the method, so no method inherits another's values.
_COMMON: dict[str, Any] = {
    "num_inner_steps": 50,
    "outer_lr": 0.7,
    "outer_momentum": 0.5,
    "group_size": 2,
    "align_rounds": False,
}
METHOD_DEFAULTS: dict[str, dict[str, Any]] = {
    "diloco": {**_COMMON, "outer_momentum": 0.9},
    "noloco": dict(_COMMON),
    # β = 0.5 as NoLoCo: a pair's averaged pseudo-gradient is noisy, and DiLoCo's 0.9 amplifies the noise
    # along with the signal, so the lower momentum reaches a lower loss.
    # No barrier: round-keyed Mix1 pairs meet only if rounds start together, hence align_rounds.
    "factored": {**_COMMON, "align_rounds": True},
    "data-parallel": dict(_COMMON),
    "independent": dict(_COMMON),
}


class _MethodDefault:
    """Marks an `OuterConfig` field left unset: the constructor fills it from `METHOD_DEFAULTS`."""

    def __repr__(self) -> str:
        return "<method default>"


BY_METHOD: Any = _MethodDefault()


@dataclass(frozen=True)
class OuterConfig:
    """The outer method and its math knobs; unset knobs take the method's reference values.

    The constructor resolves them, so the instance holds plain values: `dataclasses.replace(cfg,
    method=...)` keeps the old method's values, and `replace(cfg, overlap=...)` DiLoCo's
    `align_rounds` as resolved for the old `overlap`; to let the defaults follow, rebuild from the
    source (`load_config(path, method=...)`) or set those fields too."""

    method: Method = "factored"
    """One of: factored, noloco, diloco, data-parallel, independent."""
    num_inner_steps: int = BY_METHOD
    """H: inner steps per outer round (50 for every method unless set)."""
    outer_lr: float = BY_METHOD
    """α (0.7 for every method unless set)."""
    outer_momentum: float = BY_METHOD
    """β (0.9 for DiLoCo, 0.5 for the others unless set)."""
    gamma: float | None = None
    """NoLoCo's γ (pull towards the group's anchors); None means γ = α."""
    group_size: int = BY_METHOD
    """g: NoLoCo's group and factored Mix1's group G1 (0 = all peers; 2 unless set)."""
    mix2_group_size: int = 2
    """g2: factored Mix2's group on pseudo-gradients (0 = all peers, i.e. an all-reduce)."""
    mix2_rounds: int = 1
    """k2: consecutive Mix2 gossip rounds per blocking phase (0 skips Mix2)."""
    mix2_every: int = 1
    """Run Mix2 every K outer rounds (the knob between utilisation and agreement)."""
    mix2_tensors: tuple[str, ...] = ()
    """Partial Mix2: only the parameters whose names match one of these shell patterns (e.g.
    "tok_emb.*", "blocks.0.*") mix their pseudo-gradients; the others keep their own Δ. Empty:
    every parameter. Factored Gossip DiLoCo reports the embeddings, LM head and first two layers
    (~43% of parameters) as enough: for the GPT "tok_emb.*", "pos_emb.*", "blocks.0.*",
    "blocks.1.*" (its head is tied to tok_emb), 53% of the default model."""
    reagree_every: int = 8
    """DiLoCo: every this many rounds, and in the round after an exchange that merged only in part
    or failed, also average the anchors φ over all peers in the background (overlapping the inner
    steps, like Mix1), so anchors that drifted apart (a member died mid-exchange, views differed)
    agree again. 0: only after such exchanges. A periodic one is skipped when the round before
    showed every member's φ and m equal (docs/algorithms.md §1). Other methods mix their anchors
    already."""
    fragments: int = 1
    """P (DiLoCo only; Streaming DiLoCo): the parameters are cut into P fragments of about equal
    size and each round averages one of them in turn, so each fragment is averaged every P rounds
    and a round moves 1/P of the model (peak bandwidth ÷ P). For a fragment sync interval of H
    inner steps, set num_inner_steps to H / P. 1: the whole model every round."""
    fragment_overlap: bool = True
    """With fragments > 1: a fragment's exchange runs behind the next round's inner steps and its
    outer step lands at that round's end, keeping the inner steps made meanwhile (§1)."""
    overlap: bool = False
    """DiLoCo with fragments = 1: the all-reduce of Δ runs behind the next round's inner steps and
    its outer step lands at that round's end, keeping the inner steps made meanwhile (§1: Streaming
    DiLoCo's overlap with the whole model as one fragment). A slow link's all-reduce then costs no
    blocked time. Landing a whole round late cost all of DiLoCo's per-token gain over training alone
    at H = 20, so the field is off; the default run (default.toml) turns it on with land_at_step = 3
    and round alignment, which on the WAN testbed beat blocking DiLoCo (bench/RESULTS.md).
    Other methods ignore it (so `--method` works on a file that sets it), and with fragments > 1
    fragment_overlap decides."""
    land_at_step: int = 0
    """With an overlapped outer step (overlap, or fragments with fragment_overlap): from this
    inner step of the next round on, the exchange's outer step is applied after the first step
    where its mean is in (Streaming DiLoCo's τ; §1), at the round's end at the latest. 0: at that
    round's end, a whole round late, as is any step at or past num_inner_steps (so a shorter
    round set on the command line needs no change here). A step that covers the exchange's time
    (on a slow link about its seconds over an inner step's) hides it and delays each outer step by
    that much only. Other methods ignore it."""
    token_weighted: bool = True
    """Weight group means by the tokens behind each contribution (docs/algorithms.md §5)."""
    align_rounds: bool = BY_METHOD
    """Factored gossip: a peer that starts a round behind the earliest peer of its round (DHT
    heartbeats) leaves out the inner steps it is late by (at most H − 1), so round starts line up and
    round-keyed Mix1 pairs meet; token weighting (§5) counts the shorter round less. Overlapped
    DiLoCo has no barrier either, and with it on its members start each background all-reduce
    together (§1). On unless set for factored and for DiLoCo with `overlap` (one fragment), off for
    the others. Off whenever target_tokens_per_round > 0: constant work fixes each round's tokens."""
    target_tokens_per_round: int = 0
    """T (§6, constant work per round): tokens the whole swarm processes per outer round. Each live
    peer takes an equal share and tops up with extra micro-batches (gradient accumulation) when peers
    vanish, so every update sees the same amount of data as in a failure-free run. 0 disables it:
    each peer then does num_inner_steps × inner.grad_accum micro-batches whatever the swarm's size.
    Set it to peers × num_inner_steps × grad_accum × batch_size × seq_len for the planned swarm."""
    offload: Offload = "auto"
    """Where φ, m and θ's copy for the outer step live when the model is on an accelerator: "on"
    keeps them in fp32 in host memory (θ staged through pinned memory, copied without blocking), so
    the GPU holds only the model and AdamW's state and a background exchange of φ never waits on
    it; "off" keeps them on the device; "auto" is "on" with a CUDA device. On the CPU all three
    are the same (train/host_state.py)."""

    def __post_init__(self) -> None:
        # the method first: it decides the defaults the other fields are checked with
        require(self.method in METHODS, f"outer.method={self.method!r}: choose one of {', '.join(METHODS)}")
        if self.method == "diloco" and self.align_rounds is BY_METHOD:
            # overlapped, DiLoCo has no barrier: members start each background all-reduce together
            # only if their rounds start together (§1)
            object.__setattr__(self, "align_rounds", self.overlaps_whole_model)
        for name, value in METHOD_DEFAULTS[self.method].items():
            if getattr(self, name) is BY_METHOD:
                object.__setattr__(self, name, value)
        check_fields(self, "outer")
        require(self.num_inner_steps >= 1, f"outer.num_inner_steps={self.num_inner_steps}: use at least 1")
        require(self.outer_lr > 0, f"outer.outer_lr={self.outer_lr}: use a positive value (0.7 is standard)")
        require(0 <= self.outer_momentum < 1, f"outer.outer_momentum={self.outer_momentum}: use [0, 1)")
        require(self.gamma is None or self.gamma >= 0, f"outer.gamma={self.gamma}: use >= 0 or leave unset")
        require(self.group_size >= 0 and self.group_size != 1, "outer.group_size: use 0 (all) or >= 2")
        require(
            self.mix2_group_size >= 0 and self.mix2_group_size != 1, "outer.mix2_group_size: use 0 or >= 2"
        )
        require(self.mix2_rounds >= 0, "outer.mix2_rounds must be >= 0 (0 skips Mix2)")
        require(self.mix2_every >= 1, "outer.mix2_every must be >= 1")
        require(self.fragments >= 1, f"outer.fragments={self.fragments}: use >= 1 (1: no fragments)")
        require(
            self.fragments == 1 or self.method == "diloco",
            f"outer.fragments={self.fragments} applies to method diloco only; set it to 1 for {self.method}",
        )
        require(
            all(isinstance(p, str) and p for p in self.mix2_tensors),
            f"outer.mix2_tensors={self.mix2_tensors!r}: use non-empty name patterns like 'blocks.0.*'",
        )
        require(
            self.reagree_every >= 0,
            f"outer.reagree_every={self.reagree_every}: use >= 0 (0: after faults only)",
        )
        require(
            self.land_at_step >= 0,
            f"outer.land_at_step={self.land_at_step}: use 0 (the round's end) or a number of inner steps",
        )
        require(
            self.target_tokens_per_round >= 0,
            f"outer.target_tokens_per_round={self.target_tokens_per_round}: use >= 0 (0 disables)",
        )

    @property
    def overlaps_outer_step(self) -> bool:
        """DiLoCo's Δ exchange runs behind the next round's inner steps (whole model or fragments)."""
        if self.method != "diloco":
            return False
        return self.fragment_overlap if self.fragments > 1 else self.overlap

    @property
    def effective_gamma(self) -> float:
        return self.outer_lr if self.gamma is None else self.gamma

    @property
    def overlaps_whole_model(self) -> bool:
        """DiLoCo's all-reduce of the whole model runs behind the inner steps (`overlap`, one
        fragment): the case where DiLoCo aligns its rounds by default."""
        return self.overlap is True and self.fragments == 1

    @classmethod
    def for_method(cls, method: str, **overrides: Any) -> OuterConfig:
        """The reference hyperparameters of `method`, with `overrides` on top (as the constructor)."""
        return cls(method=method, **overrides)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RunConfig:
    """One run: what to train, how each peer trains, how peers merge, exchange and find each other."""

    seed: int = 0
    """Run seed: initial weights, data order and groups derive from it (with peer id and round)."""
    rounds: int = 8
    """Outer rounds to train; the inner schedule spans rounds * num_inner_steps steps."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """[model]: the transformer's shape."""
    data: DataConfig = field(default_factory=DataConfig)
    """[data]: corpus and batches."""
    inner: InnerConfig = field(default_factory=InnerConfig)
    """[inner]: the local optimiser."""
    outer: OuterConfig = field(default_factory=OuterConfig)
    """[outer]: the method and its knobs."""
    exchange: ExchangeConfig = field(default_factory=ExchangeConfig)
    """[exchange]: quorum, grace window, time limits and wire format of exchanges."""
    network: NetworkConfig = field(default_factory=NetworkConfig)
    """[network]: heartbeat and state-download timing."""
    security: SecurityConfig = field(default_factory=SecurityConfig)
    """[security]: checks on records, messages and contributions from other peers (SECURITY.md)."""
    log: LogConfig = field(default_factory=LogConfig)
    """[log]: what a peer writes about itself (TensorBoard scalars); not in the run definition."""

    def __post_init__(self) -> None:
        check_fields(self, "")
        require(self.rounds >= 1, f"rounds={self.rounds}: use at least 1")
        micro = self.data.batch_size * self.model.seq_len
        target = self.outer.target_tokens_per_round
        require(
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
            **self.workload_definition(),
            "method": self.outer.method,
            "num_inner_steps": self.outer.num_inner_steps,
            "seed": self.seed,
        }
        if self.outer.target_tokens_per_round:  # only when set, so existing swarms keep their run id
            definition["target_tokens_per_round"] = self.outer.target_tokens_per_round
        if self.outer.fragments > 1:  # fragments of different cuts would not fit one another
            definition["fragments"] = self.outer.fragments
        if self.outer.overlaps_outer_step:  # a blocking and a background all-reduce would not meet
            definition["overlap"] = True
        if self.outer.mix2_tensors:  # peers mixing different subsets would send different sizes
            definition["mix2_tensors"] = list(self.outer.mix2_tensors)
        grid = self.exchange.codec_grid()
        if grid:  # the parts' bounds lie on the codecs' grid: every member must cut them alike
            definition["codecs"] = grid
        admission = self.security.admission_definition()
        if admission is not None:  # a closed swarm's peers must agree on who is let in
            definition["admission"] = admission
        return definition

    def workload_definition(self) -> dict[str, Any]:
        """The run definition's part about what is trained on what: the model's shape and the
        data's content (a run of one's own model, `p2p_trainer.api`, names its model instead)."""
        return {"model": self.model.definition(), **self.data.definition()}

    def run_id(self) -> str:
        blob = json.dumps(self.run_definition(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]
