"""Codecs: how the values of one exchange are written on the wire and read back (docs/algorithms.md §7).

A codec turns a flat float32 vector into bytes plus a small header, and a receiver turns them back
into float32 values after checking every field. The same functions serve both backends: the
network butterfly encodes each part it sends, the in-process backend rounds each contribution the
same way, so the two stay comparable.

- `float32`, `float16`, `bfloat16`: dense. float16 falls back to float32 for a vector with a value
  beyond its range (the header says which was sent).
- `int8`, `int4`: blockwise, one float32 scale per `block` values (the block's largest magnitude
  over 127 or 7), values rounded to the nearest level. Nearest, not stochastic, rounding: the
  error it leaves is deterministic, so error feedback (`algo/feedback.py`) carries it into the
  peer's next contribution exactly, and a receiver can recompute what was sent; stochastic
  rounding would trade that bias, which feedback already removes, for variance it does not.
- `topk`: in each chunk of `block` values, the k of largest magnitude, each as its index in the
  chunk (uint16) and an int8 level of the chunk's scale. A part owner's mean of k-sparse
  contributions has at most (members · k) entries per chunk, so its `topk` result keeps that many
  and loses only their rounding.

Blocks and chunks lie on one grid over the whole vector, and the butterfly cuts its parts on that
grid (`align`): a vector's parts, each encoded alone, decode to exactly what the whole vector
would, which is what lets a sender know what it sent (`roundtrip`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from p2p_trainer.config import ExchangeConfig

CodecName = Literal["float32", "float16", "bfloat16", "int8", "int4", "topk"]
CODECS: tuple[str, ...] = ("float32", "float16", "bfloat16", "int8", "int4", "topk")
LOSSY: frozenset[str] = frozenset({"int8", "int4", "topk"})
"""Codecs whose rounding is too coarse for parameters: pseudo-gradients only, with error feedback."""
TAGS = {"float32": "f4", "float16": "f2", "bfloat16": "bf", "int8": "i8", "int4": "i4", "topk": "tk"}
_NAMES = {tag: name for name, tag in TAGS.items()}
MAX_BLOCK = 65536
"""Largest block or chunk: a top-k index is a uint16."""
FLOAT16_MAX = float(np.finfo(np.float16).max)
_LEVELS = {"int8": 127, "int4": 7, "topk": 127}


@dataclass(frozen=True)
class Codec:
    """One exchange's number format and its parameters (from `ExchangeConfig`)."""

    name: str = "float32"
    block: int = 128
    """Values per scale (int8, int4) or per top-k chunk (topk)."""
    topk_fraction: float = 1 / 64
    """Share of each chunk a `topk` contribution keeps."""

    def __post_init__(self) -> None:
        if self.name not in CODECS:
            raise ValueError(f"unknown codec {self.name!r}: choose one of {', '.join(CODECS)}")
        if not 1 <= self.block <= MAX_BLOCK:
            raise ValueError(f"codec block {self.block}: use 1..{MAX_BLOCK}")
        if not 0 < self.topk_fraction <= 1:
            raise ValueError(f"top-k fraction {self.topk_fraction}: use a value in (0, 1]")

    @property
    def lossy(self) -> bool:
        return self.name in LOSSY

    @property
    def align(self) -> int:
        """The grid a part's bounds must lie on for its encoding to match the whole vector's."""
        return self.block if self.lossy else 1

    @property
    def k(self) -> int:
        """Entries a `topk` contribution keeps per full chunk."""
        return max(1, round(self.topk_fraction * self.block))

    def encode(self, values: np.ndarray, k: int | None = None) -> tuple[bytes, dict[str, Any], np.ndarray]:
        """The payload, its header fields and the values exactly as a receiver decodes them.

        `k` overrides the entries per chunk of `topk` (a part owner's result keeps the union).
        """
        v = np.ascontiguousarray(values, dtype=np.float32)
        if self.name == "float32":
            return v.tobytes(), {"dt": "f4"}, v
        if self.name == "float16":
            if v.size and float(np.abs(v).max()) > FLOAT16_MAX:
                return v.tobytes(), {"dt": "f4"}, v
            half = v.astype(np.float16)
            return half.tobytes(), {"dt": "f2"}, half.astype(np.float32)
        if self.name == "bfloat16":
            bits = _to_bfloat16(v)
            return bits.tobytes(), {"dt": "bf"}, _from_bfloat16(bits)
        if self.name == "topk":
            kk = min(self.block, self.k if k is None else k)
            payload, decoded = _topk_encode(v, self.block, kk)
            return payload, {"dt": "tk", "b": self.block, "k": kk}, decoded
        payload, decoded = _blockwise_encode(v, self.block, _LEVELS[self.name], self.name == "int4")
        return payload, {"dt": TAGS[self.name], "b": self.block}, decoded

    def roundtrip(self, values: np.ndarray, k: int | None = None) -> np.ndarray:
        """What a receiver would read for `values` (exact for the whole vector or any aligned part)."""
        return self.encode(values, k)[2]

    def result_k(self, members: int) -> int:
        """Entries per chunk of a `topk` result merging `members` k-sparse contributions."""
        return min(self.block, members * self.k)

    def payload_bytes(self, n: int, k: int | None = None) -> int:
        """Bytes of `n` values in this codec (float16's fallback aside)."""
        return payload_size(TAGS[self.name], n, self.block, min(self.block, self.k if k is None else k))


