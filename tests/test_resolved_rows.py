"""Resolved rows → kernel.model.resolved records by one rule (kernel.pool.rows.from_row)."""

from __future__ import annotations

import dataclasses

import pytest

from kernel.model.resolved import MemoryMagnitudes, Origin, PlannedLayer
from kernel.pool.rows import from_row

ROW = {"comm_bytes": 10, "workspace_bytes": 20.0, "capture_bytes": 30,
       "activation_buffers": 2, "activation_floor": 0.5, "activation_width": 4,
       "max_num_batched_tokens": 8192, "checkpoint_bytes": 2, "vocab_size": 7,
       "hidden_size": 9, "unrelated": "ignored"}


def test_fields_read_their_column_or_the_declared_one_and_take_the_field_type() -> None:
    m = from_row(MemoryMagnitudes, ROW)
    assert m.batched_tokens == 8192 and m.checkpoint_weight_bytes == 2.0
    for f in dataclasses.fields(m):  # converted to the declared type, not the row's
        assert type(getattr(m, f.name)).__name__ == f.type, f.name


def test_null_is_an_error_naming_the_column() -> None:
    with pytest.raises(ValueError, match="MemoryMagnitudes.hidden_size: column 'hidden_size'"):
        from_row(MemoryMagnitudes, {**ROW, "hidden_size": None})
    with pytest.raises(ValueError, match="Origin.set: column 'set' is NULL"):
        from_row(Origin, {"name": "x", "set": None, "method": "m", "scope": "s"})


def test_a_missing_column_or_an_unsupplied_record_field_is_named() -> None:
    row = dict(ROW)
    del row["checkpoint_bytes"]
    with pytest.raises(KeyError, match="checkpoint_weight_bytes.*'checkpoint_bytes'"):
        from_row(MemoryMagnitudes, row)
    with pytest.raises(TypeError, match="PlannedLayer.dense_gemms"):
        from_row(PlannedLayer, {"layer_kind": "a", "count": 1})
