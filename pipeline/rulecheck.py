"""The rules-pack layer (model.md §12.6): engine-release checks, in pack order.

Rule problems have an empty path; the location leads the message (``pools[0].engine...``).
They run only when the field layer has no errors and the bundle has a scenario (the caller,
:mod:`pipeline.validate`, decides). Warnings are returned, never raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from .documents import Deployment, Graph, Pool, Scenario
from .errors import Problem
from .rules import PACKS, RulesPack
from .validate_common import go_list, line_of, quote


@dataclass
class RuleContext:
    """What the rules read, and where to point a reader (file + line map per document)."""

    pack: RulesPack
    scenario: Scenario
    deployment: Deployment | None = None
    model: Graph | None = None
    deployment_file: str = ""
    deployment_lines: Mapping[str, int] = field(default_factory=dict)
    model_file: str = ""
    model_lines: Mapping[str, int] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)

    def report(self, rule: str, where: str, message: str, severity: str = "error",
               model: bool = False) -> None:
        file, lines = ((self.model_file, self.model_lines) if model
                       else (self.deployment_file, self.deployment_lines))
        self.problems.append(Problem(file, "", message, severity, rule, line_of(lines, where)))

    def pools(self) -> Iterator[tuple[int, Pool]]:
        return iter(enumerate(self.deployment.pools if self.deployment else ()))

    @property
    def v(self) -> str:
        return self.pack.version


def engine_version_problem(scenario: Scenario, file: str = "",
                           lines: Mapping[str, int] | None = None) -> Problem:
    """The one warning when no pack is registered for ``engine_version``."""
    return Problem(file, "", f"no rules pack for engine version {quote(scenario.engine_version)}; "
                   "field validation passed but no version-specific rule was applied. "
                   f"Registered versions: {go_list(sorted(PACKS))}", "warning",
                   "engine-version-known", line_of(lines or {}, "engine_version"))


def check_rules(ctx: RuleContext) -> list[Problem]:
    """Run every rule of the pack, in pack order; return the problems found."""
    for _rule_id, check in RULES:
        check(ctx)
    return ctx.problems


# ---------------------------------------------------------------------------------------
# Rules. Each takes the context and reports through it.


def _not_accepted(rule: str, keys: tuple[str, ...], sets: Callable[[RulesPack, str], frozenset[str]]
                  ) -> Callable[[RuleContext], None]:
    """An ``is not accepted by engine <v>`` check over engine keys."""
    def check(ctx: RuleContext) -> None:
        for i, pool in ctx.pools():
            for key in keys:
                value = getattr(pool.engine, key)
                if value and value not in sets(ctx.pack, key):
                    where = f"pools[{i}].engine.{key}"
                    ctx.report(rule, where, f"{where}: {quote(value)} is not accepted by engine "
                               f"{ctx.v}")
    return check


_ENUM_SETS = {
    "cudagraph_mode": lambda p: p.cudagraph_modes,
    "cache_dtype": lambda p: p.cache_dtypes,
    "mamba_cache_dtype": lambda p: p.cache_dtypes,
    "mamba_ssm_cache_dtype": lambda p: p.cache_dtypes,
    "mamba_cache_mode": lambda p: p.mamba_cache_modes,
    "scheduling_policy": lambda p: p.scheduler_policies,
}


def _speculative_method(ctx: RuleContext) -> None:
    rule = "speculative-method-known"
    for i, pool in ctx.pools():
        spec = pool.engine.speculative
        if spec is not None and spec.method not in ctx.pack.speculative_methods:
            where = f"pools[{i}].engine.speculative.method"
            ctx.report(rule, where, f"{where}: {quote(spec.method)} is not accepted by engine "
                       f"{ctx.v}")
    if ctx.model is not None and ctx.model.speculator is not None:
        method = ctx.model.speculator.method
        if method not in ctx.pack.speculative_methods:
            ctx.report(rule, "speculator.method", f"model.speculator.method: {quote(method)} is "
                       f"not accepted by engine {ctx.v}", model=True)


def _dcp_comm_backend(ctx: RuleContext) -> None:
    for i, pool in ctx.pools():
        value = pool.engine.dcp_comm_backend
        if value and value not in ctx.pack.dcp_comm_backends:
            where = f"pools[{i}].engine.dcp_comm_backend"
            ctx.report("dcp-comm-backend-known", where, f"{where} {quote(value)} is not one "
                       f"engine {ctx.v} accepts ({', '.join(ctx.pack.dcp_comm_backends)})")


def _recurrent(model: Graph) -> bool:
    """Any layer-kind node states a recurrent kind (head nodes are not scanned)."""
    return any(n.recurrent_kind for lk in model.layer_kinds for n in lk.nodes)


def _experts(model: Graph) -> int:
    return max((n.experts for lk in model.layer_kinds for n in lk.nodes), default=0)


def _interleave_fits_block(ctx: RuleContext) -> None:
    dep, model = ctx.deployment, ctx.model
    if dep is None or dep.pd_transfer is not None or dep.offload is not None:
        return
    if model is None or _recurrent(model):
        return
    for i, pool in ctx.pools():
        e, dcp = pool.engine, pool.parallel.dcp
        s, b = e.cp_kv_cache_interleave_size, e.block_size
        if dcp > 1 and s >= 1 and b >= 1 and b % s:
            ctx.report("cp-kv-cache-interleave-fits-block", f"pools[{i}].engine",
                       f"pools[{i}].engine: block_size {b} must be at least, and divisible by, "
                       f"cp_kv_cache_interleave_size {s} when dcp is {dcp}; engine {ctx.v} "
                       "refuses it at startup")


def _pcp_excludes_dp(ctx: RuleContext) -> None:
    for i, pool in ctx.pools():
        p = pool.parallel
        if p.pcp > 1 and p.dp > 1:
            ctx.report("pcp-excludes-data-parallelism", f"pools[{i}].parallel",
                       f"pools[{i}]: pcp {p.pcp} with dp {p.dp}; engine {ctx.v} refuses "
                       "prefill-context parallelism combined with data parallelism")


def _eplb_pools(ctx: RuleContext, eplb_on: bool) -> Iterator[tuple[int, Pool, int, int]]:
    """Pools with EP width >= 2 whose EPLB state is ``eplb_on``: (i, pool, E, ep)."""
    if ctx.model is None:
        return
    experts = _experts(ctx.model)
    if experts <= 0:
        return
    for i, pool in ctx.pools():
        eplb = pool.engine.eplb
        ep = pool.parallel.expert_parallel_width()
        if (eplb is not None and eplb.enable_eplb) == eplb_on and ep >= 2:
            yield i, pool, experts, ep


def _expert_divisibility(ctx: RuleContext) -> None:
    for i, pool, experts, ep in _eplb_pools(ctx, eplb_on=True):
        r = pool.engine.eplb.num_redundant_experts if pool.engine.eplb else 0
        phys = experts + r
        if phys % ep:
            need = (ep - phys % ep) % ep
            ctx.report("expert-divisibility-under-eplb", f"pools[{i}].engine.eplb",
                       f"pools[{i}]: {experts} experts plus {r} redundant is {phys}, which does "
                       f"not divide expert-parallel width {ep}; {need} more redundant experts "
                       "would")


def _expert_imbalance(ctx: RuleContext) -> None:
    rule = "expert-imbalance-without-eplb"
    for i, _pool, experts, ep in _eplb_pools(ctx, eplb_on=False):
        if experts % ep == 0:
            continue
        base, where = experts // ep, f"pools[{i}].parallel"
        if base == 0:
            ctx.report(rule, where, f"pools[{i}]: expert-parallel width {ep} exceeds the "
                       f"model's {experts} experts, leaving ranks with none")
        else:
            ctx.report(rule, where, f"pools[{i}]: {experts} experts over width {ep} leaves "
                       f"{experts % ep} ranks with {base + 1} experts and the rest with {base}, "
                       f"a {(base + 1) / base:.2f}x static imbalance the estimate must carry",
                       "warning")


def _custom_allreduce(ctx: RuleContext) -> None:
    rule, g = "custom-allreduce-reachable", ctx.scenario.cluster.gpus_per_node
    for i, pool in ctx.pools():
        if pool.engine.allreduce_backend != "custom":
            continue
        tp, where = pool.parallel.tp, f"pools[{i}].engine.allreduce_backend"
        if not ctx.pack.custom_allreduce_supports_width(tp):
            ctx.report(rule, where, f"pools[{i}]: tp {tp} is not a supported world size for the "
                       "custom all-reduce, so the engine will fall back to NCCL and the cost "
                       "moves from SMs to the NIC", "warning")
        if g > 0 and tp > g:
            ctx.report(rule, where, f"pools[{i}]: tp {tp} spans more than the {g} GPUs in a "
                       "node, so the custom all-reduce needs multi-node NVLink on every rank or "
                       "it falls back to NCCL", "warning")


def _offload_spec(ctx: RuleContext) -> None:
    off = ctx.deployment.offload if ctx.deployment else None
    if off is not None and off.spec and off.spec not in ctx.pack.offload_specs:
        ctx.report("offload-spec-known", "offload.spec", f"offload.spec: {quote(off.spec)} is not "
                   f"a registered spec in engine {ctx.v}")


def _quantization(ctx: RuleContext) -> None:
    for i, pool in ctx.pools():
        q = pool.engine.quantization
        if q and q not in ctx.pack.quantizations:
            where = f"pools[{i}].engine.quantization"
            ctx.report("quantization-known", where, f"{where}: {quote(q)} is not an in-tree "
                       f"method of engine {ctx.v}; if it is an out-of-tree method this is "
                       "expected, otherwise check the spelling. In-tree methods are "
                       f"{go_list(sorted(ctx.pack.quantizations))}", "warning")


def _connector(ctx: RuleContext) -> None:
    dep = ctx.deployment
    if dep is None:
        return
    stated = (("offload.connector", dep.offload.connector if dep.offload else ""),
              ("pd_transfer.connector", dep.pd_transfer.connector if dep.pd_transfer else ""))
    for where, value in stated:
        if value and value not in ctx.pack.connectors:
            ctx.report("connector-known", where, f"{where}: {quote(value)} is not a connector "
                       f"registered in engine {ctx.v}; if it is an out-of-tree connector this "
                       "is expected, otherwise check the spelling. Registered connectors are "
                       f"{go_list(sorted(ctx.pack.connectors))}", "warning")


def _eviction_policy(ctx: RuleContext) -> None:
    off = ctx.deployment.offload if ctx.deployment else None
    if off is not None and off.eviction_policy and off.eviction_policy not in \
            ctx.pack.eviction_policies:
        ctx.report("eviction-policy-known", "offload.eviction_policy",
                   f"offload.eviction_policy: {quote(off.eviction_policy)} is not an in-tree "
                   f"policy of engine {ctx.v}; if it is an out-of-tree policy this is expected, "
                   "otherwise check the spelling. In-tree policies are "
                   f"{go_list(sorted(ctx.pack.eviction_policies))}", "warning")


def _mamba_cache_mode(ctx: RuleContext) -> None:
    if ctx.model is None:
        return
    recurrent, rule = _recurrent(ctx.model), "mamba-cache-mode-matches-model"
    for i, pool in ctx.pools():
        mode = pool.engine.mamba_cache_mode
        if mode and not recurrent:
            ctx.report(rule, f"pools[{i}].engine.mamba_cache_mode",
                       f"pools[{i}].engine.mamba_cache_mode is set but the model has no "
                       "recurrent layer, so it has no effect", "warning")
        elif not mode and recurrent:
            ctx.report(rule, f"pools[{i}].engine", f"pools[{i}].engine: the model has "
                       "recurrent layers but no mamba_cache_mode is stated, so whether their "
                       "state is fixed or context-proportional is unresolved", "warning")


def _cascade_opt_in(ctx: RuleContext) -> None:
    for i, pool in ctx.pools():
        e = pool.engine
        if e.disable_cascade_attn is False and e.speculative is not None \
                and e.async_scheduling is None:
            ctx.report("cascade-attention-is-opt-in", f"pools[{i}].engine.disable_cascade_attn",
                       f"pools[{i}]: cascade attention is requested alongside speculative "
                       "decoding; with async scheduling resolved on, the engine disables "
                       "cascade regardless", "warning")


def _dbo_thresholds(ctx: RuleContext) -> None:
    for i, pool in ctx.pools():
        dbo = pool.engine.dbo
        if dbo is not None and dbo.enable_dbo and not dbo.dbo_decode_token_threshold \
                and not dbo.dbo_prefill_token_threshold:
            where = f"pools[{i}].engine.dbo"
            ctx.report("dbo-thresholds-stated-when-enabled", where,
                       f"{where}: enabled with no thresholds stated; engine {ctx.v} defaults to "
                       f"{ctx.pack.default_dbo_decode_threshold} for a uniform-decode batch and "
                       f"{ctx.pack.default_dbo_prefill_threshold} otherwise", "warning")


def _sp_moe(ctx: RuleContext) -> None:
    for i, pool in ctx.pools():
        p, backend = pool.parallel, pool.engine.all2all_backend
        if backend and ctx.pack.sequence_parallel_moe(backend, p.enable_expert_parallel,
                                                      p.tp, p.dp):
            ctx.report("sequence-parallel-moe-implied", f"pools[{i}].engine.all2all_backend",
                       f"pools[{i}]: engine {ctx.v} makes the MoE input sequence-parallel here "
                       f"(backend {quote(backend)}, tp {p.tp}, dp {p.dp}), so the model graph "
                       "must emit a reduce-scatter and all-gather pair rather than an "
                       "all-reduce", "warning")


# The pack, in order: (rule id, check).
RULES: tuple[tuple[str, Callable[[RuleContext], None]], ...] = (
    ("all2all-backend-known",
     _not_accepted("all2all-backend-known", ("all2all_backend",), lambda p, _: p.all2all_backends)),
    ("allreduce-backend-known",
     _not_accepted("allreduce-backend-known", ("allreduce_backend",),
                   lambda p, _: p.allreduce_backends)),
    ("enum-values-known",
     _not_accepted("enum-values-known", tuple(_ENUM_SETS), lambda p, k: _ENUM_SETS[k](p))),
    ("speculative-method-known", _speculative_method),
    ("dcp-comm-backend-known", _dcp_comm_backend),
    ("cp-kv-cache-interleave-fits-block", _interleave_fits_block),
    ("pcp-excludes-data-parallelism", _pcp_excludes_dp),
    ("expert-divisibility-under-eplb", _expert_divisibility),
    ("expert-imbalance-without-eplb", _expert_imbalance),
    ("custom-allreduce-reachable", _custom_allreduce),
    ("offload-spec-known", _offload_spec),
    ("quantization-known", _quantization),
    ("connector-known", _connector),
    ("eviction-policy-known", _eviction_policy),
    ("mamba-cache-mode-matches-model", _mamba_cache_mode),
    ("cascade-attention-is-opt-in", _cascade_opt_in),
    ("dbo-thresholds-stated-when-enabled", _dbo_thresholds),
    ("sequence-parallel-moe-implied", _sp_moe),
)
