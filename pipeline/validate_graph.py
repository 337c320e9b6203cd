"""Field checks on a model graph (model.md §12.3) and a model identity (§12.3)."""

from __future__ import annotations

from collections.abc import Mapping

from .documents import Graph, LayerKind, ModelIdentity, Node, Stack
from .errors import Problem
from .validate_common import (
    ATTENTION_KINDS,
    COLLECTIVES,
    DTYPES,
    EMIT_CONDITIONS,
    LATENT_KINDS,
    MODALITIES,
    OPS,
    RECURRENT_KINDS,
    Collector,
    quote,
)

# Keys each op must state as positive integers (model.md §12.3 "req (≥1)").
_REQUIRED_POSITIVE: dict[str, tuple[str, ...]] = {
    "GEMM": ("n", "k"),
    "GroupedGEMM": ("n", "k", "experts", "top_k"),
    "Attention": ("n_q", "n_kv", "d_h"),
    "RecurrentUpdate": ("n_heads", "state_size"),
}
_MAMBA2_REQUIRED = ("n_groups", "conv_kernel", "intermediate_size")

# Keys an op rejects when non-zero (model.md §12.3 forbidden-key table).
_FORBIDDEN: dict[str, tuple[str, ...]] = {
    "GEMM": ("experts", "top_k", "n_q", "n_kv", "state_size"),
    "GroupedGEMM": ("n_q", "state_size"),
    "Attention": ("experts", "state_size"),
    "RecurrentUpdate": ("experts", "n_q"),
    "Elementwise": (),
    **{op: ("n", "k", "experts", "n_q", "n_kv", "state_size") for op in COLLECTIVES},
}

_NON_NEGATIVE: dict[str, tuple[str, ...]] = {
    "GroupedGEMM": ("shared_experts", "shared_intermediate_size", "latent_size"),
    "Attention": ("index_topk", "compress_ratio"),
    "Elementwise": ("bytes_per_token",),
}


def validate_graph(doc: Graph, file: str,
                   lines: Mapping[str, int] | None = None) -> list[Problem]:
    """Every field problem of one model graph; paths relative to the document."""
    c = Collector(file, lines)
    if doc.kind != "ModelGraph":
        c.error("kind", f'must be "ModelGraph", got {quote(doc.kind)}')
    c.required("name", doc.name)
    if doc.modality not in MODALITIES:
        c.error("modality", f"{quote(doc.modality)} is not a recognized modality")
    d = doc.derived_from
    c.required("derived_from.format", d.format,
               "required: a graph must say which dialect it was derived from")
    c.required("derived_from.path", d.path)
    if len(d.sha256) != 64:
        c.error("derived_from.sha256", "must be a 64-character hex digest of the source file, "
                f"got {len(d.sha256)} characters")
    if d.deriver_version < 1:
        c.error("derived_from.deriver_version", "must be at least 1")
    g = doc.global_
    for key in ("hidden_size", "vocab_size"):
        if getattr(g, key) < 1:
            c.error(f"global.{key}", "must be positive")
    if g.weight_dtype not in DTYPES:
        c.error("global.weight_dtype", f"{quote(g.weight_dtype)} is not a recognized dtype")
    _layer_kinds(c, doc.layer_kinds)
    for j, node in enumerate(doc.head):
        validate_node(c, f"head[{j}]", node)
    _stack(c, doc)
    if doc.speculator is not None:
        s = doc.speculator
        c.required("speculator.method", s.method)
        if s.num_spec_tokens < 1:
            c.error("speculator.num_spec_tokens", "must be at least 1; omit the speculator "
                    "block instead of declaring zero drafts")
        if not s.stack.pattern:
            c.error("speculator.stack.pattern", "required: a draft module is its own stack, "
                    "because for an MoE target the draft pass is a second MoE")
        if s.stack.repeat < 1:
            c.error("speculator.stack.repeat", "must be at least 1")
    return c.problems


