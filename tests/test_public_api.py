"""The public surface of ``kernel``: errors are importable from the package itself."""

from __future__ import annotations

import pytest

import kernel
from kernel.io import trace
from pipeline import errors


def test_errors_are_exported_from_kernel() -> None:
    assert kernel.RefusalError is errors.RefusalError
    assert kernel.DocumentError is errors.DocumentError
    assert kernel.Problem is errors.Problem
    assert kernel.TraceError is trace.TraceError
    assert kernel.RejectedRowError is trace.RejectedRowError
    for name in ("RefusalError", "DocumentError", "Problem", "TraceError", "RejectedRowError"):
        assert name in kernel.__all__


def test_a_user_catches_kernel_errors_without_reaching_into_pipeline() -> None:
    with pytest.raises(kernel.DocumentError, match="no scenario"):
        kernel.open("no-such-scenario-anywhere")
