"""Prompt content: token ids as pure functions of a key.

Prefix caching only works in the simulator if equal text gives equal token ids, and a run
only replays if the ids do not depend on which request happened to be generated first.
So every piece of text (a shared system prompt, a chat turn, a Mooncake 512-token block)
is ``tokens_for(key, n)``: seeded from a hash of its key, independent of event order.
numpy computes them because a 1k-token prompt per request through ``random.randrange``
would dominate a 10k-request run.

Token ids come in the engine's compact prompt form, an int32 array
(:func:`openinfer.kv.hashing.compact_tokens`): 4 bytes a token where a list of fresh ints
costs ~36, and an offline batch holds every prompt from t=0. Arrays concatenate, slice
and compare like lists (an array never equals a list: compare ``list(a)``).
"""

from __future__ import annotations

import hashlib
from array import array

import numpy as np

from openinfer.backend.fake_executor import splitmix64_array
from openinfer.kv.hashing import compact_tokens

PROMPT_VOCAB = 151_643  # Qwen3's ordinary tokens: below the special/EOS ids


def key_seed(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big")


def tokens_for(key: str, n: int, vocab: int = PROMPT_VOCAB) -> array:
    """``n`` token ids in [0, vocab), a pure function of (key, n, vocab); a prefix of the
    answer for a larger ``n``. Token i is splitmix64(seed(key) + i) mod vocab: a counter
    through a mixing function needs no generator object, which cost more than the draw
    for a chat turn's few hundred tokens (the bias of the modulo, < vocab / 2^64, is
    nothing a prefix cache can see). Compact, filled from numpy's buffer (an int32 holds
    every id of a ``vocab`` up to 2^31)."""
    if not 0 < vocab <= 2**31:
        raise ValueError(f"tokens_for: vocab={vocab} must be in [1, 2^31] (int32 ids)")
    if n <= 0:
        return compact_tokens()
    x = np.arange(n, dtype=np.uint64)
    x += np.uint64(key_seed(key))
    splitmix64_array(x)
    x %= np.uint64(vocab)
    return compact_tokens(x.astype(np.int32).tobytes())


class BlockTokens:
    """Tokens of hash-identified blocks (Mooncake ``hash_ids``), memoised per id."""

    def __init__(self, block_tokens: int = 512, salt: str = "mooncake", vocab: int = PROMPT_VOCAB,
                 max_cached: int = 65_536) -> None:
        self.block_tokens = block_tokens
        self.salt = salt
        self.vocab = vocab
        self.max_cached = max_cached
        self._cache: dict[int, array] = {}

    def block(self, hash_id: int) -> array:
        toks = self._cache.get(hash_id)
        if toks is None:
            toks = tokens_for(f"{self.salt}/{hash_id}", self.block_tokens, self.vocab)
            if len(self._cache) >= self.max_cached:
                self._cache.clear()  # bounded memory; contents are recomputed identically
            self._cache[hash_id] = toks
        return toks

    def prompt(self, hash_ids: list[int], length: int, tail_key: str) -> array:
        """``length`` tokens: the blocks in order, cut at ``length``; past the last block,
        tokens unique to ``tail_key``."""
        out = compact_tokens()
        for h in hash_ids:
            if len(out) >= length:
                break
            out.extend(self.block(h))
        if len(out) < length:
            out.extend(tokens_for(tail_key, length - len(out), self.vocab))
        return out[:length]