def _layer_kinds(c: Collector, kinds: tuple[LayerKind, ...]) -> None:
    if not kinds:
        c.error("layer_kinds", "at least one layer kind is required")
    seen: set[str] = set()
    for i, lk in enumerate(kinds):
        at = f"layer_kinds[{i}]"
        if not lk.id:
            c.error(f"{at}.id", "required")
        elif lk.id in seen:
            c.error(f"{at}.id", f"duplicate layer-kind id {quote(lk.id)}")
        seen.add(lk.id)
        if not lk.nodes:
            c.error(f"{at}.nodes", "a layer kind with no nodes prices nothing")
        for j, node in enumerate(lk.nodes):
            validate_node(c, f"{at}.nodes[{j}]", node)
        _edges(c.at(at), lk)


def _edges(c: Collector, lk: LayerKind) -> None:
    n = len(lk.nodes)
    adjacency: dict[int, list[int]] = {v: [] for v in range(n)}
    for k, edge in enumerate(lk.edges):
        at = f"edges[{k}]"
        if len(edge) != 2:
            c.error(at, f"an edge is a [from, to] pair, got {len(edge)} element(s)")
            continue
        f, t = edge
        ok = True
        if not 0 <= f < n:
            c.error(at, f"from-index {f} is out of range for {n} nodes")
            ok = False
        if not 0 <= t < n:
            c.error(at, f"to-index {t} is out of range for {n} nodes")
            ok = False
        if ok and f == t:
            c.error(at, f"self-edge on node {f}")
            ok = False
        if ok:
            adjacency[f].append(t)
    reached = _cycle(adjacency)
    if reached is not None:
        c.error("edges", f"graph is cyclic; a cycle reaches node {reached}")


def _cycle(adjacency: dict[int, list[int]]) -> int | None:
    """The node a back edge reaches in a depth-first walk (nodes in index order), if any."""
    state = dict.fromkeys(adjacency, 0)  # 0 new, 1 on the path, 2 done
    for root in adjacency:
        if state[root]:
            continue
        stack = [(root, iter(adjacency[root]))]
        state[root] = 1
        while stack:
            v, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[v] = 2
                stack.pop()
            elif state[nxt] == 1:
                return nxt
            elif state[nxt] == 0:
                state[nxt] = 1
                stack.append((nxt, iter(adjacency[nxt])))
    return None


def validate_node(c: Collector, at: str, node: Node) -> None:
    """One node's checks (model.md §12.3); ``at`` is its path (``layer_kinds[i].nodes[j]``)."""
    if node.op not in OPS:
        c.error(f"{at}.op", f"{quote(node.op)} is not a recognized primitive")
        return
    collective = node.op in COLLECTIVES
    if node.emit not in EMIT_CONDITIONS:
        c.error(f"{at}.emit", f"{quote(node.emit)} is not a recognized emit condition")
    elif collective and not node.emit:
        c.error(f"{at}.emit", "a collective node must name an emit condition; an "
                f"unconditional {node.op} would be emitted at tp=1")
    elif not collective and node.emit:
        c.warn(at, "a condition on a non-collective node encodes deployment in the model graph")
    for key in _REQUIRED_POSITIVE.get(node.op, ()):
        _positive(c, at, node, key)
    for key in _FORBIDDEN[node.op]:
        if getattr(node, key):
            c.error(f"{at}.{key}", "not priced by this op; remove it")
    for key in _NON_NEGATIVE.get(node.op, ()):
        c.not_negative(f"{at}.{key}", getattr(node, key))
    if node.weight_dtype:
        if node.op not in ("GEMM", "GroupedGEMM"):
            c.error(f"{at}.weight_dtype", "only a GEMM or GroupedGEMM holds parameters")
        elif node.weight_dtype not in DTYPES:
            c.error(f"{at}.weight_dtype", f"{quote(node.weight_dtype)} is not a recognized dtype")
    if node.op == "GroupedGEMM":
        if node.top_k >= 1 and node.experts >= 1 and node.top_k > node.experts:
            c.error(f"{at}.top_k", f"top_k {node.top_k} exceeds experts {node.experts}")
        if node.shared_intermediate_size > 0 and node.shared_experts <= 0:
            c.error(f"{at}.shared_intermediate_size",
                    "stated without shared_experts, so it sizes nothing")
    elif node.op == "Attention":
        _attention(c, at, node)
    elif node.op == "RecurrentUpdate":
        if node.recurrent_kind not in RECURRENT_KINDS:
            c.error(f"{at}.recurrent_kind",
                    f"{quote(node.recurrent_kind)} is not a recognized recurrent kind")
        if node.recurrent_kind == "mamba2":
            for key in _MAMBA2_REQUIRED:
                _positive(c, at, node, key)
        if node.state_dtype and node.state_dtype not in DTYPES:
            c.error(f"{at}.state_dtype", f"{quote(node.state_dtype)} is not a recognized dtype")
    if node.kind != "sparse_mla" or node.op != "Attention":
        for key in ("index_topk", "compress_ratio"):
            if getattr(node, key):
                c.error(f"{at}.{key}", "only a sparse_mla attention node selects tokens; "
                        "remove it")


