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
from collections.abc import Sequence

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
                 start: int = 0, parent: BlockHash | None = None, raw: bytes | None = None,
                 fresh: bool = False) -> list[BlockHash]:
    """Hashes of the complete blocks of ``tokens`` from block index ``start`` on.

    ``parent`` is the hash of block ``start - 1`` (or the salt when ``start == 0``), so a
    caller that already hashed a prefix extends the chain without rehashing it. ``raw``:
    all of ``tokens`` as int64 bytes (``token_bytes``), when the caller already converted
    them (admission validates a prompt through that conversion), so it is not done twice.

    Each block's hash is looked up in ``MEMO`` (see :class:`HashMemo`) until the first
    block not found there; that block and every later one are hashed and kept without a
    lookup, since their parents were just computed (a successor could still be there only
    if the memo dropped its parent first: a hash computed again, the same value).
    ``fresh``: the caller knows the blocks hold newly generated tokens (a decode step's
    completed block), so no lookup is made at all. Either way only work is saved: every
    hash is the chain's own.
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
    j = offset
    if len(prev) != HASH_BYTES:  # a foreign salt: its block is not memoised (see HashMemo)
        prev = hashlib.blake2b(raw[j:j + stride], digest_size=HASH_BYTES, key=prev).digest()
        out.append(prev)
        j += stride
    memo = MEMO
    if not fresh:
        known = memo.young.get
        while j < end:
            h = known(prev + raw[j:j + stride])
            if h is None:
                h = memo.recall(prev + raw[j:j + stride])
                if h is None:
                    break
            prev = h
            out.append(h)
            j += stride
    blake, keep = hashlib.blake2b, memo.keep
    while j < end:
        block = raw[j:j + stride]
        h = blake(block, digest_size=HASH_BYTES, key=prev).digest()
        keep(prev + block, h)
        prev = h
        out.append(h)
        j += stride
    return out


class HashMemo:
    """Block hashes already computed, keyed by (parent hash + the block's int64 bytes).

    Why: most prompt blocks were hashed before. Every chat prompt starts with the shared
    system prompt, and a session's next prompt is its previous prompt + answer + a new
    turn, whose blocks were hashed when that prompt was admitted and that answer decoded
    (~89% of prompt blocks in the chat bench). A keyed blake2b of one block costs several
    times the dict lookup that finds it here. The value is the hash itself, so the chain
    (and every identity built on it) is exactly what hashing gives; only work is saved.

    The key is exact: a parent is always ``HASH_BYTES`` long (a salt of another length
    hashes its first block outright), so the key's length fixes the block's. Bounded by
    two generations of at most ``cap`` entries (~250 bytes each): new hashes go into the
    young one, a hit in the old one is copied back into the young one (so the shared
    system prompt stays), and a full young generation becomes the old one, dropping the
    rest.
    """

    __slots__ = ("young", "old", "cap")

    def __init__(self, cap: int) -> None:
        self.young: dict[bytes, BlockHash] = {}
        self.old: dict[bytes, BlockHash] = {}
        self.cap = cap

    def recall(self, key: bytes) -> BlockHash | None:
        """The hash kept under ``key`` in the old generation (then kept young), or None."""
        h = self.old.get(key)
        if h is not None:
            self.keep(key, h)
        return h

    def keep(self, key: bytes, h: BlockHash) -> None:
        """Keep ``h`` under ``key`` (parent + block) in the young generation."""
        young = self.young
        young[key] = h
        if len(young) >= self.cap:
            self.old, self.young = young, {}


MEMO_CAP = 1 << 15
MEMO = HashMemo(MEMO_CAP)


def token_bytes(tokens: Sequence[int]) -> bytes:
    """``tokens`` as the int64 bytes ``block_hashes`` hashes (raises like ``array('q')``).

    Every prompt comes through here once, and every completed decode block. ``struct``
    converts a list of ints in ~40% of the time ``array('q', ...)`` takes (array's
    per-item setter parses each int through ``PyArg_Parse``), to the same bytes (native
    order, 8-byte ``q``, no padding between items of one code); a compiled ``Struct`` per
    length (``_PACKERS``) skips formatting and looking up the format string on each call,
    ~40% of a 16-token block's conversion. What struct refuses (a non-integer, a value
    beyond int64) goes through ``array`` after all, so the error raised is array's own."""
    n = len(tokens)
    try:
        return (_PACKERS.get(n) or _new_packer(n)).pack(*tokens)
    except struct.error:
        return array("q", tokens).tobytes()


_PACKERS: dict[int, struct.Struct] = {}
_MAX_PACKERS = 4096  # distinct lengths kept; past that the cache starts over (memory only)


def _new_packer(n: int) -> struct.Struct:
    """Compile and keep the ``Struct`` of ``n`` int64s (one per length: a block, a prompt)."""
    if len(_PACKERS) >= _MAX_PACKERS:
        _PACKERS.clear()
    packer = _PACKERS[n] = struct.Struct(f"{n}q")
    return packer
