"""Fitting a calibration: a robust fit on relative error, by phase class, that never silently
returns the prior (``docs/calibration.md``, decisions CH1–CH8).

For the steps of one phase class, with per-resource terms ``t_j``, running requests ``n``,
the start's offset ``u`` (0 from NoOverlap; ``overlap − no_overlap`` from Overlap) and
measured time ``y``, the model is ``y ≈ Σ m_j·t_j + u + r·n + c`` (:mod:`.law`). Dividing by
``y`` makes every step count by its *relative* error: rows
``A_i = [t_ij / y_i …, n_i·s_n / y_i, s / y_i]`` (``s`` the median measured time and
``s_n = s / median n``, so the slope and the constant are fitted on the multipliers' scale)
and target ``1 − u_i / y_i``. The fit:

* **bounded**: multipliers and the per-request slope ≥ 0, the constant of any sign (solved
  exactly: at most seven unknowns, every active set of the bounded ones is tried); then the
  constant is raised, if need be, so that on every fitted step the sum is at least its
  largest calibrated resource term (the law's floor, CH3), and the rest refitted;
* **robust**: iteratively re-weighted least squares with Huber weights (k = 1.345 times the
  residuals' median absolute deviation), so a few bad measurements do not drag the fit;
* **held** terms: a term below ``min_share`` of the measured time stays at 1 (negligible); a
  term, or the request count, that is the same on every step is the constant under another
  name (term held at 1, slope at 0);
* **tied** terms (CH1): after a first robust fit gives the residual scale σ, the design is
  scaled to unit columns and every eigen-direction that is nearly degenerate (eigenvalue
  below ``min_eigen``) and uncertain (σ/√eigenvalue above ``max_std_error`` in the
  parameters' own scale), or degenerate to rounding, is *weak*. The multipliers a weak
  direction joins are merged into one group with **one shared multiplier** (their summed
  column), and the analysis repeats until no weak direction joins two groups. So terms the
  data cannot tell apart (sm and hbm in single-deployment decode) are fitted together, at
  their combined value, never split by noise and never left at the prior;
* **shrunk** terms: a direction still weak after tying (a group with the constant or the
  slope, which are not multipliers) is shrunk toward the prior (multipliers 1, slope and
  constant 0) by a penalty of strength ``shrink`` in unit-column space: where the data are
  silent the prior decides, where they speak they win (never pinned).

:func:`fit` fits from both starts (Overlap and NoOverlap) and keeps the one with the lower
held-out error (``start="auto"``), scores held-out steps (``holdout``, or k folds), and
flags a calibration whose held-out error is not below its start's (:attr:`FitResult.warning`).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model.calibration_law import (
    PHASES,
    STARTS,
    TERMS,
    Law,
    PhaseCorrection,
    calibrated_ns,
    phase_code,
)
from .accuracy import Summary, relative_error, summarise

__all__ = ["FitOptions", "FitResult", "PhaseFit", "TermFit", "TiedGroup", "cross_validate",
           "fit", "fit_phase"]

N_TERMS = len(TERMS)
PER_REQUEST = "per_request"
CONSTANT = "constant"
PARAMS = (*TERMS, PER_REQUEST, CONSTANT)
_R, _C = N_TERMS, N_TERMS + 1
N_PARAMS = len(PARAMS)
STATUSES = ("fitted", "tied", "shrunk", "held")


@dataclass(frozen=True)
class FitOptions:
    ridge: float = 1e-10  # per-row weight of the pull toward the prior everywhere
    huber_k: float = 1.345
    max_iter: int = 50
    tol: float = 1e-5  # IRLS stops when no parameter moves more than this (unit scale)
    min_share: float = 0.005  # a term below this share of measured time is held at 1
    min_eigen: float = 0.01  # a direction of the unit-column design this degenerate ...
    max_std_error: float = 0.02  # ... and this uncertain is weak: its multipliers are tied
    shrink: float = 0.01  # unit-space pull toward the prior along directions weak after tying
    per_request: bool = True  # fit the per-running-request slope
    tie_alone: bool = True  # a lone multiplier weak with the slope/constant joins its closest
    min_rows: int = 8  # fewer steps than this in a phase: nothing is fitted there
    max_rows: int | None = 100_000  # a phase with more steps is fitted on an evenly strided
    # sample of about this many (seven parameters need no more; every step is still scored)
    fold_max_rows: int | None = 30_000  # the same cap for each cross-validation fold's fit


@dataclass(frozen=True)
class TermFit:
    """One parameter of one phase: its value, how it was decided, and why."""

    name: str
    value: float  # multiplier, or the slope / constant in ns
    status: str  # fitted | tied | shrunk | held
    std_error: float | None = None  # multipliers: absolute; slope and constant: ns
    reason: str = ""


@dataclass(frozen=True)
class TiedGroup:
    """Terms the data could not tell apart, fitted with one shared multiplier."""

    terms: tuple[str, ...]
    multiplier: float
    std_error: float | None = None


@dataclass(frozen=True)
class PhaseFit:
    phase: str
    rows: int
    terms: tuple[TermFit, ...]
    iterations: int = 0
    reason: str = ""  # why nothing was fitted (no rows, too few rows)
    sampled: int | None = None  # steps actually fitted on, when fewer than ``rows``
    tied: tuple[TiedGroup, ...] = ()
    floor_bound: bool = False  # the constant was raised to keep every step above its floor
    weights: np.ndarray | None = field(default=None, repr=False, compare=False)  # robust

    def correction(self) -> PhaseCorrection:
        by = {t.name: t.value for t in self.terms}
        return PhaseCorrection(tuple(float(by[n]) for n in TERMS),  # type: ignore[arg-type]
                               float(by[CONSTANT]), float(by[PER_REQUEST]))


@dataclass
class FitResult:
    law: Law
    phases: dict[str, PhaseFit]
    training: dict[str, Summary] = field(default_factory=dict)  # "all" + per phase
    held_out: dict[str, Summary] = field(default_factory=dict)
    folds: int = 0
    fold_by: str | None = None
    held_out_predictions: np.ndarray | None = None  # out-of-fold calibrated ns per step
    scored_by: str = "none"  # "folds", "holdout" or "none" (training only)
    # per start: the uncalibrated start's and the calibration's errors on the scored steps
    starts: dict[str, dict[str, dict[str, Summary]]] = field(default_factory=dict)
    start_chosen_by: str = "given"  # "held-out MAPE", "training MAPE" or "given"
    # both reference estimates' errors on the scored steps, whichever starts were fitted
    uncalibrated: dict[str, dict[str, Summary]] = field(default_factory=dict)
    improved: bool = True
    warning: str = ""  # set when the calibration does not beat its start


# -- the solver ---------------------------------------------------------------------------------

def _bounded_gram(G: np.ndarray, h: np.ndarray, bounded: np.ndarray) -> np.ndarray:
    """argmin xᵀGx − 2hᵀx with x_i ≥ 0 where ``bounded``, for a small symmetric PSD G, by
    trying every support of the bounded variables (the free ones are always in).

    At the optimum x solves the unconstrained problem on its support and is feasible, so the
    feasible support solution with the lowest objective is the answer (exact, deterministic).
    """
    n = h.size
    try:  # the usual case: the unconstrained optimum is already feasible
        x = np.linalg.solve(G, h)
        if np.all(np.isfinite(x)) and np.all(x[bounded] >= 0):
            return x
    except np.linalg.LinAlgError:
        pass
    free = [i for i in range(n) if not bounded[i]]
    bnd = [i for i in range(n) if bounded[i]]
    best = np.zeros(n)
    best_obj = np.inf
    for k in range(len(bnd) + 1):
        for sub in itertools.combinations(bnd, k):
            idx = sorted([*free, *sub])
            if not idx:
                obj, xs = 0.0, np.zeros(0)
            else:
                Gs = G[np.ix_(idx, idx)]
                try:
                    xs = np.linalg.solve(Gs, h[idx])
                except np.linalg.LinAlgError:
                    xs = np.linalg.lstsq(Gs, h[idx], rcond=None)[0]
                if not np.all(np.isfinite(xs)) or np.any(xs[[i for i, j in enumerate(idx)
                                                                if bounded[j]]] < 0):
                    continue
                obj = float(xs @ Gs @ xs - 2.0 * h[idx] @ xs)
            if obj < best_obj - 1e-15 * max(1.0, abs(best_obj) if np.isfinite(best_obj)
                                             else 1.0):
                best_obj = obj
                best = np.zeros(n)
                best[idx] = xs
    return best


def _huber_weights(r: np.ndarray, k: float) -> np.ndarray:
    # the residual scale from at most ~50k evenly strided residuals (deterministic)
    sample = r[::max(1, r.size // 50_000)]
    scale = 1.4826 * float(np.median(np.abs(sample)))
    if scale <= 1e-6:  # exact to rounding: nothing to be robust against
        return np.ones_like(r)
    delta = k * scale
    a = np.abs(r)
    return np.where(a <= delta, 1.0, delta / np.maximum(a, 1e-300))


def _unit_gram(A: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    Aw = A * np.sqrt(w)[:, None]
    d = np.sqrt(np.maximum((Aw * Aw).sum(axis=0), 1e-300))
    return (Aw / d).T @ (Aw / d), d


def _weak_directions(A: np.ndarray, w: np.ndarray, sigma: float, opts: FitOptions
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(unit-space directions, column scales, unit Gram matrix): eigenvectors of the column-normalised weighted
    Gram matrix that are nearly degenerate (eigenvalue below ``min_eigen``: the columns along
    them explain one another to within 1%) *and* along which the parameters' standard error,
    σ / √eigenvalue mapped back to the parameters' scale, exceeds ``max_std_error`` — or whose
    eigenvalue is zero to rounding."""
    Gn, d = _unit_gram(A, w)
    vals, vecs = np.linalg.eigh(Gn)
    se = np.array([sigma * float(np.linalg.norm(v / d)) / np.sqrt(max(lam, 1e-300))
                   for lam, v in zip(vals, vecs.T, strict=True)])
    weak = ((se > opts.max_std_error) & (vals < opts.min_eigen)) | \
        (vals < 1e-10 * max(float(vals.max()), 1e-300))
    return vecs[:, weak], d, Gn


