"""CUDA-graph bookkeeping: buckets, static buffers, padding, and when a step replays."""

from __future__ import annotations

import pytest

from kvscale_engine.engine.cuda_graphs import (
    GraphPlan,
    Replay,
    bucket_for,
    capture_sizes,
    pad_decode,
)


@pytest.mark.parametrize(
    ("max_num_seqs", "expected"),
    [
        (1, (1,)),
        (3, (1, 2, 3)),
        (8, (1, 2, 4, 8)),
        (20, (1, 2, 4, 8, 16, 20)),
        (40, (1, 2, 4, 8, 16, 24, 32, 40)),
    ],
)
def test_capture_sizes(max_num_seqs: int, expected: tuple[int, ...]) -> None:
    assert capture_sizes(max_num_seqs) == expected


def test_capture_sizes_stop_at_the_cap() -> None:
    sizes = capture_sizes(1024)
    assert sizes[-1] == 512 and len(sizes) == 3 + 512 // 8
    assert capture_sizes(1024, cap=64)[-1] == 64


@pytest.mark.parametrize(
    ("batch", "bucket"), [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 24), (33, 40), (41, None)]
)
def test_batches_pad_up_to_the_next_bucket(batch: int, bucket: int | None) -> None:
    assert bucket_for(batch, capture_sizes(40)) == bucket


def plan(max_num_seqs: int = 40, max_model_len: int = 100) -> GraphPlan:
    return GraphPlan.of(max_num_seqs, max_model_len, block_size=16, num_kv_blocks=10)


def test_static_buffers_are_sized_for_the_largest_bucket() -> None:
    shapes = plan().buffer_shapes()
    assert shapes == {
        "token_ids": ((40,), "int64"),
        "positions": ((40,), "int64"),
        "slot_mapping": ((40,), "int64"),
        "block_tables": ((40, 7), "int32"),  # ceil(100 / 16)
        "context_lens": ((40,), "int32"),
    }


def test_scratch_slot_is_past_every_pool_block() -> None:
    p = plan()
    assert p.scratch_block == 10 and p.scratch_slot == 160


def test_padding_rows_write_to_the_scratch_slot_only() -> None:
    p = plan()
    rows = pad_decode(p, [11, 12, 13], [0, 16, 40], [[3], [5, 2], [7, 1, 9]])
    assert (rows.bucket, rows.num_seqs) == (4, 3)
    assert rows.token_ids == [11, 12, 13, 0]
    assert rows.positions == [0, 16, 40, 0]
    assert rows.slot_mapping == [3 * 16, 2 * 16, 9 * 16 + 8, p.scratch_slot]
    assert rows.context_lens == [1, 17, 41, 1]
    assert rows.block_tables[0] == [3] + [10] * 6
    assert rows.block_tables[2] == [7, 1, 9] + [10] * 4
    assert rows.block_tables[3] == [10] * 7
    real = {s for t in ([3], [5, 2], [7, 1, 9]) for b in t for s in range(b * 16, b * 16 + 16)}
    assert p.scratch_slot not in real


def test_a_full_bucket_has_no_padding() -> None:
    rows = pad_decode(plan(), [1, 2], [3, 4], [[0], [1]])
    assert rows.bucket == 2 and rows.slot_mapping == [3, 20]


def test_more_decodes_than_the_largest_bucket_cannot_be_padded() -> None:
    with pytest.raises(AssertionError):
        pad_decode(plan(max_num_seqs=2), [1, 2, 3], [0, 0, 0], [[0], [1], [2]])


@pytest.mark.parametrize(
    ("new_tokens", "context_lens", "enabled", "expected"),
    [
        ([1, 1, 1], [5, 9, 100], True, Replay.REPLAY),
        ([1] * 40, [5] * 40, True, Replay.REPLAY),
        ([1, 1], [5, 9], False, Replay.DISABLED),
        ([7], [7], True, Replay.PREFILL),
        ([4, 3], [4, 3], True, Replay.PREFILL),
        ([1, 5], [9, 5], True, Replay.MIXED),
        ([1] * 41, [5] * 41, True, Replay.OVERSIZE),
        ([1, 1], [5, 101], True, Replay.LONG_CONTEXT),
    ],
)
def test_which_steps_replay(
    new_tokens: list[int], context_lens: list[int], enabled: bool, expected: Replay
) -> None:
    assert plan().decide(new_tokens, context_lens, enabled) is expected
