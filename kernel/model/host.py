"""Host overheads outside the step (model.md §6.1)."""

from __future__ import annotations

from .resolved import ResolvedPool

__all__ = ["admission_overhead", "completion_overhead", "output_token_overhead"]


def admission_overhead(r: ResolvedPool, prompt_tokens: int) -> int:
    """Host ns before a request can be scheduled: per request + per prompt token (model.md §6.1).

    0 for ``prompt_tokens <= 0``; the per-token part is ``int(float(per_token_ns)·p)``.
    """
    if prompt_tokens <= 0:
        return 0
    c = r.coefficients
    return c.host_admission_per_request_ns + int(float(c.host_admission_per_token_ns)
                                                 * prompt_tokens)


def output_token_overhead(r: ResolvedPool) -> int:
    return r.coefficients.host_output_token_ns


def completion_overhead(r: ResolvedPool) -> int:
    return r.coefficients.host_completion_ns