def _robust_solve(A: np.ndarray, b: np.ndarray, prior: np.ndarray, bounded: np.ndarray,
                  opts: FitOptions, penalty: np.ndarray | None = None,
                  w_init: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Huber-IRLS bounded ridge fit of A·x ≈ b (plus ``penalty``·(x − prior), a matrix on the
    parameters), starting from weights ``w_init`` (default all 1); returns (x, weights,
    iterations)."""
    n = b.size
    w = np.ones(n) if w_init is None else w_init
    x = prior.copy()
    it = 0
    for step in range(1, opts.max_iter + 1):
        it = step
        Aw = A * w[:, None]
        P = opts.ridge * float(w.sum()) * np.eye(A.shape[1])
        if penalty is not None:
            P = P + penalty * float(w.sum()) / max(n, 1)
        G = Aw.T @ A + P
        h = Aw.T @ b + P @ prior
        x_new = _bounded_gram(G, h, bounded)
        r = A @ x_new - b
        w = _huber_weights(r, opts.huber_k)
        done = bool(np.max(np.abs(x_new - x)) < opts.tol)
        x = x_new
        if done:
            break
    return x, w, it


def _sigma(A: np.ndarray, b: np.ndarray, x: np.ndarray, w: np.ndarray) -> float:
    r = A @ x - b
    return max(float(np.sqrt((w * r * r).sum() / max(b.size - A.shape[1], 1))), 1e-6)


def _std_errors(A: np.ndarray, b: np.ndarray, x: np.ndarray, w: np.ndarray,
                penalty: np.ndarray | None) -> np.ndarray:
    """Huber-weighted least-squares standard errors: σ²·diag((AᵀWA + penalty)⁻¹)."""
    sigma2 = _sigma(A, b, x, w) ** 2
    G = (A * w[:, None]).T @ A
    if penalty is not None:
        G = G + penalty * float(w.sum()) / max(b.size, 1)
    d = np.sqrt(np.maximum(np.diag(G), 1e-300))
    Gn = G / np.outer(d, d)  # unit-diagonal: conditioning independent of column scale
    inv = np.linalg.pinv(Gn, rcond=1e-12)
    return np.sqrt(sigma2 * np.maximum(np.diag(inv), 0.0)) / d


def _to_merge(Gn: np.ndarray, weak: np.ndarray, n_groups: int, opts: FitOptions
              ) -> set[int]:
    """The multiplier groups to merge next (empty: none). A weak direction among multipliers
    alone ties the groups it joins; a direction that also joins the slope or the constant
    ties only when it is degenerate to rounding (the data say nothing at all along it):
    its groups, or a lone group with the group whose column it follows most closely. A
    merely weak direction that joins the slope or constant is left to be shrunk."""
    vals = np.linalg.eigvalsh(Gn)
    top = max(float(vals.max()), 1e-300)
    for v in weak.T:
        joined = [i for i in range(n_groups) if abs(v[i]) > 0.2]
        extras = [i for i in range(n_groups, v.size) if abs(v[i]) > 0.2]
        degenerate = float(v @ Gn @ v) < 1e-8 * top
        if len(joined) >= 2 and (not extras or degenerate):
            return set(joined)
        if len(joined) == 1 and degenerate and n_groups > 1 and opts.tie_alone:
            return {joined[0], _closest(Gn, joined[0], n_groups)}
    return set()


def _closest(Gn: np.ndarray, i: int, n_groups: int) -> int:
    """The other multiplier group whose (weighted, unit) column is most aligned with i's."""
    row = np.abs(Gn[i, :n_groups]).copy()
    row[i] = -np.inf
    return int(np.argmax(row))


def _tolerance(G: np.ndarray, j: int, others: list[int]) -> float:
    """1 − uncentered R² of column j's regression on the ``others``, from the design's Gram
    matrix ``G`` (one pass over the rows, made once)."""
    gjj = float(G[j, j])
    if gjj <= 0:
        return 0.0
    if not others:
        return 1.0
    g = G[others, j]
    coef = np.linalg.lstsq(G[np.ix_(others, others)], g, rcond=None)[0]
    return max(gjj - float(g @ coef), 0.0) / gjj


# -- one phase ----------------------------------------------------------------------------------

def _held(phase: str, n: int, why: str) -> PhaseFit:
    return PhaseFit(phase, n, tuple(
        [TermFit(t, 1.0, "held", None, why) for t in TERMS]
        + [TermFit(PER_REQUEST, 0.0, "held", None, why),
           TermFit(CONSTANT, 0.0, "held", None, why)]), 0, why)


def fit_phase(phase: str, terms: np.ndarray, measured: np.ndarray,
              requests: np.ndarray | None = None, offset: np.ndarray | None = None,
              opts: FitOptions | None = None, w_init: np.ndarray | None = None) -> PhaseFit:
    """Fit one phase class: ``terms`` [n, 5] per-resource ns (TERMS order), ``measured`` [n]
    ns (> 0), ``requests`` [n] running requests per step, ``offset`` [n] the start's offset
    (0 from NoOverlap, ``overlap − no_overlap`` from Overlap). ``w_init``: robust weights to
    start from (e.g. a fit on more of the data)."""
    opts = opts or FitOptions()
    n = int(measured.size)
    req = np.zeros(n) if requests is None else np.asarray(requests, np.float64)
    off = np.zeros(n) if offset is None else np.asarray(offset, np.float64)
    if opts.max_rows and n > opts.max_rows:
        stride = -(-n // opts.max_rows)
        sub = fit_phase(phase, terms[::stride], measured[::stride], req[::stride],
                        off[::stride], opts, None if w_init is None else w_init[::stride])
        w_full = np.ones(n)
        if sub.weights is not None:
            w_full[::stride] = sub.weights
        return dataclasses.replace(sub, rows=n, sampled=int(sub.rows), weights=w_full)
    if n < max(opts.min_rows, 1):
        return _held(phase, n, "no steps of this phase" if n == 0
                     else f"only {n} step(s) (< {opts.min_rows})")
    y = measured.astype(np.float64)
    T = terms.astype(np.float64)
    scale = float(np.median(y))
    req_scale = scale / max(float(np.median(req)), 1.0)
    A = np.empty((n, N_PARAMS))
    A[:, :N_TERMS] = T / y[:, None]
    A[:, _R] = req * req_scale / y
    A[:, _C] = scale / y
    to_ns = np.ones(N_PARAMS)
    to_ns[_R], to_ns[_C] = req_scale, scale
    prior = np.array([1.0] * N_TERMS + [0.0, 0.0])
    b0 = 1.0 - off / y
    share = T.sum(axis=0) / float(y.sum())
    held: dict[int, str] = {}
    for j, name in enumerate(TERMS):
        if share[j] < opts.min_share:
            held[j] = (f"negligible: {name} is {share[j]:.2%} of the measured time "
                       f"(< {opts.min_share:.1%})")
    gram = A.T @ A
    for j in range(N_TERMS):  # the same time on every step: the constant under another name
        if j not in held and _tolerance(gram, j, [_C]) < 1e-9:
            held[j] = (f"a fixed time per step in this phase: the constant covers it "
                       f"({TERMS[j]} held at 1)")
    if not opts.per_request:
        held[_R] = "the per-request slope is switched off (FitOptions.per_request)"
    elif _tolerance(gram, _R, [_C]) < 1e-9:
        held[_R] = ("every step has the same number of requests: the constant covers it "
                    "(slope held at 0)")
    # columns of the reduced design: groups of multipliers (shared multiplier), then the
    # slope (unless held) and the constant
    groups: list[list[int]] = [[j] for j in range(N_TERMS) if j not in held]
    extras = [j for j in (_R, _C) if j not in held]
    b = b0 - (A[:, sorted(held)] @ prior[sorted(held)] if held else 0.0)
    if not groups and not extras:
        return _held(phase, n, "every term is held: nothing to fit")

    def design(gs: list[list[int]]) -> np.ndarray:
        cols = [A[:, g].sum(axis=1) for g in gs] + [A[:, j] for j in extras]
        return np.column_stack(cols)

    def bounds(gs: list[list[int]]) -> np.ndarray:
        return np.array([True] * len(gs) + [j != _C for j in extras])

    def gprior(gs: list[list[int]]) -> np.ndarray:
        return np.array([1.0] * len(gs) + [0.0] * len(extras))

    # a first robust fit gives the steps' weights; ties are then found by weighted least
    # squares at those weights (one solve per merge), and the final fit is robust again
    D = design(groups)
    x0, w0, iters = _robust_solve(D, b, gprior(groups), bounds(groups), opts, None, w_init)
    w = w0
    fixed = dataclasses.replace(opts, max_iter=1)
    while True:  # tie the multipliers the data cannot tell apart, one merge at a time
        weak, dscale, gn = _weak_directions(D, w0, _sigma(D, b, x0, w0), opts)
        merge = _to_merge(gn, weak, len(groups), opts)
        if not merge:
            break
        first = min(merge)
        groups = [sorted(itertools.chain.from_iterable(groups[i] for i in sorted(merge)))
                  if i == first else g for i, g in enumerate(groups) if i == first or
                  i not in merge]
        D = design(groups)
        x0, _, _ = _robust_solve(D, b, gprior(groups), bounds(groups), fixed, None, w0)
    # directions still weak (a group with the slope or the constant): shrink, never pin
    penalty = None
    shrunk: set[int] = set()
    merged = any(len(g) > 1 for g in groups)
    if weak.size:
        U = weak * dscale[:, None]  # the weak unit-space directions, on the parameters
        penalty = opts.shrink * (U @ U.T)
        for v in weak.T:
            shrunk.update(i for i in range(v.size) if abs(v[i]) > 0.2)
    if weak.size or merged:
        x0, w, it = _robust_solve(D, b, gprior(groups), bounds(groups), opts, penalty, w0)
        iters += it
    # the floor: on every fitted step the sum must reach the largest calibrated term
    x = x0
    floor_bound = False
    if _C in extras:
        ci = len(groups) + extras.index(_C)
        full = _expand(x, groups, extras, prior)
        need = _constant_floor(A, b0, full)
        if x[ci] < need:
            floor_bound = True
            keep = [i for i in range(D.shape[1]) if i != ci]
            bk = b - D[:, ci] * need
            pk = None if penalty is None else penalty[np.ix_(keep, keep)]
            xk, w, it = _robust_solve(D[:, keep], bk, gprior(groups)[keep],
                                      bounds(groups)[keep], opts, pk, w)
            iters += it
            x = np.empty(D.shape[1])
            x[keep] = xk
            x[ci] = need
            full = _expand(x, groups, extras, prior)
            x[ci] = max(need, _constant_floor(A, b0, full))
    se_red = _std_errors(D, b, x, w, penalty)
    full = _expand(x, groups, extras, prior)
    se = np.full(N_PARAMS, np.nan)
    for gi, g in enumerate(groups):
        se[g] = se_red[gi]
    for ei, j in enumerate(extras):
        se[j] = se_red[len(groups) + ei]
    tied_groups = [g for g in groups if len(g) > 1]
    shrunk_params: set[int] = set()
    for i in shrunk:
        shrunk_params.update(groups[i] if i < len(groups) else [extras[i - len(groups)]])
    out = []
    for j, name in enumerate(PARAMS):
        value = float(full[j]) * to_ns[j]
        s = None if j in held or not np.isfinite(se[j]) else float(se[j]) * to_ns[j]
        mates = next((t for t in tied_groups if j in t), None)
        if j in held:
            status, reason = "held", held[j]
        elif mates is not None:
            others = ", ".join(TERMS[k] for k in mates if k != j)
            status = "tied"
            reason = (f"not identifiable apart from {others}: they share one multiplier, "
                      f"fitted to x{full[j]:.6g} (their combined value)")
            if j in shrunk_params:
                reason += "; that group is also shrunk toward the prior where the data are silent"
        elif j in shrunk_params:
            status = "shrunk"
            reason = ("only partly identifiable (its direction of the design is weak): fitted "
                      "with a pull toward the prior (multipliers 1, slope and constant 0)")
        else:
            status, reason = "fitted", ""
        if j == _C and floor_bound:
            reason = (reason + "; " if reason else "") + (
                "raised to the floor bound: on every fitted step the calibrated sum reaches "
                "the largest calibrated resource term")
        out.append(TermFit(name, value, status, s, reason))
    ties = tuple(TiedGroup(tuple(TERMS[k] for k in g), float(full[g[0]]),
                           None if not np.isfinite(se[g[0]]) else float(se[g[0]]))
                 for g in tied_groups)
    return PhaseFit(phase, n, tuple(out), iters, tied=ties, floor_bound=floor_bound,
                    weights=w)


def _expand(x: np.ndarray, groups: list[list[int]], extras: list[int], prior: np.ndarray
            ) -> np.ndarray:
    """The seven parameters (unit scale) from the reduced design's solution."""
    full = prior.copy()
    for gi, g in enumerate(groups):
        full[g] = x[gi]
    for ei, j in enumerate(extras):
        full[j] = x[len(groups) + ei]
    return full


def _constant_floor(A: np.ndarray, b0: np.ndarray, full: np.ndarray) -> float:
    """The smallest constant (unit scale) for which every step's sum reaches its largest
    calibrated term: max_i (max_j m_j·t_ij − (Σ m_j t_ij + u_i + r·n_i)), in the relative
    rows (everything divided by y_i, the constant's column is s / y_i)."""
    m = full[:N_TERMS]
    scaled = A[:, :N_TERMS] * m  # m_j t_ij / y_i
    offset = 1.0 - b0  # u_i / y_i
    total = scaled.sum(axis=1) + offset + A[:, _R] * full[_R]
    gap = scaled.max(axis=1) - total  # relative to y_i; the constant adds c·s/y_i
    return float(np.max(gap / A[:, _C])) if gap.size else 0.0


# -- all phases ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Data:
    T: np.ndarray  # [n, 5] int64
    code: np.ndarray
    y: np.ndarray
    pre: np.ndarray
    dec: np.ndarray
    overlap: np.ndarray | None

    @property
    def requests(self) -> np.ndarray:
        return (self.pre + self.dec).astype(np.float64)

    def offset(self, start: str) -> np.ndarray:
        if start == "no_overlap":
            return np.zeros(self.y.size)
        if self.overlap is None:
            raise ValueError("fitting from the Overlap start needs an overlap_ns column")
        return self.overlap.astype(np.float64) - self.T.astype(np.float64).sum(axis=1)

    def take(self, sel: np.ndarray) -> _Data:
        return _Data(self.T[sel], self.code[sel], self.y[sel], self.pre[sel], self.dec[sel],
                     None if self.overlap is None else self.overlap[sel])

    def start_estimate(self, start: str) -> np.ndarray:
        if start == "overlap":
            assert self.overlap is not None
            return self.overlap
        return self.T.sum(axis=1)


def _arrays(priced: Any, measured: str) -> _Data:
    T = np.column_stack([np.asarray(priced[f"{t}_ns"], np.int64) for t in TERMS])
    pre = np.asarray(priced["prefill_requests"], np.int64)
    dec = np.asarray(priced["decode_requests"], np.int64)
    y = np.asarray(priced[measured], np.float64)
    if y.size and not (np.all(np.isfinite(y)) and float(y.min()) > 0):
        raise ValueError(f"{measured!r} must be finite and > 0 on every step to fit "
                         "(bad measurements are rejected before fitting)")
    has_overlap = _has(priced, "overlap_ns")
    ov = np.asarray(priced["overlap_ns"], np.int64) if has_overlap else None
    return _Data(T, phase_code(pre, dec), y, pre, dec, ov)


def _has(priced: Any, col: str) -> bool:
    cols = getattr(priced, "columns", None)
    if cols is not None:
        return col in cols
    try:
        return col in priced
    except TypeError:
        return False


def _fit_data(d: _Data, start: str, opts: FitOptions, w_init: np.ndarray | None = None,
              rows: np.ndarray | None = None, off: np.ndarray | None = None
              ) -> tuple[Law, dict[str, PhaseFit], np.ndarray]:
    """Fit every phase class on the steps ``rows`` (indices; None: all), each phase on an
    evenly strided sample of at most ``max_rows`` of its steps (indices are taken before
    any copy, so a large trace is never copied whole); also the robust weight of every step
    (1 where unfitted or not sampled)."""
    phases = {}
    weights = np.ones(d.y.size)
    off = d.offset(start) if off is None else off
    idx_all = np.arange(d.y.size) if rows is None else rows
    code = d.code[idx_all]
    for i, name in enumerate(PHASES):
        idx = idx_all[code == i]
        n = int(idx.size)
        sub = idx
        if opts.max_rows and n > opts.max_rows:
            sub = idx[::-(-n // opts.max_rows)]
        pf = fit_phase(name, d.T[sub], d.y[sub], (d.pre[sub] + d.dec[sub]).astype(np.float64),
                       off[sub], dataclasses.replace(opts, max_rows=None),
                       None if w_init is None else w_init[sub])
        if sub.size < n:
            pf = dataclasses.replace(pf, rows=n, sampled=int(sub.size))
        phases[name] = pf
        if pf.weights is not None:
            weights[sub] = pf.weights
    law = Law(phases['prefill'].correction(), phases['decode'].correction(),
              phases['mixed'].correction(), start)
    return law, phases, weights


def _predict(law: Law, d: _Data) -> np.ndarray:
    return calibrated_ns(law, tuple(d.T[:, j] for j in range(N_TERMS)), d.pre, d.dec,
                         d.overlap)


def _summaries(rel: np.ndarray, code: np.ndarray) -> dict[str, Summary]:
    out = {"all": summarise(rel)}
    for i, name in enumerate(PHASES):
        sel = code == i
        if sel.any():
            out[name] = summarise(rel[sel])
    return out


def fit(priced: Any, measured: str = "measured_ns", *, folds: int = 5,
        groups: np.ndarray | None = None, fold_by: str | None = None, seed: int = 0,
        options: FitOptions | None = None, start: str = "auto",
        holdout: Any = None) -> FitResult:
    """Fit a calibration on a priced table with a measured column, and score it held out.

    ``priced`` is anything indexable by column name (a polars DataFrame, a dict of arrays)
    with the per-resource ``*_ns`` columns, ``prefill_requests``, ``decode_requests``,
    ``overlap_ns`` (for the Overlap start) and ``measured`` (ns, > 0). Held-out scoring:
    ``holdout``, a second such table, is scored by the fit on ``priced``; otherwise
    ``folds`` ≥ 2 cross-validates (``groups``: one label per step, each fold holding out whole
    groups, named ``fold_by`` in the result); otherwise only the training error is known.
    ``start``: ``no_overlap``, ``overlap``, or ``auto`` (both fitted, the lower held-out
    MAPE kept; training MAPE when nothing is held out).
    """
    opts = options or FitOptions()
    if start not in (*STARTS, "auto"):
        raise ValueError(f"start must be one of {[*STARTS, 'auto']}, got {start!r}")
    d = _arrays(priced, measured)
    if start == "auto" and d.overlap is None:
        starts: tuple[str, ...] = ("no_overlap",)
    else:
        starts = STARTS if start == "auto" else (start,)
    h = _arrays(holdout, measured) if holdout is not None else None
    results: dict[str, FitResult] = {}
    for s in starts:
        off = d.offset(s)
        law, phases, weights = _fit_data(d, s, opts, off=off)
        r = FitResult(law, phases, _summaries(relative_error(_predict(law, d), d.y), d.code))
        base_train = _summaries(relative_error(d.start_estimate(s), d.y), d.code)
        if h is not None:
            r.scored_by = "holdout"
            r.held_out = _summaries(relative_error(_predict(law, h), h.y), h.code)
            base = _summaries(relative_error(h.start_estimate(s), h.y), h.code)
        elif folds >= 2 and d.y.size >= 2:
            oof = _cross_validate(d, s, folds, groups, seed, opts, weights, off)
            r.scored_by = "folds"
            r.held_out = _summaries(relative_error(oof, d.y), d.code)
            r.held_out_predictions = oof
            r.folds = min(folds, _n_folds(d.y.size, groups, folds))
            r.fold_by = fold_by
            base = base_train
        else:
            base = base_train
        scored = r.held_out or r.training
        r.starts = {s: {"uncalibrated": base, "calibrated": scored}}
        results[s] = r
    key = "held-out MAPE" if next(iter(results.values())).held_out else "training MAPE"
    best = min(starts, key=lambda s: (_mape(results[s]), STARTS.index(s)))
    out = results[best]
    out.starts = {s: results[s].starts[s] for s in starts}
    out.start_chosen_by = key if start == "auto" and len(starts) > 1 else "given"
    mine = out.starts[best]
    after, before = mine["calibrated"]["all"].mape, mine["uncalibrated"]["all"].mape
    out.improved = bool(after < before)
    what = "held-out" if out.held_out else "training"
    on = h if h is not None else d
    out.uncalibrated = {e: _summaries(relative_error(on.start_estimate(e), on.y), on.code)
                        for e in STARTS if e == "no_overlap" or on.overlap is not None}
    if not out.improved:
        out.warning = (f"the calibration does not improve on its uncalibrated start "
                       f"({best}): {what} MAPE {after:.2%} against {before:.2%} uncalibrated")
    else:  # it beats its start; say so too if the other uncalibrated estimate beats it
        for other, v in out.uncalibrated.items():
            plain = v["all"].mape
            if other != best and not after < plain:
                out.warning = (f"the calibration improves on its start ({best}) but not on "
                               f"the uncalibrated {other}: {what} MAPE {after:.2%} against "
                               f"{plain:.2%}")
    return out


def _mape(r: FitResult) -> float:
    s = (r.held_out or r.training)["all"].mape
    return float(s) if np.isfinite(s) else np.inf


def _n_folds(n: int, groups: np.ndarray | None, folds: int) -> int:
    if groups is None:
        return min(folds, n)
    return min(folds, np.unique(groups).size)


def fold_labels(n: int, folds: int, groups: np.ndarray | None = None, seed: int = 0
                ) -> np.ndarray:
    """Fold index per step: whole groups per fold (groups in sorted order, dealt round-robin
    after a seeded shuffle), or rows dealt at random."""
    rng = np.random.default_rng(seed)
    if groups is not None:
        uniq, inv = np.unique(np.asarray(groups), return_inverse=True)
        k = min(folds, uniq.size)
        perm = rng.permutation(uniq.size)
        fold_of_group = np.empty(uniq.size, np.int64)
        fold_of_group[perm] = np.arange(uniq.size) % k
        return fold_of_group[inv.reshape(-1)]
    k = min(folds, n)
    lab = np.arange(n) % k
    rng.shuffle(lab)
    return lab


def _cross_validate(d: _Data, start: str, folds: int, groups: np.ndarray | None, seed: int,
                    opts: FitOptions, w_init: np.ndarray | None,
                    off: np.ndarray | None = None) -> np.ndarray:
    lab = fold_labels(d.y.size, folds, groups, seed)
    out = np.zeros(d.y.size, np.int64)
    if opts.fold_max_rows and (not opts.max_rows or opts.fold_max_rows < opts.max_rows):
        opts = dataclasses.replace(opts, max_rows=opts.fold_max_rows)
    off = d.offset(start) if off is None else off
    for f in np.unique(lab):
        test = lab == f
        law, _, _ = _fit_data(d, start, opts, w_init, np.flatnonzero(~test), off)
        out[test] = _predict(law, d.take(test))
    return out


def cross_validate(priced: Any, measured: str = "measured_ns", *, folds: int = 5,
                   groups: np.ndarray | None = None, seed: int = 0,
                   options: FitOptions | None = None, start: str = "no_overlap",
                   w_init: np.ndarray | None = None) -> np.ndarray:
    """Out-of-fold calibrated ns for every step (each scored by a fit without its fold;
    ``w_init``, the full fit's robust weights, is where each fold's fit starts)."""
    return _cross_validate(_arrays(priced, measured), start, folds, groups, seed,
                           options or FitOptions(), w_init)
