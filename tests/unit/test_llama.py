"""The Llama-style decoder: shapes, causality, rotary positions, grouped-query attention, training,
its config checks, and that the run definition tells it from a GPT."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import tomllib
import torch
import torch.nn.functional as F

from p2p_trainer.config import (
    ConfigError,
    DataConfig,
    InnerConfig,
    ModelConfig,
    OuterConfig,
    RunConfig,
    config_from_dict,
    to_toml,
)
from p2p_trainer.exchange.inprocess import InProcessSwarm
from p2p_trainer.net.records import RunDefinition, diff_run_definitions
from p2p_trainer.train.checkpoint import load_checkpoint, save_checkpoint
from p2p_trainer.train.data import load_corpus
from p2p_trainer.train.llama import Llama, LlamaAttention, apply_rope, rope_tables
from p2p_trainer.train.model import GPT, build_model
from p2p_trainer.train.trainer import Peer

TINY = ModelConfig(arch="llama", vocab_size=64, d_model=32, n_layers=2, n_heads=4, seq_len=16)


def expected_params(cfg: ModelConfig) -> int:
    """Embedding (+ untied head), per layer q/o (d²), k/v (d · kv · head_dim), SwiGLU (3 · d · f),
    two RMSNorms, and the final RMSNorm."""
    d, head_dim = cfg.d_model, cfg.d_model // cfg.n_heads
    per_layer = 2 * d * d + 2 * d * cfg.kv_heads * head_dim + 3 * d * cfg.swiglu_hidden + 2 * d
    embeddings = cfg.vocab_size * d * (1 if cfg.tie_embeddings else 2)
    return embeddings + cfg.n_layers * per_layer + d


def test_build_model_picks_the_arch_and_is_seeded() -> None:
    assert isinstance(build_model(TINY, 0), Llama)
    assert isinstance(build_model(dataclasses.replace(TINY, arch="gpt"), 0), GPT)
    a, b, c = build_model(TINY, 3), build_model(TINY, 3), build_model(TINY, 4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))


def test_forward_shapes_and_loss() -> None:
    model = build_model(TINY, 0)
    x = torch.randint(0, TINY.vocab_size, (3, TINY.seq_len))
    assert model(x).shape == (3, TINY.seq_len, TINY.vocab_size)
    assert model(x[:, :5]).shape == (3, 5, TINY.vocab_size)  # shorter than seq_len: rotary tables sliced
    y = torch.randint(0, TINY.vocab_size, (3, TINY.seq_len))
    loss = model(x, y).detach()
    assert loss.ndim == 0 and abs(float(loss) - math.log(TINY.vocab_size)) < 0.5  # about uniform at init
    with pytest.raises(ValueError, match=r"exceeds model\.seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("kv", [0, 2, 1])
def test_changing_a_future_token_leaves_earlier_logits(kv: int) -> None:
    model = build_model(dataclasses.replace(TINY, n_kv_heads=kv), 0).eval()
    x = torch.randint(0, TINY.vocab_size, (2, TINY.seq_len))
    y = x.clone()
    y[:, 9] = (y[:, 9] + 1) % TINY.vocab_size
    before, after = model(x), model(y)
    torch.testing.assert_close(before[:, :9], after[:, :9])
    assert not torch.allclose(before[:, 9:], after[:, 9:])  # the change is seen from position 9 on


def test_rotary_scores_depend_only_on_the_offset() -> None:
    cos, sin = rope_tables(head_dim=8, seq_len=32, theta=10000.0)
    q, k = torch.randn(8), torch.randn(8)

    def score(m: int, n: int) -> float:
        qm = apply_rope(q.view(1, 1, 1, 8), cos[m : m + 1], sin[m : m + 1])
        kn = apply_rope(k.view(1, 1, 1, 8), cos[n : n + 1], sin[n : n + 1])
        return float((qm * kn).sum())

    assert score(3, 1) == pytest.approx(score(20, 18), rel=1e-5)
    assert score(3, 1) != pytest.approx(score(3, 2), rel=1e-3)
    rotated = apply_rope(q.view(1, 1, 1, 8), cos[7:8], sin[7:8])
    assert float(rotated.norm()) == pytest.approx(float(q.norm()), rel=1e-5)  # a rotation


def test_grouped_query_attention_matches_explicit_repeated_heads() -> None:
    cfg = dataclasses.replace(TINY, n_kv_heads=2)
    torch.manual_seed(0)
    attn = LlamaAttention(cfg).eval()
    x = torch.randn(2, 10, cfg.d_model)
    cos, sin = rope_tables(cfg.d_model // cfg.n_heads, 10, cfg.rope_theta)
    b, t, h, kv, hd = 2, 10, cfg.n_heads, 2, cfg.d_model // cfg.n_heads
    q = apply_rope(attn.q_proj(x).view(b, t, h, hd).transpose(1, 2), cos, sin)
    k = apply_rope(attn.k_proj(x).view(b, t, kv, hd).transpose(1, 2), cos, sin)
    v = attn.v_proj(x).view(b, t, kv, hd).transpose(1, 2)
    # query head i reads key/value head i // (h / kv)
    k, v = k.repeat_interleave(h // kv, dim=1), v.repeat_interleave(h // kv, dim=1)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, t, h * hd)
    torch.testing.assert_close(attn(x, cos, sin), attn.o_proj(y), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("kv", "tied"), [(0, True), (2, True), (1, False)])
def test_parameter_count_follows_the_formula(kv: int, tied: bool) -> None:
    cfg = dataclasses.replace(TINY, n_kv_heads=kv, tie_embeddings=tied)
    model = build_model(cfg, 0)
    assert isinstance(model, Llama) and model.num_params() == expected_params(cfg)
    attn = next(m for m in model.modules() if isinstance(m, LlamaAttention))
    assert attn.k_proj.weight.shape == (cfg.kv_heads * 8, cfg.d_model)
    assert (model.lm_head.weight is model.embed_tokens.weight) == tied


def test_swiglu_hidden_rule() -> None:
    assert ModelConfig(arch="llama", d_model=128).swiglu_hidden == 384  # 2/3 · 4 · 128 = 341.3 -> 384
    assert ModelConfig(arch="llama", d_model=768, n_heads=12).swiglu_hidden == 2048
    assert ModelConfig(arch="llama", ffn_hidden=100).swiglu_hidden == 100


def test_gpt_can_untie_its_embeddings() -> None:
    tied = ModelConfig(d_model=32, n_layers=1, n_heads=2, seq_len=8)
    untied = dataclasses.replace(tied, tie_embeddings=False)
    extra = build_model(untied, 0).num_params() - build_model(tied, 0).num_params()
    assert extra == tied.vocab_size * tied.d_model


@pytest.mark.parametrize("kv", [0, 2])
def test_a_few_adamw_steps_reduce_the_loss(kv: int) -> None:
    model = build_model(dataclasses.replace(TINY, n_kv_heads=kv), 0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, TINY.vocab_size, (8, TINY.seq_len + 1), generator=gen)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = model(x[:, :-1], x[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0] - 1.0, losses


def test_llama_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match=r"model\.n_kv_heads=3 must divide model\.n_heads=4.*1, 2, 4"):
        ModelConfig(arch="llama", n_kv_heads=3)
    with pytest.raises(ConfigError, match=r"model\.d_model / model\.n_heads = 5 must be even"):
        ModelConfig(arch="llama", d_model=20, n_heads=4)
    with pytest.raises(ConfigError, match=r'model\.n_kv_heads=2 applies to arch = "llama" only'):
        ModelConfig(n_kv_heads=2)
    with pytest.raises(ConfigError, match=r"model\.rope_theta=0\.0: use a positive base"):
        ModelConfig(arch="llama", rope_theta=0)
    with pytest.raises(ConfigError, match=r"model\.arch='bert': choose one of gpt, llama"):
        config_from_dict({"model": {"arch": "bert"}})


def test_the_new_fields_round_trip_through_toml() -> None:
    cfg = RunConfig(
        model=ModelConfig(arch="llama", n_kv_heads=2, rope_theta=5e5, ffn_hidden=320, tie_embeddings=False),
        data=DataConfig(corpus="c.bin", format="tokens", token_dtype="uint32", text_field="body"),
    )
    text = to_toml(cfg)
    assert 'arch = "llama"' in text and 'format = "tokens"' in text and "tie_embeddings = false" in text
    assert config_from_dict(tomllib.loads(text)) == cfg


def test_toml_fields_load_and_the_run_definition_tells_the_archs_apart() -> None:
    llama = config_from_dict({"model": {"arch": "llama", "n_kv_heads": 2, "rope_theta": 500000}})
    assert llama.model.kv_heads == 2 and llama.model.rope_theta == 500000.0
    gpt = RunConfig()
    assert set(gpt.run_definition()["model"]) == {  # the GPT's definition as before the Llama existed
        "vocab_size",
        "d_model",
        "n_layers",
        "n_heads",
        "seq_len",
        "mlp_ratio",
        "dropout",
    }
    assert llama.run_id() != gpt.run_id()
    diff = diff_run_definitions(RunDefinition(llama.run_definition()), RunDefinition(gpt.run_definition()))
    assert ("model.arch", "llama", "<absent>") in diff
    untied = dataclasses.replace(gpt, model=dataclasses.replace(gpt.model, tie_embeddings=False))
    assert untied.run_id() != gpt.run_id()


def test_the_trainer_runs_and_resumes_a_llama_exactly(tmp_path: Path) -> None:
    cfg = RunConfig(
        rounds=2,
        model=ModelConfig(arch="llama", d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, seq_len=32),
        data=DataConfig(batch_size=4, val_batches=2),
        inner=InnerConfig(eval_every=0, warmup_steps=1),
        outer=OuterConfig.for_method("diloco", num_inner_steps=3),
    )
    corpus = load_corpus(cfg.data, cfg.model.seq_len)

    def peer() -> Peer:
        return Peer(cfg, InProcessSwarm(1, cfg.seed).exchange(0), corpus, "peer0")

    a = peer()
    first = a.run_round()
    assert first.tokens == 3 * 4 * 32 and math.isfinite(first.train_loss)
    saved = save_checkpoint(a, tmp_path / "ckpt.safetensors")
    b = peer()
    assert load_checkpoint(b, tmp_path / "ckpt.safetensors") == saved
    assert a.run_round().train_loss == b.run_round().train_loss
    assert math.isfinite(a.evaluate())