def _positive(c: Collector, at: str, node: Node, key: str) -> None:
    value = getattr(node, key)
    if value < 1:
        c.error(f"{at}.{key}", f"must be positive for this op, got {value}")


def _attention(c: Collector, at: str, node: Node) -> None:
    if node.kind not in ATTENTION_KINDS:
        c.error(f"{at}.kind", f"{quote(node.kind)} is not a recognized attention kind")
        return
    if node.kind in LATENT_KINDS:
        if node.n_kv != 1:
            c.error(f"{at}.n_kv", f"{node.kind} stores one latent vector per token, so n_kv "
                    f"must be 1, got {node.n_kv}")
    elif node.n_kv >= 1 and node.n_q >= 1 and node.n_kv > node.n_q:
        c.error(f"{at}.n_kv", f"n_kv {node.n_kv} exceeds n_q {node.n_q}")
    if node.kind == "swa" and node.window < 1:
        c.error(f"{at}.window", "sliding-window attention requires a positive window")
    if node.kind == "sparse_mla" and node.index_topk <= 0 and node.compress_ratio <= 0:
        c.error(f"{at}.index_topk", "sparse MLA requires a positive index_topk or compress_ratio")


def _stack(c: Collector, doc: Graph) -> None:
    s: Stack = doc.stack
    total = len(s.prologue) + len(s.pattern) * max(s.repeat, 0) + len(s.epilogue)
    if total < 1:
        c.error("stack", "expands to no layers: state a pattern with a repeat, or a literal "
                "prologue")
    if s.repeat < 0:
        c.error("stack.repeat", "must not be negative")
    elif s.pattern and s.repeat == 0:
        c.error("stack.repeat", "a pattern is stated but never repeated")
    if s.repeat > 0 and not s.pattern:
        c.error("stack.pattern", "a repeat is stated but there is no pattern to repeat")
    declared = {lk.id for lk in doc.layer_kinds}
    for part in ("prologue", "pattern", "epilogue"):
        for i, name in enumerate(getattr(s, part)):
            if name not in declared:
                c.error(f"stack.{part}[{i}]", f"{quote(name)} names no layer kind")
    used = {*s.prologue, *s.pattern, *s.epilogue}
    if doc.speculator is not None:
        spec = doc.speculator.stack
        used |= {*spec.prologue, *spec.pattern, *spec.epilogue}
    for i, lk in enumerate(doc.layer_kinds):
        if lk.id and lk.id not in used:
            c.add("", f"layer kind {quote(lk.id)} is declared but never used by the stack",
                  "warning", where=f"layer_kinds[{i}]")


def validate_identity(doc: ModelIdentity, file: str, lines: Mapping[str, int] | None = None,
                      directory: str = "") -> list[Problem]:
    """A catalog ``model.yaml`` (model.md §12.3); ``directory`` is the model directory's name, if
    known."""
    c = Collector(file, lines)
    if c.required("name", doc.name) and directory and doc.name != directory:
        c.error("name", f"must equal the model directory {quote(directory)}, got "
                f"{quote(doc.name)}")
    if doc.source is None:
        c.error("source", "required: where the checkpoint comes from")
        return c.problems
    for key in ("provider", "repo", "revision"):
        c.required(f"source.{key}", getattr(doc.source, key))
    return c.problems
