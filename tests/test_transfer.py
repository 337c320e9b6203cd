"""Transfers and host overheads (model.md §6, §8, §14.5).

Also the host goldens 49–51 (admission overhead).
"""

from __future__ import annotations

import dataclasses

import pytest

from kernel.model import host, laws, transfer
from kernel.model.resolved import ResolvedPool
from kernel.model.types import MAX_DURATION_NS, Direction, Placement
from tests.fixtures_pools import ckey, replace, replace_coeffs, tiny_dense, tiny_moe_mla

MIB64 = 64 * 2**20


# --- TierTime: model.md §6.2 worked examples (device read 25,000 MB/s, write 20,000 MB/s, 10 µs,
# host link 32,000 MB/s — the fixture's "cpu" tier) --------------------------------------


@pytest.mark.parametrize(("direction", "nbytes", "depth", "expected"), [
    (Direction.FROM_TIER, MIB64, 1, 2_684_354),
    (Direction.FROM_TIER, MIB64, 4, 10_737_418),
    (Direction.TO_TIER, MIB64, 1, 3_355_443),
    (Direction.FROM_TIER, 0, 1, 10_000),
    (Direction.FROM_TIER, MIB64, 0, 2_684_354),  # depth <= 1: no sharing
])
def test_tier_time_seed_examples(direction: Direction, nbytes: int, depth: int,
                                 expected: int) -> None:
    assert transfer.tier_time(tiny_dense(), "cpu", direction, nbytes, depth) == expected


def test_tier_time_unknown_tier_is_max_duration() -> None:
    """model.md §6.2 / case 143: an unknown tier prices as MaxInt64 ns, above any known tier."""
    r = tiny_dense()
    assert transfer.tier_time(r, "nope", Direction.FROM_TIER, 1, 1) == MAX_DURATION_NS
    assert transfer.tier_time(r, "nope", Direction.FROM_TIER, 1, 1) > \
        transfer.tier_time(r, "s3", Direction.FROM_TIER, 1, 1)


def test_tier_time_host_link_caps_the_rate() -> None:
    """A device faster than the host link is read at the host link rate."""
    r = replace_coeffs(tiny_dense(), host_link_bps=10e9)
    assert transfer.tier_time(r, "cpu", Direction.FROM_TIER, 10**9, 1) == 100_000_000
    r0 = replace_coeffs(tiny_dense(), host_link_bps=0.0)  # no host link: device rate
    assert transfer.tier_time(r0, "cpu", Direction.FROM_TIER, 25 * 10**9, 1) == 10**9


def test_tier_time_zero_rate_is_max() -> None:
    r = tiny_dense()
    dead = {**r.tiers, "dead": dataclasses.replace(r.tiers["cpu"], read_bps=0.0)}
    assert transfer.tier_time(replace(r, tiers=dead), "dead", Direction.FROM_TIER, 1, 1) == \
        MAX_DURATION_NS


# --- PDTransferDemand / PDTransferTime: model.md §8.2 ------------------------------------


def sw_a_pool(one_domain: bool) -> ResolvedPool:
    """Payload 42,467,328 B at 1000 tokens; floor 25 µs; NVLink 450e9; NIC 50e9."""
    r = tiny_dense(kv_bytes_per_token=42_467.328)
    colls = {**r.collectives, ("all2all", "expert"): ckey("all2all", "expert", floor_ns=25_000)}
    return replace(r, collectives=colls,
                   layout=dataclasses.replace(r.layout, rack_is_one_domain=one_domain))


def test_pd_demand_same_rack_nvlink_domain() -> None:
    r = sw_a_pool(True)
    d = transfer.pd_transfer_demand(r, 1000, Placement(3, 0), Placement(5, 0))
    assert d.payload_bytes == pytest.approx(42_467_328, rel=1e-15)
    assert d.floor_s == 25e-6
    assert d.links == (transfer.Link("nvlink:tx:rack0:node3", 450e9),
                       transfer.Link("nvlink:rx:rack0:node5", 450e9))
    assert d.alone_time() == 94_371


def test_pd_demand_across_racks_nic() -> None:
    r = sw_a_pool(True)
    d = transfer.pd_transfer_demand(r, 1000, Placement(3, 0), Placement(9, 1))
    assert [link.link_id for link in d.links] == ["nic:tx:rack0:node3", "nic:rx:rack1:node9"]
    assert d.alone_time() == 849_346


