"""Chained block hashes (spec §2.3): the identity of a block of KV."""

from __future__ import annotations

import hashlib
from array import array

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from openinfer.errors import ConfigError
from openinfer.kv.hashing import (BASE_SALT, HASH_BYTES, block_hashes, compact_tokens, is_compact, salt_hash,
                                  token_bytes, validate_tokens)

SETTINGS = settings(max_examples=150, deadline=None)

block_sizes = st.sampled_from([1, 2, 4, 16])
tokens_st = st.lists(st.integers(0, 50), min_size=0, max_size=80)
names = st.one_of(st.none(), st.text(max_size=6))


@SETTINGS
@given(bs=block_sizes, prefix=tokens_st, tail_a=tokens_st, tail_b=tokens_st, salt=names, lora=names)
def test_equal_prefixes_give_equal_hashes(bs, prefix, tail_a, tail_b, salt, lora):
    s = salt_hash(salt, lora)
    a = block_hashes(prefix + tail_a, bs, s)
    b = block_hashes(prefix + tail_b, bs, s)
    shared = len(prefix) // bs
    assert a[:shared] == b[:shared] == block_hashes(prefix, bs, s)
    assert all(len(h) == HASH_BYTES for h in a)


@SETTINGS
@given(bs=block_sizes, tokens=st.lists(st.integers(0, 50), min_size=1, max_size=80),
       data=st.data())
def test_changing_an_earlier_token_changes_every_later_block(bs, tokens, data):
    assume(len(tokens) >= bs)
    i = data.draw(st.integers(0, len(tokens) - 1), label="changed index")
    new = data.draw(st.integers(0, 50).filter(lambda t: t != tokens[i]), label="new token")
    changed = list(tokens)
    changed[i] = new
    a = block_hashes(tokens, bs)
    b = block_hashes(changed, bs)
    first = i // bs
    assert a[:first] == b[:first]
    for j in range(first, len(a)):
        assert a[j] != b[j], f"block {j} kept its hash after token {i} changed"


@SETTINGS
@given(bs=block_sizes, tokens=st.lists(st.integers(0, 50), min_size=1, max_size=64),
       s1=st.tuples(names, names), s2=st.tuples(names, names))
def test_a_different_salt_changes_every_block_hash(bs, tokens, s1, s2):
    assume(s1 != s2)
    h1 = salt_hash(*s1)
    h2 = salt_hash(*s2)
    assert h1 != h2
    a = block_hashes(tokens, bs, h1)
    b = block_hashes(tokens, bs, h2)
    assert len(a) == len(b)
    assert all(x != y for x, y in zip(a, b))
    assert not set(a) & set(b)


def test_salt_namespaces():
    assert salt_hash() == BASE_SALT == salt_hash(None, None)
    # cache_salt and lora are different namespaces even with the same string
    assert salt_hash("x", None) != salt_hash(None, "x")
    assert salt_hash("x", None) != BASE_SALT
    assert salt_hash(None, "adapter") != BASE_SALT
    toks = list(range(32))
    assert block_hashes(toks, 16, salt_hash(None, "adapter"))[0] != block_hashes(toks, 16)[0]


