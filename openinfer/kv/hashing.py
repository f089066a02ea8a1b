"""Chained block hashes: the identity of a block of KV.

H_i = blake2b-128(tokens_i, key=H_{i-1}), with H_{-1} = the request's salt. Two requests
share block i exactly when they share the salt and every token up to the end of block i,
which is what makes a prefix cache sound: the hash names the KV content, not the request.
The position is part of the identity through the chain itself (H_i is i keyed compressions
away from the salt), so it needs no bytes of its own. Only complete blocks are hashed; a
partial tail block has no identity yet.
"""

from __future__ import annotations

import hashlib
import struct
from array import array
from collections.abc import Iterable, Sequence

import numpy as np

from openinfer.errors import ConfigError

BlockHash = bytes
HASH_BYTES = 16
BASE_SALT: BlockHash = bytes(HASH_BYTES)


def salt_hash(cache_salt: str | None = None, lora: str | None = None) -> BlockHash:
    """The chain seed of a cache namespace; ``(None, None)`` is the shared base namespace."""
    if cache_salt is None and lora is None:
        return BASE_SALT
    text = f"salt={cache_salt!r};lora={lora!r}".encode()
    return hashlib.blake2b(text, digest_size=HASH_BYTES).digest()


def validate_tokens(tokens: Sequence[int], field: str = "prompt", vocab_size: int | None = None) -> None:
    """Token ids must be non-negative ints (and below the vocabulary, when it is known)."""
    for i, t in enumerate(tokens):
        if type(t) is not int or t < 0 or (vocab_size is not None and t >= vocab_size):
            upper = f" and < {vocab_size}" if vocab_size is not None else ""
            raise ConfigError(f"{field}[{i}]", t, f"an int >= 0{upper}")


def block_hashes(tokens: Sequence[int], block_size: int, salt: BlockHash = BASE_SALT,
                 start: int = 0, parent: BlockHash | None = None, raw: bytes | None = None) -> list[BlockHash]:
    """Hashes of the complete blocks of ``tokens`` from block index ``start`` on.

    ``parent`` is the hash of block ``start - 1`` (or the salt when ``start == 0``), so a
    caller that already hashed a prefix extends the chain without rehashing it. ``raw``:
    all of ``tokens`` as int64 bytes (``token_bytes``), when the caller already converted
    them (admission validates a prompt through that conversion), so it is not done twice.
    A whole chain (``start == 0``) takes the hashes of the blocks it begins with as the
    last whole chain did from ``LAST_CHAIN`` (see :class:`LastChain`).
    """
    prev = salt if start == 0 else parent
    if prev is None:
        raise ValueError("block_hashes: parent is required when start > 0")
    n_full = len(tokens) // block_size
    if start >= n_full:
        return []
    stride = block_size * 8
    if raw is None:  # a decode step's completed block, mostly: one block's tokens
        raw = token_bytes(tokens[start * block_size:n_full * block_size])
        offset = 0
    else:
        offset = start * stride
    end = offset + (n_full - start) * stride
    out: list[BlockHash] = []
    if start == 0:  # a whole chain: the blocks it begins with as the last one did are known
        out = LAST_CHAIN.shared(salt, stride, raw, n_full)
        if out:
            prev = out[-1]
            offset = len(out) * stride
    blake = hashlib.blake2b
    for j in range(offset, end, stride):
        prev = blake(raw[j:j + stride], digest_size=HASH_BYTES, key=prev).digest()
        out.append(prev)
    if start == 0:
        LAST_CHAIN.keep(salt, stride, raw, out)
    return out


