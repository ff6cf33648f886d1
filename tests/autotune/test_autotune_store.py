"""The autotune store's keys and invalidation, and the lookup's inertness without
`MLXCEL_AUTOTUNE`."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import pytest

from mlxcel_core.tuning import (
    PAGED_DECODE_PARTITIONS,
    PREFILL_CHUNK,
    TunedEntry,
    Tunings,
    TuningScope,
    TuningStore,
    autotune_dir,
    paged_decode_bucket,
    prefill_bucket,
)

H200 = TuningScope("gpu NVIDIA H200 sm_90", "0.32.4")
BUCKET = prefill_bucket(
    model_type="llama", num_layers=30, hidden_size=576, dtype=mx.bfloat16, weights="dense"
)


def entry(value: int, *, tactic: str = PREFILL_CHUNK, bucket: str = BUCKET) -> TunedEntry:
    return TunedEntry(tactic, bucket, value, 512, 0.5, 1.0)


def test_the_folder_follows_mlxcel_cache_dir(tmp_path):
    assert autotune_dir({"MLXCEL_CACHE_DIR": str(tmp_path)}) == tmp_path / "autotune"
    assert autotune_dir({}) == Path("~/.cache/mlxcel/autotune").expanduser()


def test_the_scope_names_the_device_and_mlx_version():
    scope = TuningScope.current(mx.Device(mx.cpu))
    assert scope.mlx_version == mx.__version__
    assert scope.device.startswith("cpu")
    assert H200.file_name == "gpu-nvidia-h200-sm-90__mlx-0.32.4.json"


def test_another_device_or_mlx_version_has_its_own_file_and_never_reads_another(tmp_path):
    TuningStore(tmp_path, H200).record(entry(1024))
    other_version = TuningScope(H200.device, "0.33.0")
    other_device = TuningScope("gpu NVIDIA H100 sm_90", H200.mlx_version)
    for scope in (other_version, other_device):
        store = TuningStore(tmp_path, scope)
        assert store.path != TuningStore(tmp_path, H200).path
        assert store.read() == {}
    assert TuningStore(tmp_path, H200).read()[(PREFILL_CHUNK, BUCKET)].value == 1024


def test_a_file_holding_another_scope_than_its_name_is_not_read(tmp_path):
    path = TuningStore(tmp_path, H200).record(entry(1024))
    newer = TuningScope(H200.device, "0.33.0")
    path.rename(tmp_path / newer.file_name)
    assert TuningStore(tmp_path, newer).read() == {}


def test_bucket_fields_each_change_the_key(tmp_path):
    shape = dict(dtype=mx.bfloat16, group_size=4, head_dim=128, num_kv_heads=8)
    base = paged_decode_bucket(**shape, num_rows=8, capacity_tokens=4096)
    assert paged_decode_bucket(**shape, num_rows=5, capacity_tokens=3000) == base
    others = [
        paged_decode_bucket(**{**shape, "dtype": mx.float16}, num_rows=8, capacity_tokens=4096),
        paged_decode_bucket(**{**shape, "group_size": 8}, num_rows=8, capacity_tokens=4096),
        paged_decode_bucket(**{**shape, "head_dim": 64}, num_rows=8, capacity_tokens=4096),
        paged_decode_bucket(**{**shape, "num_kv_heads": 4}, num_rows=8, capacity_tokens=4096),
        paged_decode_bucket(**shape, num_rows=9, capacity_tokens=4096),
        paged_decode_bucket(**shape, num_rows=8, capacity_tokens=4097),
    ]
    assert len({base, *others}) == 7
    store = TuningStore(tmp_path, H200)
    store.record(entry(4, tactic=PAGED_DECODE_PARTITIONS, bucket=base))
    store.record(entry(16, tactic=PAGED_DECODE_PARTITIONS, bucket=others[-1]))
    store.record(entry(256))
    stored = {key: e.value for key, e in store.read().items()}
    assert stored == {
        (PAGED_DECODE_PARTITIONS, base): 4,
        (PAGED_DECODE_PARTITIONS, others[-1]): 16,
        (PREFILL_CHUNK, BUCKET): 256,
    }


def test_recording_again_replaces_the_entry_and_leaves_no_temporary_file(tmp_path):
    store = TuningStore(tmp_path, H200)
    store.record(entry(1024))
    store.record(entry(2048))
    assert store.read()[(PREFILL_CHUNK, BUCKET)].value == 2048
    assert [p.name for p in tmp_path.iterdir()] == [H200.file_name]


def test_another_format_version_is_ignored_then_rewritten(tmp_path):
    store = TuningStore(tmp_path, H200)
    store.record(entry(1024))
    document = json.loads(store.path.read_text())
    document["format"] = 2
    store.path.write_text(json.dumps(document))
    assert store.read() == {}
    store.record(entry(256))
    assert json.loads(store.path.read_text())["format"] == 1
    assert {e.value for e in store.read().values()} == {256}


@pytest.mark.parametrize(
    "text", ['{"format": 1, "entr', "\xff\xfe", "[]", '{"format": 1, "entries": {}}'],
)  # fmt: skip
def test_a_corrupt_file_reads_as_empty_then_is_rewritten(tmp_path, text):
    store = TuningStore(tmp_path, H200)
    tmp_path.joinpath(H200.file_name).write_bytes(text.encode("latin-1"))
    assert store.read() == {}
    store.record(entry(128))
    assert store.read()[(PREFILL_CHUNK, BUCKET)].value == 128


def test_malformed_entries_are_skipped_and_the_rest_kept(tmp_path):
    store = TuningStore(tmp_path, H200)
    store.record(entry(1024))
    document = json.loads(store.path.read_text())
    good = document["entries"][0]
    document["entries"] += [
        {**good, "bucket": "b1", "value": 0},
        {**good, "bucket": "b2", "value": "big"},
        {**good, "bucket": "b3", "median_seconds": 0},
        {"tactic": PREFILL_CHUNK},
        "not an entry",
    ]
    store.path.write_text(json.dumps(document))
    assert list(store.read()) == [(PREFILL_CHUNK, BUCKET)]


def test_clear_deletes_this_scope_only(tmp_path):
    TuningStore(tmp_path, H200).record(entry(1024))
    other = TuningStore(tmp_path, TuningScope(H200.device, "0.33.0"))
    other.record(entry(256))
    assert TuningStore(tmp_path, H200).clear()
    assert not TuningStore(tmp_path, H200).clear()
    assert other.read()[(PREFILL_CHUNK, BUCKET)].value == 256


@pytest.mark.parametrize("setting", [None, "", "0"])
def test_lookups_give_the_default_unless_autotune_is_set(tmp_path, setting):
    TuningStore(tmp_path / "autotune", H200).record(entry(1024))
    environ = {"MLXCEL_CACHE_DIR": str(tmp_path)}
    if setting is not None:
        environ["MLXCEL_AUTOTUNE"] = setting
    tunings = Tunings.from_environ(environ, H200)
    assert not tunings.enabled
    assert tunings.value(PREFILL_CHUNK, BUCKET, 512) == 512


def test_with_autotune_set_lookups_give_the_stored_value_for_its_bucket_only(tmp_path):
    TuningStore(tmp_path / "autotune", H200).record(entry(1024))
    environ = {"MLXCEL_CACHE_DIR": str(tmp_path), "MLXCEL_AUTOTUNE": "1"}
    tunings = Tunings.from_environ(environ, H200)
    assert tunings.value(PREFILL_CHUNK, BUCKET, 512) == 1024
    assert tunings.value(PREFILL_CHUNK, BUCKET.replace("layers=30", "layers=31"), 512) == 512
    assert tunings.value(PAGED_DECODE_PARTITIONS, BUCKET, 8) == 8
    newer = Tunings.from_environ(environ, TuningScope(H200.device, "0.33.0"))
    assert newer.enabled and newer.value(PREFILL_CHUNK, BUCKET, 512) == 512
