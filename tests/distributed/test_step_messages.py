"""The step messages rank 0 sends to the other ranks of a tensor-parallel group."""

from __future__ import annotations

import pytest

from mlxcel_core.cache.paged import BlockCopy
from mlxcel_core.engine import RowInput
from mlxcel_distributed import KVPlan, Shutdown, StepMessage, decode_message, encode_message
from mlxcel_distributed.step_channel import FRAME_INTS


def _step(*rows: RowInput, copies: tuple[BlockCopy, ...] = ()) -> StepMessage:
    return StepMessage(num_blocks=(12,), copies=copies, rows=rows)


@pytest.mark.parametrize(
    "message",
    [
        KVPlan((4097,)),
        KVPlan((12,), reports=True),
        KVPlan((40, 9), (None, 8)),
        Shutdown(),
        _step(RowInput([17], ([1, 2],), 31)),
        _step(
            RowInput(list(range(1000, 1000 + 3 * FRAME_INTS)), ([3, 4, 5, 6],), 0),
            RowInput([49151], ([7],), 15),
            RowInput([5, 6, 7, 8], ([8, 9],), 14, num_logits=4),
            copies=(BlockCopy(2, 10), BlockCopy(3, 11)),
        ),
        _step(
            RowInput([5, 6], ([1],), 0, state_slot=0),
            RowInput([9], ([2, 3],), 6, state_slot=3, state_source=0),
        ),
        StepMessage(
            num_blocks=(12, 6),
            copies=(BlockCopy(2, 10), BlockCopy(3, 5, group=1)),
            rows=(
                RowInput([7], ([1, 2, 3, 4, 5], [1, 0, 0, 3, 4]), 18),
                RowInput([8, 9], ([6, 7], [2, 0]), 5, num_logits=2),
                RowInput([4], ([8], [5]), 0),
            ),
        ),
    ],
    ids=[
        "kv-plan",
        "kv-plan-reports",
        "kv-plan-groups",
        "shutdown",
        "decode-row",
        "prefill-decode-verify-copies",
        "state-slots",
        "block-groups",
    ],
)
def test_messages_round_trip(message):
    ints = encode_message(message)
    assert all(isinstance(i, int) and 0 <= i < 2**31 for i in ints)
    assert decode_message(ints) == message


def test_a_decode_step_of_many_rows_fits_one_frame():
    rows = [RowInput([i], (list(range(1, 9)),), 100 + i) for i in range(16)]
    assert len(encode_message(_step(*rows))) <= FRAME_INTS - 1


def test_a_windowed_table_travels_without_its_null_run():
    window_table = [1, *[0] * 100, 7, 8]
    one = _step(RowInput([5], (list(range(1, 104)),), 400))
    two = StepMessage((104, 9), (), (RowInput([5], (list(range(1, 104)), window_table), 400),))
    assert len(encode_message(two)) - len(encode_message(one)) == 2 + 3


def test_rows_with_adapter_scales_are_refused():
    with pytest.raises(ValueError, match="LoRA adapter scales"):
        encode_message(_step(RowInput([1], ([1],), 0, adapter_scales=(1.0,))))


@pytest.mark.parametrize(
    ("ints", "match"),
    [
        ([], "truncated"),
        ([9], "unknown step message kind 9"),
        ([1], "truncated"),
        ([3, 0], "1 ints past its end"),
        ([2, 5, 0, 1, 3, 1, 0, 1, 42], "truncated"),
    ],
)
def test_malformed_messages_are_refused(ints, match):
    with pytest.raises(ValueError, match=match):
        decode_message(ints)
