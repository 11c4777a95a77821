"""A Llama-style decoder in plain torch: RMSNorm, rotary positions, SwiGLU, grouped-query attention.

Chosen by `model.arch = "llama"` and sized by the same `ModelConfig` as the GPT (model.py), plus
`n_kv_heads`, `rope_theta` and `ffn_hidden`. Pre-norm blocks, no biases, causal attention through
`scaled_dot_product_attention`. Module names follow Hugging Face's `LlamaForCausalLM` (`q_proj`,
`gate_proj`, `input_layernorm`, ...), so a state dict maps onto it by name. Imports nothing
distributed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from p2p_trainer.config import ModelConfig
from p2p_trainer.train.weight_init import init_transformer_weights

NORM_EPS = 1e-6


def rope_tables(head_dim: int, seq_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (seq_len, head_dim): position t, frequency pair i turns by
    t · theta^(-2i / head_dim); both halves of the head repeat the frequencies (`rotate_half`)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x` (B, heads, T, head_dim) by position; `cos`/`sin` are (T, head_dim)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.kv_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * self.head_dim, cfg.d_model, bias=False)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        drop = self.dropout if self.training else 0.0
        # enable_gqa shares each key/value head among n_heads / n_kv_heads query heads without
        # materialising the repeated keys and values
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=drop, enable_gqa=self.n_kv_heads != self.n_heads
        )
        return self.o_proj(y.transpose(1, 2).reshape(b, t, self.n_heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden = cfg.swiglu_hidden
        self.gate_proj = nn.Linear(cfg.d_model, hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.d_model, eps=NORM_EPS)
        self.self_attn = LlamaAttention(cfg)
        self.post_attention_layernorm = nn.RMSNorm(cfg.d_model, eps=NORM_EPS)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    """The same interface as `GPT`: `forward(idx, targets=None)` and `num_params()`."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.d_model, eps=NORM_EPS)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # not parameters: nothing to train, exchange or checkpoint; rebuilt from the config
        cos, sin = rope_tables(cfg.d_model // cfg.n_heads, cfg.seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        init_transformer_weights(
            self, cfg.n_layers, residual_projections=("o_proj.weight", "down_proj.weight")
        )

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for `idx` (B, T); with `targets`, the mean cross-entropy in nats per token."""
        t = idx.shape[1]
        if t > self.cfg.seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds model.seq_len={self.cfg.seq_len}")
        cos, sin = self.rope_cos[:t], self.rope_sin[:t]
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
