"""The one source of the randomness the privacy analyses treat as secret.

Amplification by sampling (subsets, Poisson inclusion bits), the mixing coefficients and the
noise all assume the adversary does not know the random choices. A torch generator seeded
with 63 bits is a statistical PRNG: its whole output follows from the seed (and from a few
hundred outputs), so the guarantee would hold only while the seed stays secret and
unrecovered. ``SecureRandom`` is instead a ChaCha20 keystream (the ``cryptography`` package,
i.e. OpenSSL) keyed with 256 bits from the OS CSPRNG (``secrets``): under the standard
assumption that ChaCha20 is a PRF, its bytes are indistinguishable from uniform, and no
output reveals the key or other outputs.

Everything is derived from those bytes with exact distributions:

- ``integers``: uniform on {0, …, m − 1} by rejection (no modulo bias);
- ``bernoulli(k, m)``: exactly k/m, as [U < k] with U uniform on {0, …, m − 1};
- ``uniform``: floats on [0, 1) carrying 53 random bits (every multiple of 2⁻⁵³ equally likely);
- ``keys``: uniform 32-bit integer sort keys (exchangeable; ties are the caller's business);
- ``normal``: Box–Muller from those uniforms, evaluated in torch on the target device.

On a device other than the CPU, ``uniform``, ``keys`` and ``normal`` (and ``device_words`` for
the noise, ``dpcore.mechanisms.noise``) compute their keystream bytes there with the same
ChaCha20 in torch (``dpcore.mechanisms.chacha``), from the stream's position: the same bytes,
hence the same values, as on the CPU, with nothing waiting on the CPU or copied to the device.

Reproducibility: tests and audits pass an explicit key (``SecureRandom.from_seed``); the
release path (``worker.runner``) calls ``SecureRandom()``, which always draws a fresh OS key.
Not thread-safe by design of use (one instance per release job); a lock makes accidental
sharing safe anyway.
"""

from __future__ import annotations

import hashlib
import math
import secrets
import threading

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, CipherContext, algorithms

from dpcore.mechanisms import chacha

KEY_BYTES = 32
# A fresh 96-bit nonce per segment, counter from 0: OpenSSL's ChaCha20 has a 32-bit block
# counter (256 GiB per nonce); segments of 1 GiB stay far from its wrap-around.
SEGMENT_BYTES = 1 << 30
_UNIFORM_BITS = 53
# Keystream is produced by encrypting this many zero bytes at a time (cache-sized).
_CHUNK_BYTES = 1 << 16
_ZEROS = memoryview(bytes(_CHUNK_BYTES))
_TWO_PI = 2.0 * math.pi