def test_pd_same_rack_without_domain_uses_nic() -> None:
    r = sw_a_pool(False)
    d = transfer.pd_transfer_demand(r, 1000, Placement(3, 0), Placement(5, 0))
    assert d.links[0].link_id == "nic:tx:rack0:node3"
    same_node = transfer.pd_transfer_demand(r, 1000, Placement(3, 0), Placement(3, 0))
    assert same_node.links[0].link_id == "nvlink:tx:rack0:node3"


def test_pd_zero_tokens_is_empty_demand() -> None:
    r = sw_a_pool(True)
    d = transfer.pd_transfer_demand(r, 0, Placement(3, 0), Placement(9, 1))
    assert d == transfer.PDTransferDemand(0.0, 0.0, ())
    assert d.alone_time() == 0
    assert transfer.pd_transfer_time(r, -3, Placement(3, 0), Placement(9, 1)) == 0


def test_pd_payload_never_divided_by_dcp() -> None:
    """model.md §8.1 MLA-D legacy: 10,000 tokens · 70,272 B = 702,720,000 B whatever dcp is;
    over a 50 GB/s NIC 14.05 ms."""
    r = tiny_moe_mla(dcp=8, kv_bytes_per_token=70_272.0)
    d = transfer.pd_transfer_demand(r, 10_000, Placement(0, 0), Placement(1, 1))
    assert d.payload_bytes == 702_720_000
    assert d.alone_time() == laws.to_duration_ns(702_720_000 / 50e9)
    assert d.alone_time() // 10_000 == 1405


@pytest.mark.parametrize("tokens", [-1, 0, 1, 7, 1000, 123_457, 10**7])
@pytest.mark.parametrize(("src", "dst"), [((0, 0), (0, 0)), ((0, 0), (1, 0)),
                                          ((2, 1), (5, 3))])
def test_pd_time_equals_alone_time(tokens: int, src: tuple[int, int],
                                   dst: tuple[int, int]) -> None:
    """model.md §14.5 item 6: PDTransferTime == PDTransferDemand(...).AloneTime() for all inputs,
    and both equal model.md §8's FloorAndRate on the chosen rate."""
    for one_domain in (True, False):
        r = sw_a_pool(one_domain)
        a, b = Placement(*src), Placement(*dst)
        t = transfer.pd_transfer_time(r, tokens, a, b)
        assert t == transfer.pd_transfer_demand(r, tokens, a, b).alone_time()
        if tokens > 0:
            rate = 450e9 if (a.node == b.node or (one_domain and a.rack == b.rack)) else 50e9
            assert t == laws.to_duration_ns(
                laws.floor_and_rate(tokens * 42_467.328, rate, 25e-6))


def test_pd_no_fabric_nic_rate_is_nvlink() -> None:
    r = replace_coeffs(sw_a_pool(False), nic_bps=450e9)  # model.md §9.9: nic = nvlink, no fabric
    d = transfer.pd_transfer_demand(r, 1000, Placement(3, 0), Placement(9, 1))
    assert d.alone_time() == 94_371


# --- host overheads: goldens 49–51 -------------------------------------------------------


@pytest.mark.parametrize("tokens", [1, 1024, 8192])
def test_admission_per_token_golden_49(tokens: int) -> None:
    r = replace_coeffs(tiny_dense(), host_admission_per_token_ns=350,
                       host_admission_per_request_ns=0)
    assert host.admission_overhead(r, tokens) == 350 * tokens


def test_admission_difference_golden_50() -> None:
    r = replace_coeffs(tiny_dense(), host_admission_per_token_ns=350,
                       host_admission_per_request_ns=40_000_000)
    assert host.admission_overhead(r, 8192) - host.admission_overhead(r, 1024) == 2_508_800
    assert host.admission_overhead(r, 1) == 40_000_350


def test_admission_zero_golden_51() -> None:
    r = tiny_dense()
    assert host.admission_overhead(r, 0) == 0
    assert host.admission_overhead(r, -4) == 0


def test_admission_per_token_truncates() -> None:
    r = replace_coeffs(tiny_dense(), host_admission_per_token_ns=333,
                       host_admission_per_request_ns=7)
    assert host.admission_overhead(r, 3) == 7 + int(333.0 * 3)


def test_output_and_completion_overheads() -> None:
    r = tiny_dense()
    assert host.output_token_overhead(r) == 1_000
    assert host.completion_overhead(r) == 2_000