FLOAT32 = Codec()
"""Exact: the default of every exchange."""


def from_config(cfg: ExchangeConfig, update: bool) -> tuple[Codec, Codec]:
    """The codecs of an exchange's contributions and of its results: an update's (Δ, gradients)
    from `update_codec`/`result_codec`, a model's from `wire_dtype` (never lossy)."""
    if not update:
        return Codec(cfg.wire_dtype), Codec(cfg.wire_dtype)

    def codec(name: str) -> Codec:
        block = cfg.topk_chunk if name == "topk" else cfg.codec_block
        return Codec(name, block, cfg.topk_fraction)

    contributions = codec(cfg.update_codec or cfg.wire_dtype)
    return contributions, codec(cfg.result_codec or contributions.name)


def alignment(*codecs: Codec) -> int:
    """The grid that parts must lie on for every one of `codecs`."""
    return math.lcm(*(c.align for c in codecs))


def payload_size(tag: str, n: int, block: int, k: int) -> int:
    if tag == "f4":
        return 4 * n
    if tag in ("f2", "bf"):
        return 2 * n
    chunks = math.ceil(n / block)
    if tag == "i8":
        return 4 * chunks + n
    if tag == "i4":
        return 4 * chunks + (n + 1) // 2
    full, tail = divmod(n, block)
    return 4 * chunks + 3 * (full * min(k, block) + min(k, tail))


def decode(header: dict[str, Any], payload: bytes | memoryview, n: int) -> np.ndarray | str:
    """The `n` float32 values a message carries, or why it is invalid: format, sizes, scales,
    indices and levels are all checked, and the values must be finite."""
    tag = header.get("dt", "f4")
    name = _NAMES.get(tag) if isinstance(tag, str) else None
    if name is None:
        return f"unknown number format {tag!r} (expected one of {', '.join(_NAMES)})"
    block, k = header.get("b", 1), header.get("k", 1)
    if not (isinstance(block, int) and 1 <= block <= MAX_BLOCK and isinstance(k, int) and 1 <= k <= block):
        return f"block {block!r} / k {k!r} out of bounds (1 <= k <= block <= {MAX_BLOCK})"
    expected = payload_size(str(tag), n, block, k)
    if len(payload) != expected:
        return f"{len(payload)} bytes, expected {expected} ({name} of {n} values)"
    if name == "float32":
        values = np.frombuffer(payload, dtype=np.float32)
    elif name == "float16":
        values = np.frombuffer(payload, dtype=np.float16).astype(np.float32)
    elif name == "bfloat16":
        values = _from_bfloat16(np.frombuffer(payload, dtype=np.uint16))
    elif name == "topk":
        got = _topk_decode(payload, n, block, k)
        if isinstance(got, str):
            return got
        values = got
    else:
        got = _blockwise_decode(payload, n, block, _LEVELS[name], name == "int4")
        if isinstance(got, str):
            return got
        values = got
    if not np.isfinite(values).all():
        return "non-finite values"
    return values