class SecureRandom:
    """A ChaCha20 keystream keyed from the OS; see the module docstring."""

    def __init__(self, *, key: bytes | None = None) -> None:
        if key is None:
            key = secrets.token_bytes(KEY_BYTES)
        if len(key) != KEY_BYTES:
            raise ValueError(f"the key must be {KEY_BYTES} bytes")
        self._key = bytes(key)
        self._segment = -1
        self._left = 0
        self._lock = threading.Lock()
        # The stream positions [start, end) of the latest read if it was ``device_words``
        # (``rewind`` may give back its tail), else (−1, −1).
        self._last_device_read = (-1, -1)
        self._encryptor = self._next_segment()

    @classmethod
    def from_seed(cls, seed: int) -> SecureRandom:
        """A reproducible stream for tests and offline audits (the key is public: never use
        it for a release)."""
        return cls(key=hashlib.sha256(f"dprelease-test-seed:{seed}".encode()).digest())

    def _next_segment(self) -> CipherContext:
        self._segment += 1
        self._left = SEGMENT_BYTES
        return self._encryptor_at(0)

    def _encryptor_at(self, offset: int) -> CipherContext:
        """OpenSSL's ChaCha20 for the current segment, from byte ``offset`` of it: its 16-byte
        IV is the 32-bit block counter (little-endian), then the segment's 12-byte nonce."""
        counter = (offset // chacha.BLOCK_BYTES).to_bytes(4, "little")
        cipher = Cipher(algorithms.ChaCha20(self._key, counter + self._nonce()), mode=None)
        encryptor = cipher.encryptor()
        skip = offset % chacha.BLOCK_BYTES
        if skip:
            encryptor.update(bytes(skip))
        return encryptor

    def _nonce(self) -> bytes:
        return self._segment.to_bytes(12, "little")

    @property
    def position(self) -> int:
        """Keystream bytes drawn so far (0 for a fresh source): lets a caller check that a
        step drew nothing (``worker/engines.py``: the single-machine build before a Dask run)."""
        with self._lock:
            return self._position()

    def _position(self) -> int:
        # Callers hold the lock.
        return self._segment * SEGMENT_BYTES + (SEGMENT_BYTES - self._left)

    # --- bytes ---------------------------------------------------------------------------

    def fill(self, out: np.ndarray) -> np.ndarray:
        """Overwrite the (C-contiguous) array ``out`` with keystream bytes and return it."""
        if not out.flags.c_contiguous:
            raise ValueError("out must be C-contiguous")
        view = memoryview(out.reshape(-1).view(np.uint8))  # type: ignore[arg-type]
        with self._lock:
            self._last_device_read = (-1, -1)
            start = 0
            while start < view.nbytes:
                if self._left == 0:
                    self._encryptor = self._next_segment()
                take = min(self._left, view.nbytes - start, _CHUNK_BYTES)
                # Encrypting zeros yields the keystream itself; in chunks from one shared
                # zero buffer (a fresh bytes(n) per call fills several times slower:
                # docs/results/implementation.md).
                self._encryptor.update_into(_ZEROS[:take], view[start : start + take])
                self._left -= take
                start += take
        return out

    def device_words(
        self,
        shape: int | tuple[int, ...],
        device: torch.device | str,
        dtype: torch.dtype = torch.int64,
    ) -> torch.Tensor:
        """The words ``fill`` would give an array of ``shape`` and ``dtype`` (the same keystream
        bytes, as the signed integers of their bits), computed on ``device`` by
        ``dpcore.mechanisms.chacha`` from the stream's position, which then moves past them:
        a CUDA release draws its randomness where it uses it, with the CPU's stream and law."""
        count = math.prod(shape) if isinstance(shape, tuple) else shape
        need = count * torch.empty(0, dtype=dtype).element_size()
        parts = []
        with self._lock:
            start = self._position()
            self._last_device_read = (start, start + need)
            while need:
                if self._left == 0:
                    self._encryptor = self._next_segment()
                take = min(self._left, need)
                offset = SEGMENT_BYTES - self._left
                parts.append(chacha.keystream(self._key, self._nonce(), offset, take, device))
                self._left -= take
                need -= take
            if self._left:
                # OpenSSL's context resumes where the device's bytes ended.
                self._encryptor = self._encryptor_at(SEGMENT_BYTES - self._left)
        if not parts:
            return torch.empty(shape, dtype=dtype, device=device)
        return torch.cat(parts).view(dtype).reshape(shape)

    def rewind(self, position: int) -> None:
        """Give back the tail of the latest read, from ``position`` on: for a caller that
        computed words ahead (``device_words``) and used none past ``position``. Only that
        read's own bytes can be given back, and only before any other read: bytes once used
        are never drawn again."""
        with self._lock:
            current = self._position()
            start, end = self._last_device_read
            if not (end == current and start <= position <= end):
                raise ValueError(
                    "only the tail of the latest device_words read, before any other read, "
                    "can be given back"
                )
            self._last_device_read = (position, position)
            segment, offset = divmod(position, SEGMENT_BYTES)
            if offset == 0 and segment:
                # The end of the previous segment: the next read opens this one.
                segment, offset = segment - 1, SEGMENT_BYTES
            self._segment = segment
            self._left = SEGMENT_BYTES - offset
            self._encryptor = self._encryptor_at(offset)

    def bytes(self, count: int) -> bytes:
        """``count`` keystream bytes (``RoundedGaussian.sample``'s ``random_bytes``)."""
        return self.fill(np.empty(count, dtype=np.uint8)).tobytes()

    def words(self, count: int, dtype: type[np.unsignedinteger] = np.uint64) -> np.ndarray:
        return self.fill(np.empty(count, dtype=dtype))

    # --- exact integer laws ----------------------------------------------------------------

    def integers(self, high: int, shape: int | tuple[int, ...]) -> np.ndarray:
        """Uniform int64 on {0, …, high − 1}: words ≥ the largest multiple of ``high`` that
        fits are redrawn, so every residue has the same number of preimages."""
        if not 1 <= high <= 2**63:
            raise ValueError("high must be in [1, 2**63]")
        size = math.prod(shape) if isinstance(shape, tuple) else shape
        dtype = np.uint32 if high <= 2**32 else np.uint64
        span = 1 << (32 if dtype is np.uint32 else 64)
        limit = span - span % high
        words = self.words(size, dtype)
        while True:
            bad = np.flatnonzero(words >= limit) if limit < span else np.empty(0, np.intp)
            if bad.size == 0:
                break
            words[bad] = self.words(bad.size, dtype)
        values = words if high == span else words % dtype(high)
        return values.astype(np.int64).reshape(shape)

    def bernoulli(self, numerator: int, denominator: int, shape: tuple[int, ...]) -> np.ndarray:
        """Booleans, each True with probability exactly numerator/denominator."""
        if not 0 <= numerator <= denominator:
            raise ValueError("need 0 <= numerator <= denominator")
        return self.integers(denominator, shape) < numerator

    # --- torch views -----------------------------------------------------------------------

    def randint(
        self, high: int, shape: tuple[int, ...], *, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        return torch.from_numpy(self.integers(high, shape)).to(device)

    def keys(self, shape: tuple[int, ...], *, device: torch.device | str = "cpu") -> torch.Tensor:
        """Uniform int32 sort keys (all 2³² values equally likely)."""
        if torch.device(device).type != "cpu":
            return self.device_words(shape, device, torch.int32)
        words = self.fill(np.empty(shape, dtype=np.int32))
        return torch.from_numpy(words)

    def uniform(
        self, shape: tuple[int, ...], *, device: torch.device | str = "cpu", open_zero: bool = False
    ) -> torch.Tensor:
        """float64 k·2⁻⁵³ with k uniform on {0, …, 2⁵³ − 1} (on (0, 1] with ``open_zero``:
        (k + 1)·2⁻⁵³). The top 53 bits of each word, extracted on ``device``."""
        if torch.device(device).type != "cpu":
            words = self.device_words(shape, device)
        else:
            words = torch.from_numpy(self.fill(np.empty(shape, dtype=np.int64)))
        # int64 >> is arithmetic: the mask keeps exactly the word's 53 high bits.
        k = (words >> (64 - _UNIFORM_BITS)) & ((1 << _UNIFORM_BITS) - 1)
        if open_zero:
            k = k + 1
        return k.to(torch.float64) * 2.0**-_UNIFORM_BITS

    def normal(
        self,
        shape: tuple[int, ...],
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float64,
    ) -> torch.Tensor:
        """Standard normals by Box–Muller in float64 on ``device``, cast to ``dtype``.

        Written here (two lines) because no library offers Gaussian draws from a
        caller-supplied secure stream on a torch device. u₁ ∈ (0, 1] keeps the log finite.
        """
        count = math.prod(shape)
        pairs = -(-count // 2)
        u = self.uniform((2, pairs), device=device, open_zero=True)
        radius = torch.sqrt(-2.0 * torch.log(u[0]))
        angle = _TWO_PI * u[1]
        z = torch.cat((radius * torch.cos(angle), radius * torch.sin(angle)))[:count]
        return z.reshape(shape).to(dtype)
