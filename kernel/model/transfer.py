"""KV transfers: offload tiers and P/D handoffs (model.md §6.2, §8)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from . import laws
from .resolved import ALL2ALL, GROUP_EXPERT, ResolvedPool
from .types import MAX_DURATION_NS, Direction, Placement

__all__ = ["Link", "PDTransferDemand", "pd_transfer_demand", "pd_transfer_time", "tier_time"]


def tier_time(r: ResolvedPool, tier: str, direction: Direction, nbytes: int, depth: int) -> int:
    """A copy to or from an offload tier (model.md §6.2 TierTime); unknown tier → MaxInt64."""
    dev = r.tiers.get(tier)
    if dev is None:
        return MAX_DURATION_NS
    rate = dev.write_bps if Direction(direction) is Direction.TO_TIER else dev.read_bps
    host = r.coefficients.host_link_bps
    if host > 0 and rate > host:
        rate = host
    if depth > 1:
        rate /= depth
    return laws.to_duration_ns(laws.floor_and_rate(float(nbytes), rate, dev.latency_s))


@dataclass(frozen=True)
class Link:
    """One directional port a handoff crosses: ``{medium}:{tx|rx}:rack{R}:node{N}``."""

    link_id: str
    rate_bps: float  # full-duplex, one direction, bytes/s


@dataclass(frozen=True)
class PDTransferDemand:
    """A P/D handoff as payload, floor and the links it crosses (model.md §8.2)."""

    payload_bytes: float
    floor_s: float
    links: tuple[Link, ...] = ()

    def alone_time(self) -> int:
        """ns with no competing handoff: FloorAndRate at the slowest link (== PDTransferTime)."""
        if not self.links and self.payload_bytes <= 0:
            return 0
        rate = min((link.rate_bps for link in self.links), default=math.inf)
        return laws.to_duration_ns(laws.floor_and_rate(self.payload_bytes, rate, self.floor_s))


def _medium(r: ResolvedPool, src: Placement, dst: Placement) -> tuple[str, float]:
    nvlink = r.coefficients.nvlink_bps
    if src.node == dst.node or (r.layout.rack_is_one_domain and src.rack == dst.rack):
        return "nvlink", nvlink
    return "nic", r.coefficients.nic_bps  # nic_bps is already nvlink when no fabric (model.md §9.9)


def pd_transfer_demand(r: ResolvedPool, tokens: int, src: Placement,
                       dst: Placement) -> PDTransferDemand:
    """Payload tokens·kvBytesPerToken (legacy; never divided by DCP), the (all2all, expert)
    floor, and (source tx, destination rx) links (model.md §8.2)."""
    if tokens <= 0:
        return PDTransferDemand(0.0, 0.0, ())
    medium, rate = _medium(r, src, dst)
    key = r.collectives.get((ALL2ALL, GROUP_EXPERT))
    floor_s = laws.duration_seconds(key.floor_ns) if key is not None else 0.0
    links = (Link(f"{medium}:tx:rack{src.rack}:node{src.node}", rate),
             Link(f"{medium}:rx:rack{dst.rack}:node{dst.node}", rate))
    return PDTransferDemand(tokens * r.kv_bytes_per_token, floor_s, links)


def pd_transfer_time(r: ResolvedPool, tokens: int, src: Placement, dst: Placement) -> int:
    """model.md §8 PDTransferTime == PDTransferDemand(...).alone_time() (model.md §14.5 item 6)."""
    return pd_transfer_demand(r, tokens, src, dst).alone_time()
