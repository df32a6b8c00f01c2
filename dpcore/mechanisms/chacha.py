"""The ChaCha20 keystream (RFC 8439's block function) in torch integer operations, on any device.

``SecureRandom`` draws its bytes from OpenSSL's ChaCha20 on the CPU. A release computed on a GPU
would wait on the CPU for them and then copy them over; this module computes the same keystream
on the tensor's own device instead, block by block in parallel (every 64-byte block depends
only on the key, the nonce and its counter), so ``SecureRandom.device_words`` returns exactly
the bytes OpenSSL would have produced at that position (tests compare them byte for byte).

The 32-bit words are held in int64 and masked after every addition: the additions, XORs and
rotations then stay within int64's range with no reliance on integer overflow, and give the
same results on every device.

Written here because no library offers ChaCha20 on torch devices; the block function is the
RFC's (20 rounds: 10 column and diagonal double rounds, then the input added back).
"""

from __future__ import annotations

import sys

import torch

#: "expand 32-byte k" as four little-endian words.
_CONSTANTS = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)
_MASK = 0xFFFFFFFF
BLOCK_BYTES = 64
# Blocks computed at once: a (16, blocks) int64 state and temporaries of its size (about
# 0.5 KiB a block, 32 MiB at 2¹⁶ blocks; larger or smaller batches were slower on a CPU); a
# CUDA device takes larger ones.
_BATCH = {"cpu": 1 << 16, "cuda": 1 << 20}


def _words_le(data: bytes) -> list[int]:
    return [int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), 4)]


def _rotl_(x: torch.Tensor, n: int) -> None:
    high = x << n
    x >>= 32 - n
    x |= high
    x &= _MASK


def _quarter_rounds(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, d: torch.Tensor) -> None:
    """Four quarter rounds at once, in place: row i of a, b, c and d is one quarter round."""
    for left, right, other, shift in ((a, b, d, 16), (c, d, b, 12), (a, b, d, 8), (c, d, b, 7)):
        left += right
        left &= _MASK
        other ^= left
        _rotl_(other, shift)


def blocks(
    key: bytes, nonce: bytes, counter: int, count: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Keystream blocks ``counter`` … ``counter + count − 1`` for a 32-byte key and 12-byte
    nonce: a (count, 16) int64 tensor of the blocks' little-endian 32-bit words (0 ≤ w < 2³²)."""
    if len(key) != 32 or len(nonce) != 12:
        raise ValueError("ChaCha20 takes a 32-byte key and a 12-byte nonce")
    if count < 0 or counter < 0 or counter + count > 1 << 32:
        raise ValueError("the 32-bit block counter would wrap")
    device = torch.device(device)
    fixed = torch.tensor(
        list(_CONSTANTS) + _words_le(key) + [0] + _words_le(nonce), dtype=torch.int64, device=device
    )
    batch = _BATCH.get(device.type, _BATCH["cuda"])
    out = torch.empty((count, 16), dtype=torch.int64, device=device)
    for start in range(0, count, batch):
        size = min(batch, count - start)
        state = fixed[:, None].repeat(1, size)
        state[12] = torch.arange(
            counter + start, counter + start + size, dtype=torch.int64, device=device
        )
        x = state.clone().view(4, 4, size)
        a, b, c, d = x[0], x[1], x[2], x[3]
        for _ in range(10):
            _quarter_rounds(a, b, c, d)  # the columns
            # The diagonals: row i of a with rows i + 1, i + 2, i + 3 (mod 4) of b, c, d.
            b2, c2, d2 = b.roll(-1, 0), c.roll(-2, 0), d.roll(-3, 0)
            _quarter_rounds(a, b2, c2, d2)
            b.copy_(b2.roll(1, 0))
            c.copy_(c2.roll(2, 0))
            d.copy_(d2.roll(3, 0))
        x = x.view(16, size)
        x += state
        x &= _MASK
        out[start : start + size] = x.T
    return out


def keystream(
    key: bytes, nonce: bytes, offset: int, size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``size`` keystream bytes from byte ``offset`` of the (key, nonce) stream, as uint8."""
    if size == 0:
        return torch.empty(0, dtype=torch.uint8, device=device)
    first = offset // BLOCK_BYTES
    last = (offset + size - 1) // BLOCK_BYTES
    words = blocks(key, nonce, first, last - first + 1, device)
    # Each word as the signed 32-bit integer of its bits (exact: no value leaves int32's
    # range), then its four little-endian bytes.
    signed = (words - ((words >> 31) << 32)).to(torch.int32)
    # The view reads each word's bytes in memory order: little-endian on the hosts and GPUs
    # torch supports (checked once, at import).
    raw = signed.reshape(-1).view(torch.uint8)
    skip = offset - first * BLOCK_BYTES
    return raw[skip : skip + size]


if sys.byteorder != "little":  # pragma: no cover
    raise ImportError("dpcore.mechanisms.chacha reads words as little-endian bytes")