@SETTINGS
@given(bs=block_sizes, tokens=tokens_st, tail=st.lists(st.integers(0, 50), max_size=15))
def test_only_complete_blocks_are_hashed(bs, tokens, tail):
    hashes = block_hashes(tokens, bs)
    assert len(hashes) == len(tokens) // bs
    full = (len(tokens) // bs) * bs
    # the partial tail has no identity: any tail that does not complete a block leaves the list
    partial = tokens[:full] + tail[: bs - 1]
    assert block_hashes(partial, bs) == block_hashes(tokens[:full], bs)


@SETTINGS
@given(bs=block_sizes, tokens=tokens_st, data=st.data(), salt=names)
def test_incremental_extension_equals_full_hashing(bs, tokens, data, salt):
    s = salt_hash(salt, None)
    full = block_hashes(tokens, bs, s)
    start = data.draw(st.integers(0, len(full)), label="start")
    parent = s if start == 0 else full[start - 1]
    assert block_hashes(tokens, bs, s, start=start, parent=parent) == full[start:]
    # extending past the end yields nothing
    assert block_hashes(tokens, bs, s, start=len(full) + 1, parent=parent) == []


def test_position_is_part_of_the_identity():
    block = [5] * 16
    h = block_hashes(block * 3, 16)
    assert len(set(h)) == 3  # identical content at blocks 0, 1, 2 hashes differently


def test_extension_without_parent_is_refused():
    with pytest.raises(ValueError, match="parent"):
        block_hashes(list(range(64)), 16, start=2)


@pytest.mark.parametrize("bad,index", [
    ([1, 2, -1, 4], 2),
    ([0, 1.0, 2], 1),
    ([True, 1], 0),
    ([0, 0, 0, "7"], 3),
    ([3, None], 1),
])
def test_validate_tokens_rejects_bad_ids_naming_the_index(bad, index):
    with pytest.raises(ConfigError) as exc:
        validate_tokens(bad)
    assert exc.value.field == f"prompt[{index}]"
    assert f"prompt[{index}]" in str(exc.value)


def test_validate_tokens_vocab_bound_and_custom_field():
    validate_tokens([0, 1, 9], vocab_size=10)
    with pytest.raises(ConfigError) as exc:
        validate_tokens([0, 10], field="draft", vocab_size=10)
    assert exc.value.field == "draft[1]"
    assert "< 10" in str(exc.value)


@SETTINGS
@given(tokens=st.lists(st.integers(0, 2**31), max_size=40))
def test_validate_tokens_accepts_non_negative_ints(tokens):
    validate_tokens(tokens)


def _chain(tokens: list[int], bs: int, salt: bytes) -> list[bytes]:
    """The definition, H_i = blake2b-128(tokens_i as int64, key=H_{i-1}), computed afresh."""
    out, prev = [], salt
    for i in range(len(tokens) // bs):
        prev = hashlib.blake2b(array("q", tokens[i * bs:(i + 1) * bs]).tobytes(),
                               digest_size=HASH_BYTES, key=prev).digest()
        out.append(prev)
    return out


@SETTINGS
@given(bs=block_sizes, shared=tokens_st, tails=st.lists(tokens_st, min_size=1, max_size=4),
       salts=st.lists(names, min_size=1, max_size=2), data=st.data())
def test_chains_that_begin_alike_are_the_definitions(bs, shared, tails, salts, data):
    """Chains hashed one after another (the last one's leading blocks reused), sharing a
    prefix, under one or two salts, with and without the caller's bytes: each is the
    definition's, and the caller may change a returned list without effect on the next."""
    for tail in tails:
        salt = salt_hash(data.draw(st.sampled_from(salts)), None)
        toks = shared + tail
        with_raw = data.draw(st.booleans())
        got = block_hashes(toks, bs, salt, raw=array("q", toks).tobytes() if with_raw else None)
        assert got == _chain(toks, bs, salt)
        got.append(b"x" * HASH_BYTES)  # the caller's list is its own
        got[:1] = [b"y" * HASH_BYTES]


def test_a_chain_after_a_different_block_size_or_salt():
    toks = list(range(64))
    a = block_hashes(toks, 16)
    assert block_hashes(toks, 8) == _chain(toks, 8, BASE_SALT)
    assert block_hashes(toks, 16, salt_hash("s")) == _chain(toks, 16, salt_hash("s"))
    assert block_hashes(toks, 16) == a == _chain(toks, 16, BASE_SALT)
    assert block_hashes(toks[:40] + [7] * 24, 16) == _chain(toks[:40] + [7] * 24, 16, BASE_SALT)


@SETTINGS
@given(bs=block_sizes, tokens=st.lists(st.integers(0, 2**31 - 1), max_size=80), salt=names)
def test_a_compact_prompt_hashes_as_its_list_does(bs, tokens, salt):
    """The compact prompt a simulated workload sends (an int32 array) is the same text as
    the list of its ids: equal int64 bytes, equal block hashes, whole or extended."""
    compact = compact_tokens(tokens)
    assert list(compact) == tokens and compact_tokens(compact.tobytes()) == compact
    assert is_compact(compact) and not is_compact(tokens) and not is_compact(array("q", tokens))
    assert token_bytes(compact) == token_bytes(tokens) == array("q", tokens).tobytes()
    s = salt_hash(salt)
    assert block_hashes(compact, bs, s) == block_hashes(tokens, bs, s)
    if len(tokens) >= bs:
        first = block_hashes(tokens[:bs], bs, s)
        assert block_hashes(compact, bs, s, start=1, parent=first[-1]) == block_hashes(tokens, bs, s)[1:]
