"""Parameter count of a derived graph (for checking a derivation against published totals).

GEMM ``n·k``; a routed-expert GroupedGEMM ``experts·3·n·k'`` (gate, up and down per expert,
model.md §9.4, with ``k' = latent_size`` when the experts run in a latent space)
plus its shared experts ``shared·3·n_s·k``; the input embedding ``vocab·hidden`` unless tied.
Norms, biases, routers and the draft module are not counted (each well under 1% of a model).
"""

from __future__ import annotations

from typing import Any


def node_parameters(node: dict[str, Any]) -> int:
    op = node.get("op")
    if op == "GEMM":
        return int(node["n"]) * int(node["k"])
    if op != "GroupedGEMM":
        return 0
    n, k = int(node["n"]), int(node["k"])
    routed_k = int(node.get("latent_size") or k)
    total = int(node["experts"]) * 3 * n * routed_k
    shared = int(node.get("shared_experts") or 0)
    if shared:
        total += shared * 3 * int(node.get("shared_intermediate_size") or n) * k
    return total


def stack_layers(stack: dict[str, Any]) -> list[str]:
    return [*(stack.get("prologue") or []), *(stack.get("pattern") or []) * int(
        stack.get("repeat") or 0), *(stack.get("epilogue") or [])]


def graph_parameters(graph: dict[str, Any]) -> int:
    """Total parameters of the target model (embedding, stack and head; no draft module)."""
    per_kind = {k["id"]: sum(node_parameters(n) for n in k["nodes"])
                for k in graph["layer_kinds"]}
    total = sum(per_kind[kid] for kid in stack_layers(graph["stack"]))
    total += sum(node_parameters(n) for n in graph.get("head") or [])
    g = graph["global"]
    if not g.get("tie_word_embeddings"):
        total += int(g["vocab_size"]) * int(g["hidden_size"])
    return total
