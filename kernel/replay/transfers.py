"""P/D KV handoffs in flight, sharing their links (issue 29: "links shared among concurrent
transfers").

Each handoff is the kernel's :class:`kernel.PDTransferDemand` (payload, floor, the directional
links it crosses). While several are in flight, every link's rate is split equally among the
handoffs crossing it, and a handoff moves at the slowest of its shares (a fluid model,
re-solved whenever a handoff starts or ends). A handoff ends at max(start + floor, the moment
its last byte arrives): alone, that is the kernel's ``alone_time()`` (FloorAndRate at the
slowest link), and a handoff that never shared a link gets exactly that.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..model.laws import to_duration_ns
from ..model.transfer import PDTransferDemand

__all__ = ["LinkShare"]


@dataclass
class _Flight:
    start: int
    demand: PDTransferDemand
    remaining: float  # bytes
    floor_ns: int
    alone_ns: int
    shared: bool = False
    rate: float = 0.0  # bytes/ns
    links: tuple[str, ...] = field(default=())


class LinkShare:
    """Handoffs in flight; ``schedule(t, token)`` asks the caller for a wake-up at ``t``."""

    def __init__(self, schedule: Callable[[int, int], None],
                 arrived: Callable[[int, int], None]):
        self._schedule = schedule  # (time_ns, generation token) -> the caller's timer
        self._arrived = arrived  # (handoff id, time_ns): the handoff is complete
        self._flights: dict[int, _Flight] = {}
        self._now = 0
        self._generation = 0
        self.peak_in_flight = 0

    def start(self, handoff: int, t: int, demand: PDTransferDemand) -> None:
        self._advance(t)
        alone = demand.alone_time()
        floor_ns = to_duration_ns(demand.floor_s)
        links = tuple(link.link_id for link in demand.links)
        if demand.payload_bytes <= 0 or not links:
            self._arrived(handoff, t + alone)
            return
        self._flights[handoff] = _Flight(t, demand, float(demand.payload_bytes), floor_ns,
                                         alone, links=links)
        self.peak_in_flight = max(self.peak_in_flight, len(self._flights))
        self._resolve()

    def wake(self, token: int, t: int) -> None:
        if token != self._generation:
            return  # a wake-up planned before a later change
        self._advance(t)
        self._resolve()

    def _advance(self, t: int) -> None:
        dt = t - self._now
        if dt > 0:
            for f in self._flights.values():
                f.remaining = max(f.remaining - f.rate * dt, 0.0)
        self._now = max(self._now, t)
        finished = []
        for h, f in self._flights.items():
            if not f.shared:
                if f.start + f.alone_ns <= t:
                    finished.append((h, f.start + f.alone_ns))
            elif f.remaining <= 1e-9 * max(f.demand.payload_bytes, 1.0):
                finished.append((h, max(f.start + f.floor_ns, t)))
        for h, end in finished:
            del self._flights[h]
            self._arrived(h, end)

    def _resolve(self) -> None:
        users: dict[str, int] = {}
        for f in self._flights.values():
            for link in f.links:
                users[link] = users.get(link, 0) + 1
        next_done = math.inf
        for f in self._flights.values():
            rates = []
            for link_obj in f.demand.links:
                n = users[link_obj.link_id]
                if n > 1:
                    f.shared = True
                rates.append(link_obj.rate_bps / n / 1e9)
            f.rate = min(rates)
            if not f.shared:
                next_done = min(next_done, f.start + f.alone_ns)
            elif f.rate > 0:
                next_done = min(next_done, math.ceil(self._now + f.remaining / f.rate))
        self._generation += 1
        if next_done < math.inf:
            self._schedule(int(math.ceil(next_done)), self._generation)
