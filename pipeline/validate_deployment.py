"""Field checks on a deployment, alone (model.md §12.2) and against the cluster (§12.2)."""

from __future__ import annotations

from collections.abc import Mapping

from .documents import Cluster, Deployment, Engine, Offload, Parallelism, Pool
from .errors import Problem
from .validate_common import ROLES, Collector, go_list, quote

# The placement search gives up after this many steps (model.md §12.2 step 6).
SEARCH_BOUND = 1 << 20

_NON_NEGATIVE_ENGINE_KEYS = ("block_size", "max_num_batched_tokens", "max_num_seqs",
                             "max_model_len", "cp_kv_cache_interleave_size")


def validate_deployment(doc: Deployment, file: str, cluster: Cluster | None = None,
                        lines: Mapping[str, int] | None = None) -> list[Problem]:
    """Every field problem of one deployment; with ``cluster``, also the model.md §12.2 checks."""
    c = Collector(file, lines)
    c.kind(doc.kind, "Deployment")
    c.required("name", doc.name)
    if not doc.pools:
        c.error("pools", "at least one pool is required")
    for i, pool in enumerate(doc.pools):
        _pool(c.at(f"pools[{i}]"), pool)
    _roles(c, doc)
    if doc.offload is not None:
        _offload(c.at("offload"), doc.offload)
    if cluster is not None:
        validate_against_cluster(c, doc, cluster)
    return c.problems


def _roles(c: Collector, doc: Deployment) -> None:
    roles = {p.role for p in doc.pools}
    if "prefill" in roles and "decode" not in roles:
        c.error("pools", "a prefill pool with no decode pool has nowhere to send KV")
    if "decode" in roles and "prefill" not in roles:
        c.error("pools", "a decode pool with no prefill pool has no source of KV")
    if "colocated" in roles and roles & {"prefill", "decode"}:
        c.error("pools", "a colocated pool alongside disaggregated pools describes two "
                "deployments")
    if "prefill" in roles and doc.pd_transfer is None:
        c.error("pd_transfer", "required for a disaggregated deployment")


def _pool(c: Collector, pool: Pool) -> None:
    if pool.role not in ROLES:
        c.error("role", f"{quote(pool.role)} is not a recognized role")
    if pool.nodes < 1:
        c.error("nodes", "must be at least 1")
    _parallel(c.at("parallel"), pool.parallel)
    _engine(c.at("engine"), pool.engine)


def _parallel(c: Collector, p: Parallelism) -> None:
    for key in ("tp", "pp", "dp"):
        c.at_least_one(key, getattr(p, key))
    if p.pcp < 0 or p.dcp < 0:
        c.error("", "context-parallel widths must not be negative")
    elif p.tp >= 1:
        dcp = max(p.dcp, 1)
        if p.pcp <= 1 and p.tp % dcp:
            c.error("dcp", "decode-context parallelism reuses the tensor-parallel ranks when "
                    f"prefill-context parallelism is off, so tp {p.tp} must be divisible by "
                    f"dcp {p.dcp}")
        if p.pcp > 1:
            admissible = sorted({1, p.pcp, p.tp * p.pcp})
            if dcp not in admissible:
                c.error("dcp", "with prefill-context parallelism enabled, decode-context "
                        "parallelism must be disabled, span the pcp axis, or span the full "
                        f"tp x pcp axis; got tp {p.tp}, pcp {p.pcp}, dcp {p.dcp}, so the "
                        f"admissible widths are {go_list(admissible)}")
    if p.dp_local < 0:
        c.error("dp_local", f"must not be negative, got {p.dp_local}")
    elif p.dp > 0 and p.dp_local > p.dp:
        c.error("dp_local", f"{p.dp_local} exceeds dp {p.dp}")
    if p.enable_expert_parallel and p.expert_parallel_width() < 2:
        c.warn("", "expert parallelism is enabled but the derived width is 1, so no expert "
               "sharding occurs")


def _engine(c: Collector, e: Engine) -> None:
    for key in _NON_NEGATIVE_ENGINE_KEYS:
        c.not_negative(key, getattr(e, key))
    c.fraction("gpu_memory_utilization", e.gpu_memory_utilization)
    if e.max_cudagraph_capture_size is not None:
        c.not_negative("max_cudagraph_capture_size", e.max_cudagraph_capture_size)
    for i, size in enumerate(e.cudagraph_capture_sizes or ()):
        c.at_least_one(f"cudagraph_capture_sizes[{i}]", size)
    if e.disable_custom_all_reduce is True and e.allreduce_backend == "custom":
        c.error("allreduce_backend", "requests the custom kernel while "
                "disable_custom_all_reduce is true")
    if e.disable_custom_all_reduce is False and e.allreduce_backend == "nccl":
        c.warn("", "allreduce_backend names nccl while disable_custom_all_reduce is false; "
               "the engine would use the custom kernel where reachable")
    if e.dbo is not None and e.dbo.enable_dbo and (
            e.dbo.dbo_decode_token_threshold < 0 or e.dbo.dbo_prefill_token_threshold < 0):
        c.error("dbo", "thresholds must not be negative")
    if e.eplb is not None and e.eplb.enable_eplb:
        c.not_negative("eplb.num_redundant_experts", e.eplb.num_redundant_experts)
    if e.speculative is not None:
        c.required("speculative.method", e.speculative.method)
        if e.speculative.num_spec_tokens < 1:
            c.error("speculative.num_spec_tokens", "must be at least 1; omit the block instead "
                    "of declaring zero drafts")


