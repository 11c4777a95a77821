"""The codecs of exchange/codecs.py: what they keep, what they cost, what a receiver refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from p2p_trainer.exchange.codecs import CODECS, Codec, alignment, decode
from p2p_trainer.exchange.feedback import ErrorFeedback, as_sent, flatten
from p2p_trainer.net.allreduce import part_bounds

RNG = np.random.default_rng(7)


def _vector(n: int) -> np.ndarray:
    # heavy tails, like pseudo-gradients: most entries small, a few large
    return (RNG.standard_t(3, n) * 1e-3).astype(np.float32)


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("n", [0, 1, 127, 128, 129, 5000])
def test_a_receiver_decodes_exactly_what_the_sender_says_it_sent(name: str, n: int) -> None:
    codec = Codec(name, block=128)
    v = _vector(n)
    payload, header, decoded = codec.encode(v)
    back = decode(header, payload, n)
    assert isinstance(back, np.ndarray) and back.dtype == np.float32
    np.testing.assert_array_equal(back, decoded)
    assert len(payload) == codec.payload_bytes(n) or (name == "float16" and header["dt"] == "f4")


def test_bfloat16_rounds_as_torch_does() -> None:
    v = _vector(10_000)
    expected = torch.from_numpy(v).to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(Codec("bfloat16").roundtrip(v), expected)


@pytest.mark.parametrize(("name", "levels"), [("int8", 127), ("int4", 7)])
def test_blockwise_levels_are_within_half_a_step_of_the_value(name: str, levels: int) -> None:
    v = _vector(64 * 50)
    decoded = Codec(name, block=64).roundtrip(v)
    step = np.abs(v.reshape(-1, 64)).max(axis=1, keepdims=True) / levels
    err = np.abs(decoded - v).reshape(-1, 64)
    assert (err <= step / 2 * (1 + 1e-5)).all()
    assert len(np.unique(decoded.reshape(-1, 64)[0])) <= 2 * levels + 1


def test_topk_keeps_the_largest_entries_of_every_chunk() -> None:
    v = _vector(4096 * 3 + 100)
    codec = Codec("topk", block=4096, topk_fraction=1 / 64)
    decoded = codec.roundtrip(v)
    for start, width, k in ((0, 4096, 64), (4096, 4096, 64), (8192, 4096, 64), (12288, 100, 64)):
        chunk, got = v[start : start + width], decoded[start : start + width]
        largest = set(np.argsort(-np.abs(chunk))[:k].tolist())
        assert set(np.flatnonzero(got).tolist()) <= largest and np.count_nonzero(got) >= k - 1
        kept = np.flatnonzero(got)
        assert np.allclose(got[kept], chunk[kept], rtol=0, atol=np.abs(chunk).max() / 254 * 1.0001)


def test_compressed_sizes_against_float32() -> None:
    n = 4096 * 200
    assert Codec("int8", 128).payload_bytes(n) == n + 4 * n // 128
    assert Codec("int4", 128).payload_bytes(n) == n // 2 + 4 * n // 128
    topk = Codec("topk", 4096, 1 / 64)
    assert topk.payload_bytes(n) == 200 * (4 + 3 * 64)
    assert 4 * n / topk.payload_bytes(n) > 80
    # a result merging 2 sparse contributions keeps twice the entries
    assert topk.payload_bytes(n, topk.result_k(2)) == 200 * (4 + 3 * 128)


@pytest.mark.parametrize("name", ["int8", "int4", "topk", "bfloat16"])
def test_parts_on_the_grid_decode_to_the_whole_vectors_rounding(name: str) -> None:
    codec = Codec(name, block=256)
    v = _vector(256 * 11 + 17)
    whole = codec.roundtrip(v)
    for n in (2, 3, 4, 7):
        bounds = part_bounds(v.size, n, alignment(codec))
        assert bounds[0][0] == 0 and bounds[-1][1] == v.size
        assert all(a % codec.align == 0 for a, _ in bounds)
        parts = [codec.roundtrip(v[a:b]) for a, b in bounds]
        np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_alignment_of_two_grids_is_both() -> None:
    assert alignment(Codec("topk", 4096), Codec("int8", 128)) == 4096
    assert alignment(Codec("float16"), Codec("float32")) == 1
    assert part_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert part_bounds(1000, 3, 256) == [(0, 512), (512, 768), (768, 1000)]


def _encoded(name: str, n: int = 300) -> tuple[dict[str, object], bytearray]:
    payload, header, _ = Codec(name, block=128).encode(_vector(n))
    return dict(header), bytearray(payload)


def test_a_receiver_refuses_malformed_payloads_with_a_reason() -> None:
    header, payload = _encoded("int8")
    assert "bytes, expected" in str(decode(header, bytes(payload[:-1]), 300))
    assert "unknown number format" in str(decode({**header, "dt": "q3"}, bytes(payload), 300))
    assert "out of bounds" in str(decode({**header, "b": 0}, bytes(payload), 300))
    bad_scale = bytearray(payload)
    bad_scale[0:4] = np.float32(-1.0).tobytes()
    assert "scale" in str(decode(header, bytes(bad_scale), 300))
    nan_scale = bytearray(payload)
    nan_scale[0:4] = np.float32(np.nan).tobytes()
    assert "scale" in str(decode(header, bytes(nan_scale), 300))
    low = bytearray(payload)
    low[4 * 3] = 0x80  # int8 -128: never produced
    assert "level" in str(decode(header, bytes(low), 300))

    header, payload = _encoded("int4")
    zero = bytearray(payload)
    zero[4 * 3] = 0x00  # nibble 0 is level -8: never produced
    assert "int4 level" in str(decode(header, bytes(zero), 300))

    header, payload = _encoded("topk")
    assert "out of bounds" in str(decode({**header, "k": 129}, bytes(payload), 300))
    idx_at = 4 * 3
    swapped = bytearray(payload)
    swapped[idx_at : idx_at + 4] = swapped[idx_at + 2 : idx_at + 4] + swapped[idx_at : idx_at + 2]
    assert "strictly increasing" in str(decode(header, bytes(swapped), 300))
    far = bytearray(payload)
    far[idx_at : idx_at + 2] = np.uint16(60000).tobytes()
    assert "indices" in str(decode(header, bytes(far), 300))


def test_float16_falls_back_to_float32_beyond_its_range() -> None:
    v = np.array([1.0, 1e6], np.float32)
    payload, header, decoded = Codec("float16").encode(v)
    assert header["dt"] == "f4" and len(payload) == 8
    np.testing.assert_array_equal(decoded, v)


def test_error_feedback_delivers_everything_in_the_end() -> None:
    """Σ_t Q(c_t + e_t) + e_T = Σ_t c_t: what rounding dropped is only delayed."""
    codec = Codec("topk", block=512, topk_fraction=1 / 32)
    feedback = ErrorFeedback()
    like = [torch.zeros(40, 30), torch.zeros(300)]
    total = np.zeros(1500, np.float64)
    delivered = np.zeros(1500, np.float64)
    for _ in range(25):
        c = [torch.from_numpy(_vector(t.numel()).reshape(t.shape)) for t in like]
        total += flatten(c)
        sent = feedback.contribution(("mix2", 0), c)
        feedback.delivered(("mix2", 0), sent, codec)
        delivered += flatten(as_sent(sent, codec))
    residual = total - delivered
    assert feedback.norm(("mix2", 0)) == pytest.approx(float(np.linalg.norm(residual)), rel=1e-4)
    # without feedback the loss would be most of the total; with it, one round's residual at most
    assert np.linalg.norm(residual) < 0.6 * np.linalg.norm(total)
    assert feedback.norm(("outer", 0)) == 0.0


def test_as_sent_keeps_shapes_and_dtypes() -> None:
    tensors = [torch.randn(3, 5), torch.randn(7, dtype=torch.float64)]
    out = as_sent(tensors, Codec("int8", block=4))
    assert [t.shape for t in out] == [t.shape for t in tensors]
    assert [t.dtype for t in out] == [t.dtype for t in tensors]
    assert not torch.equal(out[0], tensors[0]) and torch.allclose(out[0], tensors[0], atol=0.05)


def test_the_config_names_what_to_change() -> None:
    from p2p_trainer.config import ConfigError, ExchangeConfig
    from p2p_trainer.exchange.codecs import from_config

    with pytest.raises(ConfigError, match=r"result_codec='topk' needs update_codec='topk'"):
        ExchangeConfig(result_codec="topk")
    with pytest.raises(ConfigError, match=r"exchange\.update_codec='int3': choose one of"):
        ExchangeConfig(update_codec="int3")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"exchange\.topk_chunk=70000: use 1\.\.65536"):
        ExchangeConfig(topk_chunk=70000)
    with pytest.raises(ConfigError, match=r"exchange\.topk_fraction=0\.0: use a value in \(0, 1\]"):
        ExchangeConfig(topk_fraction=0)
    update, results = from_config(ExchangeConfig(update_codec="topk", result_codec="int8"), update=True)
    assert (update.name, update.block, results.name, results.block) == ("topk", 4096, "int8", 128)
    model, _ = from_config(ExchangeConfig(update_codec="topk", wire_dtype="float16"), update=False)
    assert model.name == "float16"
