"""Graph-mode downgrades (model.md §9.5 rules 5 and 8; issue 18): each downgrade is an
override with its reason, and host time and capture bytes follow the resolved mode."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kernel.facade import factory
from kernel.facade.kernel import Kernel
from kernel.model import laws
from kernel.model.types import Batch, Resource
from pipeline import db
from pipeline.documents import Chip, Offload, PDTransfer, Speculative, Tier
from pipeline.load import load_document
from pipeline.resources import data_dir
from tests.resolution_support import DS3, inputs, variant

LLAMA = "llama-3.1-8b-h100-tp1"
DECODE = Batch([(1, 4095)] * 32, decode_threshold=8)


def k_of(inp) -> Kernel:
    return factory.new(inp)


def modes_and_overrides(k: Kernel) -> tuple[tuple[str, str], list[tuple[str, str, str]]]:
    return k.graph_modes(), [(o.requested, o.resolved, o.reason) for o in k.resolved().overrides
                             if o.field == "cudagraph_mode"]


def capture_name(k: Kernel) -> str:
    return k.resolved_pool.cudagraph_mode.lower()


def assert_follows_mode(k: Kernel, unchanged: Kernel) -> None:
    """Capture bytes are the resolved mode's; a decode step's host time is its decode mode's."""
    r = k.resolved_pool
    coef = {o.name for o in k.provenance()}
    assert f"cudagraph_capture_bytes_{capture_name(k)}" in coef
    assert k.fixed_bytes().cuda_graph == r.memory.capture_bytes
    host = k.step_time(DECODE).per_resource[Resource.HOST]
    kernels = laws.to_duration_ns(r.coefficients.host_launch_per_kernel_ns / 1e9
                                  * r.plan.total_kernels)
    replay = r.coefficients.host_replay_graph_per_step_ns
    if r.decode_graph_mode == "PIECEWISE":
        assert host == int(float(replay) * r.plan.piecewise_segments) + kernels
    elif r.decode_graph_mode == "FULL":
        assert host == replay + kernels
    assert (host, k.fixed_bytes().cuda_graph) != (
        unchanged.step_time(DECODE).per_resource[Resource.HOST],
        unchanged.fixed_bytes().cuda_graph)


# -- rule 5: connectors -------------------------------------------------------------------


def _ds3_default_mode(**deployment):
    return variant(inputs(DS3), engine={"cudagraph_mode": ""}, deployment=deployment,
                   cluster={"storage": ("cpu_dram",)})


def test_a_layerwise_connector_forces_piecewise() -> None:
    base = k_of(_ds3_default_mode())
    assert modes_and_overrides(base) == (("FULL", "PIECEWISE"), [])
    k = k_of(_ds3_default_mode(pd_transfer=PDTransfer("MoRIIOConnector")))
    modes, overrides = modes_and_overrides(k)
    assert modes == ("PIECEWISE", "PIECEWISE")
    ((requested, resolved, reason),) = overrides
    assert (requested, resolved) == ("FULL_AND_PIECEWISE", "PIECEWISE")
    assert "MoRIIOConnector" in reason and "piecewise" in reason
    assert_follows_mode(k, base)


def test_nixl_needs_no_piecewise() -> None:
    k = k_of(_ds3_default_mode(pd_transfer=PDTransfer("NixlConnector")))
    assert modes_and_overrides(k) == (("FULL", "PIECEWISE"), [])


@pytest.mark.parametrize(("child", "piecewise"), [("MoRIIOConnector", True),
                                                  ("OffloadingConnector", False)])
def test_a_multi_connector_needs_piecewise_if_any_child_does(child: str, piecewise: bool) -> None:
    k = k_of(_ds3_default_mode(pd_transfer=PDTransfer("MultiConnector"),
                               offload=Offload(tiers=(Tier("cpu_dram", 1 << 30),),
                                               connector=child)))
    modes, overrides = modes_and_overrides(k)
    if piecewise:
        assert modes == ("PIECEWISE", "PIECEWISE")
        assert len(overrides) == 1 and child in overrides[0][2]
    else:
        assert modes == ("FULL", "PIECEWISE") and overrides == []


# -- rule 8: attention-backend support ----------------------------------------------------