def _offload(c: Collector, o: Offload) -> None:
    if not o.tiers:
        c.error("tiers", "an offload block with no tiers offloads nowhere")
    seen: set[str] = set()
    for i, tier in enumerate(o.tiers):
        if not tier.tier:
            c.error(f"tiers[{i}].tier", "required: names a catalog device class")
        elif tier.tier in seen:
            c.error(f"tiers[{i}].tier", f"duplicate tier {quote(tier.tier)}")
        seen.add(tier.tier)
        if tier.bytes < 1:
            c.error(f"tiers[{i}].bytes", "must be positive")
    c.not_negative("prefetch_depth", o.prefetch_depth)


# ---------------------------------------------------------------------------------------
# Against the scenario's cluster (model.md §12.2)


def validate_against_cluster(c: Collector, doc: Deployment, cluster: Cluster) -> None:
    """Pools fill the cluster, local replicas fit a node, offload tiers are in the inventory."""
    g = cluster.gpus_per_node
    if doc.pools:
        total = sum(p.nodes for p in doc.pools)
        if total != cluster.nodes:
            c.error("pools", f"pool node counts sum to {total} but the cluster declares "
                    f"{cluster.nodes}")
    for i, pool in enumerate(doc.pools):
        p = pool.parallel
        at = c.at(f"pools[{i}].parallel")
        if p.dp_local > 0 and g > 0 and g % p.dp_local:
            at.error("dp_local", f"{p.dp_local} does not divide gpus_per_node {g}")
        _placement(at, p, pool.nodes, g)
    if doc.offload is not None and cluster.storage:
        for i, tier in enumerate(doc.offload.tiers):
            if tier.tier and tier.tier not in cluster.storage:
                c.error(f"offload.tiers[{i}].tier", f"{quote(tier.tier)} is not in the cluster "
                        f"storage inventory {go_list(cluster.storage)}")


def _placement(c: Collector, p: Parallelism, nodes: int, g: int) -> None:
    """The rank-fit and local-replica placement algorithm of model.md §12.2, in exact integers."""
    if p.tp < 1 or p.pp < 1 or p.dp < 1 or p.pcp < 0 or nodes < 1 or g < 1:
        return
    pcp = max(p.pcp, 1)
    world = p.pp * p.tp * pcp
    ranks = world * p.dp
    axes = f"pp {p.pp} x tp {p.tp} x pcp {pcp}"
    if ranks > nodes * g:
        c.error("", f"needs {ranks} GPUs ({axes} x dp {p.dp}, one per rank) but the pool's "
                f"{nodes} node(s) of {g} GPUs provide {nodes * g}")
        return
    if p.dp_local < 1 or p.dp_local > p.dp:
        return
    last = (p.dp_local - 1) * world
    if last >= g:
        c.error("dp_local", f"{p.dp_local} local replicas of {world} GPUs ({axes}) are placed "
                f"one after another from device 0, so the last would start at device {last}, "
                f"but a node has {g}")
        return
    groups = p.dp // p.dp_local
    max_split = max(1, nodes // groups)
    room = g - last
    verdict = split_fits(world, room, max_split)
    if verdict is None:
        c.warn("", f"placing {p.dp_local} local replicas of {world} GPUs ({axes}) on a "
               f"{g}-GPU node needs more than {SEARCH_BOUND} search steps, so the layout's "
               "fit is unverified")
    elif not verdict:
        c.error("", f"no node count up to the pool's {nodes} lets the engine place "
                f"{p.dp_local} local replicas of {world} GPUs ({axes}) on a {g}-GPU node: "
                f"replica i starts at device i x {world}, so the last leaves {room} GPUs for "
                f"its share of the replica, and every split the pool allows (a divisor of "
                f"{world} over at most {max_split} nodes) leaves a larger share")


def split_fits(world: int, room: int, max_split: int) -> bool | None:
    """Is there a k, ceil(world/room) <= k <= min(max_split, world), dividing world?

    Iterates whichever range is shorter (node counts k, or per-node shares 1..min(room,
    world)); None when the bound is hit before an answer.
    """
    lo = -(-world // room)
    hi = min(max_split, world)
    if lo > hi:
        return False
    shares = min(room, world)
    steps = 0
    if hi - lo + 1 <= shares:
        candidates = range(lo, hi + 1)
        test = lambda k: world % k == 0  # noqa: E731
    else:
        candidates = range(1, shares + 1)
        test = lambda s: world % s == 0 and lo <= world // s <= hi  # noqa: E731
    for x in candidates:
        steps += 1
        if steps > SEARCH_BOUND:
            return None
        if test(x):
            return True
    return False