class LastChain:
    """The last whole chain hashed: its salt, block stride, token bytes and hashes.

    Why: every chat prompt begins with the same system prompt (60% of the chat bench's
    prompt blocks), so a prompt's first blocks are mostly the previous prompt's. The
    blocks both begin with (same salt, same block size, byte-equal tokens) have the same
    hashes, and finding how many that is takes a few byte comparisons (a binary search of
    prefix slices, memcmp) where hashing them takes a keyed blake2b each. One entry, not a
    table: a memo of many chains was tried and did not pay in wall time (its lookups are
    memory-bound on keys spread over megabytes, where blake2b is compute-bound), while
    this one entry stays in cache.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        # (salt, stride, token bytes, hashes) as one value: replaced and read whole, so a
        # reader never pairs one chain's bytes with another's hashes
        self._last: tuple[BlockHash, int, bytes, list[BlockHash]] = (b"", 0, b"", [])

    def shared(self, salt: BlockHash, stride: int, raw: bytes, n_full: int) -> list[BlockHash]:
        """The hashes of the leading blocks of ``raw`` (``n_full`` complete ones) that the
        last chain also begins with (a new list; empty when none)."""
        last_salt, last_stride, last, hashes = self._last
        m = len(hashes)
        if n_full < m:
            m = n_full
        if not m or stride != last_stride or salt != last_salt:
            return []
        lo, hi = 0, m  # raw[:lo] matches; raw[:hi] unknown, until it is known to differ
        if raw[:hi * stride] == last[:hi * stride]:
            lo = hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if raw[:mid * stride] == last[:mid * stride]:
                lo = mid
            else:
                hi = mid
        return hashes[:lo]

    def keep(self, salt: BlockHash, stride: int, raw: bytes, hashes: list[BlockHash]) -> None:
        """Remember this chain (a copy of its hashes: the caller's list is the caller's)."""
        self._last = (salt, stride, raw, list(hashes))


LAST_CHAIN = LastChain()


COMPACT = "i"  # the array typecode of a compact prompt: int32, which every vocabulary fits
assert array(COMPACT).itemsize == 4


def compact_tokens(ids: Iterable[int] | bytes = b"") -> array:
    """Token ids in their compact form (``bytes``: int32 in native order, as numpy writes).

    Why: a list of token ids costs ~36 bytes a token (an 8-byte pointer and a 28-byte int
    object for every id above 256), an int32 array 4, and an offline batch holds every
    prompt from t=0 (100k prompts of ~1,000 tokens were most of a 3.6 GB peak). Its items
    are exact ints by construction; hashing widens it to int64 once, by numpy."""
    return array(COMPACT, ids)


def is_compact(tokens: Sequence[int]) -> bool:
    """Whether ``tokens`` is in the compact form of :func:`compact_tokens`."""
    return type(tokens) is array and tokens.typecode == COMPACT


def token_bytes(tokens: Sequence[int]) -> bytes:
    """``tokens`` as the int64 bytes ``block_hashes`` hashes (raises like ``array('q')``).

    Every prompt comes through here once, and every completed decode block. ``struct``
    converts a list of ints in ~40% of the time ``array('q', ...)`` takes (array's
    per-item setter parses each int through ``PyArg_Parse``), to the same bytes (native
    order, 8-byte ``q``, no padding between items of one code); a compiled ``Struct`` per
    length (``_PACKERS``) skips formatting and looking up the format string on each call,
    ~40% of a 16-token block's conversion. What struct refuses (a non-integer, a value
    beyond int64) goes through ``array`` after all, so the error raised is array's own.
    A compact prompt (:func:`is_compact`) longer than ``_NUMPY_FROM`` tokens is widened by
    numpy, a copy at C speed; a short compact slice (a decode step's completed block) packs
    faster through struct, which numpy's fixed ~1.5 us call overhead loses to below ~64
    tokens (16 tokens: 0.5 against 1.5 us; 1,024: 26 against 2 us)."""
    if is_compact(tokens) and len(tokens) > _NUMPY_FROM:
        return np.frombuffer(tokens, dtype=np.int32).astype(np.int64).tobytes()
    n = len(tokens)
    try:
        return (_PACKERS.get(n) or _new_packer(n)).pack(*tokens)
    except struct.error:
        return array("q", tokens).tobytes()


_NUMPY_FROM = 64  # compact token runs longer than this are widened by numpy
_PACKERS: dict[int, struct.Struct] = {}
_MAX_PACKERS = 4096  # distinct lengths kept; past that the cache starts over (memory only)


def _new_packer(n: int) -> struct.Struct:
    """Compile and keep the ``Struct`` of ``n`` int64s (one per length: a block, a prompt)."""
    if len(_PACKERS) >= _MAX_PACKERS:
        _PACKERS.clear()
    packer = _PACKERS[n] = struct.Struct(f"{n}q")
    return packer