def test_full_on_a_backend_below_always_runs_mixed_batches_piecewise() -> None:
    unchanged = k_of(variant(inputs(DS3), engine={"cudagraph_mode": "FULL_AND_PIECEWISE"}))
    k = k_of(variant(inputs(DS3), engine={"cudagraph_mode": "FULL"}))
    modes, overrides = modes_and_overrides(k)
    assert modes == ("FULL", "PIECEWISE")
    ((requested, resolved, reason),) = overrides
    assert (requested, resolved) == ("FULL", "FULL_AND_PIECEWISE")
    assert "FLASHMLA for mla layers" in reason and "UNIFORM_BATCH" in reason
    assert "below ALWAYS" in reason
    assert capture_name(k) == "full_and_piecewise"
    assert k.fixed_bytes() == unchanged.fixed_bytes()
    # FlashAttention 3 (Hopper, GQA) is ALWAYS: FULL stays FULL
    fa3 = k_of(variant(inputs(LLAMA), engine={"cudagraph_mode": "FULL"}))
    assert modes_and_overrides(fa3) == (("FULL", "FULL"), [])
    # a mixed step's host time follows: piecewise under the downgrade, full on FA3
    mixed = Batch([(1, 4095), (64, 0)], decode_threshold=8)  # under the capture ceiling
    r = k.resolved_pool
    assert k.step_time(mixed).per_resource[Resource.HOST] == (
        int(float(r.coefficients.host_replay_graph_per_step_ns) * r.plan.piecewise_segments)
        + laws.to_duration_ns(r.coefficients.host_launch_per_kernel_ns / 1e9
                              * r.plan.total_kernels))


def _on_a100_sxm(inp):
    chip, _ = load_document(Chip, data_dir() / "catalog" / "hardware" / "a100-sxm.yaml")
    chip = replace(chip, name="a100-sxm")
    return replace(variant(inp, cluster={"hardware": "a100-sxm"}), chip=chip)


def test_speculative_decoding_on_a_single_token_backend_captures_decode_piecewise() -> None:
    base = _on_a100_sxm(variant(inputs(LLAMA), engine={"cudagraph_mode": "", "cache_dtype": "fp8"}))
    no_spec = k_of(base)
    assert modes_and_overrides(no_spec) == (("FULL", "PIECEWISE"), [])
    spec = replace(Speculative(), method="ngram", num_spec_tokens=3)
    k = k_of(variant(base, engine={"speculative": spec}))
    modes, overrides = modes_and_overrides(k)
    assert modes == ("PIECEWISE", "PIECEWISE")
    ((requested, resolved, reason),) = overrides
    assert (requested, resolved) == ("FULL_AND_PIECEWISE", "PIECEWISE")
    assert "4 tokens per request" in reason and "FLASHINFER for gqa layers" in reason
    assert "UNIFORM_SINGLE_TOKEN_DECODE" in reason and "below UNIFORM_BATCH" in reason
    assert capture_name(k) == "piecewise"
    # a 16-bit cache runs FlashAttention 2 (UNIFORM_BATCH): speculative decode keeps FULL
    bf16 = k_of(variant(base, engine={"speculative": spec, "cache_dtype": "auto"}))
    assert modes_and_overrides(bf16)[0] == ("FULL", "PIECEWISE")


def test_a_backend_with_no_graph_support_captures_decode_piecewise() -> None:
    """NEVER is declared by no default CUDA backend of the table; amending the table (as a user
    may for an out-of-tree backend) shows the rule and its override chain."""
    inp = variant(inputs(LLAMA), engine={"cudagraph_mode": "FULL"})
    con = db.open_db()
    con.execute("UPDATE attention_cudagraph_support SET support = 'NEVER', backend = 'MY_BACKEND' "
                "WHERE chip_kind = 'hopper' AND kind = 'gqa'")
    k = factory.new(inp, con)
    modes, overrides = modes_and_overrides(k)
    assert modes == ("PIECEWISE", "PIECEWISE")
    assert [(a, b) for a, b, _ in overrides] == [("FULL", "FULL_AND_PIECEWISE"),
                                                  ("FULL_AND_PIECEWISE", "PIECEWISE")]
    assert "MY_BACKEND for gqa layers" in overrides[1][2] and "(NEVER)" in overrides[1][2]
    assert capture_name(k) == "piecewise"