def _to_bfloat16(v: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), as the upper 16 bits."""
    bits = v.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def _from_bfloat16(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _scales(absmax: np.ndarray, levels: int) -> np.ndarray:
    return (absmax / np.float32(levels)).astype(np.float32)


def _blocks(v: np.ndarray, block: int) -> tuple[np.ndarray, int]:
    """`v` zero-padded to whole blocks, as rows, and the padding."""
    pad = (-v.size) % block
    return np.concatenate([v, np.zeros(pad, np.float32)]).reshape(-1, block), pad


def _blockwise_encode(v: np.ndarray, block: int, levels: int, nibbles: bool) -> tuple[bytes, np.ndarray]:
    rows, _ = _blocks(v, block)
    scale = _scales(np.abs(rows).max(axis=1), levels) if rows.size else np.zeros(0, np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))[:, None]
    q = np.clip(np.rint(rows / safe), -levels, levels).astype(np.int8)
    decoded = (q.astype(np.float32) * scale[:, None]).reshape(-1)[: v.size]
    flat = q.reshape(-1)[: v.size]
    if nibbles:  # two levels per byte, offset so that 0 never occurs (a receiver rejects it)
        u = (flat.astype(np.int16) + 8).astype(np.uint8)
        if u.size % 2:
            u = np.concatenate([u, np.array([8], np.uint8)])
        body = (u[0::2] | (u[1::2] << 4)).astype(np.uint8).tobytes()
    else:
        body = flat.tobytes()
    return scale.tobytes() + body, decoded


def _blockwise_decode(
    payload: bytes | memoryview, n: int, block: int, levels: int, nibbles: bool
) -> np.ndarray | str:
    chunks = math.ceil(n / block)
    scale = np.frombuffer(payload, dtype=np.float32, count=chunks)
    if not (np.isfinite(scale).all() and (scale >= 0).all()):
        return "a block scale is negative or not finite"
    body = np.frombuffer(payload, dtype=np.uint8, offset=4 * chunks)
    if nibbles:
        u = np.empty(2 * body.size, np.int16)
        u[0::2], u[1::2] = body & 0x0F, body >> 4
        if (u[:n] == 0).any():
            return "an int4 level outside -7..7"
        q = u[:n] - 8
    else:
        q = body.view(np.int8).astype(np.int16)
        if (q < -levels).any():
            return f"an int8 level outside -{levels}..{levels}"
    per_value = np.repeat(scale, block)[:n]
    return (q.astype(np.float32) * per_value).astype(np.float32)


def _topk_encode(v: np.ndarray, block: int, k: int) -> tuple[bytes, np.ndarray]:
    full, tail = divmod(v.size, block)
    scales, indices, levels = [], [], []
    decoded = np.zeros_like(v)
    for start, rows, width in ((0, full, block), (full * block, 1 if tail else 0, tail)):
        if rows == 0:
            continue
        kk = min(k, width)
        chunk = v[start : start + rows * width].reshape(rows, width)
        idx = np.sort(np.argpartition(-np.abs(chunk), kk - 1, axis=1)[:, :kk], axis=1)
        picked = np.take_along_axis(chunk, idx, axis=1)
        scale = _scales(np.abs(picked).max(axis=1), 127)
        safe = np.where(scale > 0, scale, np.float32(1))[:, None]
        q = np.clip(np.rint(picked / safe), -127, 127).astype(np.int8)
        rows_at = start + np.arange(rows)[:, None] * width
        decoded[(rows_at + idx).reshape(-1)] = (q.astype(np.float32) * scale[:, None]).reshape(-1)
        scales.append(scale)
        indices.append(idx.astype(np.uint16).reshape(-1))
        levels.append(q.reshape(-1))
    cat = np.concatenate
    parts = [cat(scales) if scales else np.zeros(0, np.float32)]
    parts += [
        cat(indices) if indices else np.zeros(0, np.uint16),
        cat(levels) if levels else np.zeros(0, np.int8),
    ]
    return b"".join(p.tobytes() for p in parts), decoded


def _topk_decode(payload: bytes | memoryview, n: int, block: int, k: int) -> np.ndarray | str:
    full, tail = divmod(n, block)
    chunks, kept = full + (1 if tail else 0), full * k + min(k, tail)
    scale = np.frombuffer(payload, dtype=np.float32, count=chunks)
    if not (np.isfinite(scale).all() and (scale >= 0).all()):
        return "a chunk scale is negative or not finite"
    idx = np.frombuffer(payload, dtype=np.uint16, count=kept, offset=4 * chunks).astype(np.int64)
    q = np.frombuffer(payload, dtype=np.int8, count=kept, offset=4 * chunks + 2 * kept)
    if (q < -127).any():
        return "a top-k level outside -127..127"
    out = np.zeros(n, np.float32)
    at = 0
    for start, rows, width in ((0, full, block), (full * block, 1 if tail else 0, tail)):
        if rows == 0:
            continue
        kk = min(k, width)
        i = idx[at : at + rows * kk].reshape(rows, kk)
        if (i >= width).any() or (kk > 1 and (np.diff(i, axis=1) <= 0).any()):
            return "top-k indices out of their chunk or not strictly increasing"
        s = scale[start // block : start // block + rows][:, None]
        values = q[at : at + rows * kk].reshape(rows, kk).astype(np.float32) * s
        out[(start + np.arange(rows)[:, None] * width + i).reshape(-1)] = values.reshape(-1)
        at += rows * kk
    return out
