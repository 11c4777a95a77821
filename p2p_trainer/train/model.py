"""A decoder-only transformer language model in plain torch, and `build_model` for either arch.

Pre-norm blocks, causal attention through `scaled_dot_product_attention`, learned positions,
tied input/output embeddings (unless `model.tie_embeddings = false`). Sized by `ModelConfig` from
~1M parameters (CPU tests) to 1B+ (e.g. d_model=2048, n_layers=20, n_heads=16). The Llama-style
decoder (`model.arch = "llama"`) is in llama.py. Imports nothing distributed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from p2p_trainer.config import ModelConfig
from p2p_trainer.train.llama import Llama
from p2p_trainer.train.weight_init import init_transformer_weights


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        # (B, T, C) -> (B, heads, T, head_dim)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        drop = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=drop)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:  # fewer parameters to train and to exchange
            self.head.weight = self.tok_emb.weight
        init_transformer_weights(self, cfg.n_layers, residual_projections=("proj.weight",))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for `idx` (B, T); with `targets`, the mean cross-entropy in nats per token."""
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds model.seq_len={self.cfg.seq_len}")
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


LanguageModel = GPT | Llama
"""What `build_model` returns: both take `(idx, targets=None)` and have `num_params()`."""


def build_model(cfg: ModelConfig, seed: int) -> LanguageModel:
    """The model `cfg.arch` names. Initial weights derive from the run seed only, so a new swarm
    starts from identical weights."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return Llama(cfg) if cfg.arch == "llama" else GPT(cfg)
    finally:
        torch.random.set_rng_state(gen_state)
