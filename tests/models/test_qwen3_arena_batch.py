"""The page-major arena layout and ForwardBatch construction."""

from __future__ import annotations

import pytest
import torch

from openinfer.errors import ConfigError
from openinfer.models.qwen3.batch import ForwardBatch, SeqInput
from openinfer.models.qwen3.config import preset
from openinfer.models.qwen3.kv_arena import KVArena


def test_one_page_is_one_contiguous_slab():
    cfg = preset("tiny")
    a = KVArena.for_config(cfg, num_pages=5, block_size=4, dtype=torch.float32)
    assert tuple(a.data.shape) == (5, 2, 2, 4, 2, 16)
    assert a.page(3).is_contiguous() and a.page(3).numel() * 4 == a.bytes_per_page
    assert a.bytes_per_page == KVArena.bytes_per_page_for(cfg, 4, torch.float32)
    a.k(1)[3, 2, 1].fill_(7.0)                 # layer 1, K, page 3, offset 2, head 1
    a.v(0)[3, 0, 0].fill_(5.0)
    assert (a.page(3)[1, 0, 2, 1] == 7.0).all() and (a.page(3)[0, 1, 0, 0] == 5.0).all()
    assert a.data.sum() == 7.0 * 16 + 5.0 * 16  # views alias the arena, zero elsewhere


def test_forward_batch_prefix_mid_block():
    b = ForwardBatch.from_seqs([SeqInput([1, 2, 3], 5, [9, 4]), SeqInput([7], 2, [6])],
                               block_size=4, max_pages=3)
    assert b.positions.tolist() == [5, 6, 7, 2]
    assert b.slot_mapping.tolist() == [4 * 4 + 1, 4 * 4 + 2, 4 * 4 + 3, 6 * 4 + 2]
    assert b.block_tables.tolist() == [[9, 4, 0], [6, 0, 0]]
    assert b.seq_lens.tolist() == [8, 3] and b.query_start_loc.tolist() == [0, 3, 4]
    assert b.last_token_index.tolist() == [2, 3]
    assert b.max_query_len == 3 and not b.is_decode


def test_forward_batch_errors_name_the_sequence():
    with pytest.raises(ConfigError, match=r"seqs\[1\].page_table"):
        ForwardBatch.from_seqs([SeqInput([1], 0, [1]), SeqInput([1, 2], 3, [2])], 4)
    with pytest.raises(ConfigError, match=r"seqs\[0\]"):
        ForwardBatch.from_seqs([SeqInput([], 0, [1])], 4)
