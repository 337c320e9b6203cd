"""Fitting a calibration: a robust, non-negative fit on relative error, by phase class.

For the steps of one phase class, with per-resource terms ``t_j`` and measured time ``y``,
the model is ``y ≈ Σ m_j·t_j + c`` (:mod:`.law`). Dividing by ``y`` makes every step count
by its *relative* error: rows ``A_i = [t_ij / y_i …, s / y_i]`` (``s`` the median measured
time, so the constant is fitted as ``γ = c / s`` on the same scale as the multipliers) and
target 1. The fit:

* **non-negative**: every parameter ≥ 0, solved exactly (the problem has at most six
  unknowns, so every active set is tried and the best feasible one kept);
* **robust**: iteratively re-weighted least squares with Huber weights (k = 1.345 times the
  residuals' median absolute deviation), so a few bad measurements do not drag the fit;
* **ridge toward 1** (multipliers) and toward 0 (the constant), weight ``ridge`` per row,
  which only matters where the data are nearly silent;
* **identifiability**: a term whose share of the measured time is below ``min_share`` is
  held at 1 (*negligible*), and so is a term that is the same time on every step (the
  constant already is that). A first robust fit gives the residual scale σ; then the design
  is scaled to unit columns, and every eigen-direction of ``AᵀA`` that is nearly degenerate
  (eigenvalue below ``min_eigen``) and along which the parameters' standard error
  (σ/√eigenvalue, in the parameters' own scale) exceeds ``max_std_error`` is *weak*. Weak directions are pinned to the prior (multipliers 1,
  constant 0) by a strong penalty on them alone, and the terms they involve are reported
  *tied*: the data fix their combination, and only that is fitted. So terms the data cannot
  tell apart (sm and hbm in pure decode, where both follow the batch alike) are never split
  by noise; every other direction is fitted without bias.

:func:`cross_validate` runs the same fit on k folds (random rows, or whole groups such as
one deployment configuration per fold) and scores each fold's steps with the calibration
fitted without them.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .accuracy import Summary, relative_error, summarise
from .law import PHASES, TERMS, Law, PhaseCorrection, calibrated_ns, phase_code

__all__ = ["FitOptions", "FitResult", "PhaseFit", "TermFit", "cross_validate", "fit",
           "fit_phase"]

N_PARAMS = len(TERMS) + 1
CONSTANT = "constant"


@dataclass(frozen=True)
class FitOptions:
    ridge: float = 1e-10  # per-row weight of the pull toward 1 (multipliers) / 0 (constant)
    huber_k: float = 1.345
    max_iter: int = 50
    tol: float = 1e-6
    min_share: float = 0.005  # a term below this share of measured time is held at 1
    min_eigen: float = 0.01  # a direction of the unit-column design this degenerate ...
    max_std_error: float = 0.02  # ... and this uncertain is not identifiable: pinned
    min_rows: int = 8  # fewer steps than this in a phase: nothing is fitted there
    max_rows: int | None = 250_000  # a phase with more steps is fitted on an evenly strided
    # sample of about this many (six parameters need no more; every step is still scored)


@dataclass(frozen=True)
class TermFit:
    """One parameter of one phase: its value, whether it was fitted, and why not."""

    name: str
    value: float  # multiplier, or the constant in ns
    status: str  # fitted | held
    std_error: float | None = None  # multipliers: absolute; constant: ns
    reason: str = ""


@dataclass(frozen=True)
class PhaseFit:
    phase: str
    rows: int
    terms: tuple[TermFit, ...]
    iterations: int = 0
    reason: str = ""  # why nothing was fitted (no rows, too few rows)
    sampled: int | None = None  # steps actually fitted on, when fewer than ``rows``
    weights: np.ndarray | None = field(default=None, repr=False, compare=False)  # robust

    def correction(self) -> PhaseCorrection:
        by = {t.name: t.value for t in self.terms}
        return PhaseCorrection(tuple(float(by[n]) for n in TERMS),  # type: ignore[arg-type]
                               float(by[CONSTANT]))


@dataclass
class FitResult:
    law: Law
    phases: dict[str, PhaseFit]
    training: dict[str, Summary] = field(default_factory=dict)  # "all" + per phase
    held_out: dict[str, Summary] = field(default_factory=dict)
    folds: int = 0
    fold_by: str | None = None
    held_out_predictions: np.ndarray | None = None  # out-of-fold calibrated ns per step


# -- the solver ---------------------------------------------------------------------------------

def _nnls_gram(G: np.ndarray, h: np.ndarray) -> np.ndarray:
    """argmin_{x >= 0} xᵀGx − 2hᵀx for a small symmetric PSD G, by trying every support.

    At the optimum x solves the unconstrained problem on its support and is feasible, so the
    feasible support solution with the lowest objective is the answer (exact, deterministic).
    """
    n = h.size
    try:  # the usual case: the unconstrained optimum is already feasible
        x = np.linalg.solve(G, h)
        if np.all(x >= 0) and np.all(np.isfinite(x)):
            return x
    except np.linalg.LinAlgError:
        pass
    best = np.zeros(n)
    best_obj = 0.0
    for k in range(1, n + 1):
        for sub in itertools.combinations(range(n), k):
            idx = list(sub)
            Gs = G[np.ix_(idx, idx)]
            try:
                xs = np.linalg.solve(Gs, h[idx])
            except np.linalg.LinAlgError:
                xs = np.linalg.lstsq(Gs, h[idx], rcond=None)[0]
            if np.any(xs < 0) or not np.all(np.isfinite(xs)):
                continue
            obj = float(xs @ Gs @ xs - 2.0 * h[idx] @ xs)
            if obj < best_obj - 1e-15 * max(1.0, abs(best_obj)):
                best_obj = obj
                best = np.zeros(n)
                best[idx] = xs
    return best


def _huber_weights(r: np.ndarray, k: float) -> np.ndarray:
    # the residual scale from at most ~200k evenly strided residuals (deterministic)
    sample = r[::max(1, r.size // 200_000)]
    scale = 1.4826 * float(np.median(np.abs(sample)))
    if scale <= 1e-6:  # exact to rounding: nothing to be robust against
        return np.ones_like(r)
    delta = k * scale
    a = np.abs(r)
    return np.where(a <= delta, 1.0, delta / np.maximum(a, 1e-300))


def _weak_directions(A: np.ndarray, w: np.ndarray, sigma: float, max_std_error: float,
                     min_eigen: float) -> tuple[np.ndarray, np.ndarray]:
    """(unit-space directions, the same as constraint vectors on the parameters): the
    directions (columns, in the unit-column space) the data do not pin down: eigenvectors
    of the column-normalised weighted Gram matrix that are nearly degenerate (eigenvalue below
    ``min_eigen``: the terms along them explain one another to within 1%) *and* along which
    the parameters' standard error, σ / √eigenvalue mapped back to the parameters' scale,
    exceeds ``max_std_error`` — or whose eigenvalue is zero to rounding."""
    Aw = A * np.sqrt(w)[:, None]
    d = np.sqrt(np.maximum((Aw * Aw).sum(axis=0), 1e-300))
    Gn = (Aw / d).T @ (Aw / d)
    vals, vecs = np.linalg.eigh(Gn)
    se = np.array([sigma * float(np.linalg.norm(v / d)) / np.sqrt(max(lam, 1e-300))
                   for lam, v in zip(vals, vecs.T, strict=True)])
    weak = ((se > max_std_error) & (vals < min_eigen)) | (vals < 1e-10 * vals.max())
    return vecs[:, weak], vecs[:, weak] * d[:, None]


def _penalty(M: np.ndarray) -> np.ndarray:
    """A penalty pinning Mᵀ(x − prior) to 0: the constraint vectors are on the data's own
    scale (unit eigenvalue), so 10⁴ dominates the data along them and nowhere else."""
    return 1e4 * (M @ M.T)


def _robust_solve(A: np.ndarray, b: np.ndarray, prior: np.ndarray, ridge: float,
                  opts: FitOptions, weak: np.ndarray | None = None,
                  w_init: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Huber-IRLS non-negative ridge fit of A·x ≈ b (the ``weak`` directions pinned to the
    prior), starting from weights ``w_init`` (default all 1); returns (x, weights,
    iterations)."""
    n = b.size
    w = np.ones(n) if w_init is None else w_init
    x = prior.copy()
    it = 0
    for step in range(1, opts.max_iter + 1):
        it = step
        Aw = A * w[:, None]
        lam = ridge * float(w.sum())
        P = lam * np.eye(A.shape[1])
        if weak is not None and weak.size:
            P = P + _penalty(weak)
        G = Aw.T @ A + P
        h = Aw.T @ b + P @ prior
        x_new = _nnls_gram(G, h)
        r = A @ x_new - b
        w = _huber_weights(r, opts.huber_k)
        done = bool(np.max(np.abs(x_new - x)) < opts.tol)
        x = x_new
        if done:
            break
    return x, w, it


# -- one phase ----------------------------------------------------------------------------------

def fit_phase(phase: str, terms: np.ndarray, measured: np.ndarray,
              opts: FitOptions | None = None, w_init: np.ndarray | None = None) -> PhaseFit:
    """Fit one phase class: ``terms`` [n, 5] per-resource ns (TERMS order), ``measured`` [n]
    ns (> 0). ``w_init``: robust weights to start from (e.g. a fit on more of the data)."""
    opts = opts or FitOptions()
    n = int(measured.size)
    if opts.max_rows and n > opts.max_rows:
        stride = -(-n // opts.max_rows)
        sub = fit_phase(phase, terms[::stride], measured[::stride], opts,
                        None if w_init is None else w_init[::stride])
        w_full = np.ones(n)
        if sub.weights is not None:
            w_full[::stride] = sub.weights
        return dataclasses.replace(sub, rows=n, sampled=int(sub.rows), weights=w_full)
    if n < max(opts.min_rows, 1):
        why = "no steps of this phase" if n == 0 else f"only {n} step(s) (< {opts.min_rows})"
        return PhaseFit(phase, n, tuple(
            [TermFit(t, 1.0, "held", None, why) for t in TERMS]
            + [TermFit(CONSTANT, 0.0, "held", None, why)]), 0, why)
    y = measured.astype(np.float64)
    T = terms.astype(np.float64)
    scale = float(np.median(y))
    A = np.empty((n, N_PARAMS))
    A[:, :len(TERMS)] = T / y[:, None]
    A[:, len(TERMS)] = scale / y
    prior = np.array([1.0] * len(TERMS) + [0.0])
    share = T.sum(axis=0) / float(y.sum())
    held: dict[int, str] = {}
    for j, name in enumerate(TERMS):
        if share[j] < opts.min_share:
            held[j] = (f"negligible: {name} is {share[j]:.2%} of the measured time "
                       f"(< {opts.min_share:.1%})")
    # A term that is the same time on every step is the constant under another name.
    for j in range(len(TERMS)):
        if j not in held and _tolerances(A, [j, len(TERMS)])[j] < 1e-9:
            held[j] = (f"a fixed time per step in this phase: the constant covers it "
                       f"({TERMS[j]} held at 1)")
    free = [j for j in range(N_PARAMS) if j not in held]
    fixed = [j for j in range(N_PARAMS) if j in held]
    b = np.ones(n) - (A[:, fixed] @ prior[fixed] if fixed else 0.0)
    x = prior.copy()
    se = np.full(N_PARAMS, np.nan)
    tied: dict[int, str] = {}
    iters = 0
    weights = None
    if free:
        Af = A[:, free]
        # a first robust fit gives the residual scale that decides what is identifiable
        x0, w0, it0 = _robust_solve(Af, b, prior[free], opts.ridge, opts, None, w_init)
        r0 = Af @ x0 - b
        sigma = max(float(np.sqrt((w0 * r0 * r0).sum() / max(n - len(free), 1))), 1e-6)
        weak, pin = _weak_directions(Af, w0, sigma, opts.max_std_error, opts.min_eigen)
        if weak.size:
            xf, w, iters = _robust_solve(Af, b, prior[free], opts.ridge, opts, pin, w0)
        else:
            xf, w, iters = x0, w0, 0
        iters += it0
        weights = w
        x[free] = xf
        se[free] = _std_errors(Af, b, xf, w, pin)
        names = [*TERMS, CONSTANT]
        for v in weak.T:
            members = [free[i] for i in np.flatnonzero(np.abs(v) > 0.2)]
            for j in members:
                others = [names[k] for k in members if k != j]
                tied[j] = ("not identifiable on its own" + (
                    f": only its combination with {', '.join(others)} is fitted; the split "
                    "between them is held at the prior (multipliers 1, constant 0)"
                    if others else ": held at the prior"))
    out = []
    for j in range(N_PARAMS):
        name = TERMS[j] if j < len(TERMS) else CONSTANT
        value = float(x[j]) * (scale if name == CONSTANT else 1.0)
        s = None if not np.isfinite(se[j]) or j in held else \
            float(se[j]) * (scale if name == CONSTANT else 1.0)
        status = "held" if j in held else "tied" if j in tied else "fitted"
        out.append(TermFit(name, value, status, s, held.get(j, tied.get(j, ""))))
    return PhaseFit(phase, n, tuple(out), iters, weights=weights)


def _std_errors(A: np.ndarray, b: np.ndarray, x: np.ndarray, w: np.ndarray,
                weak: np.ndarray | None = None) -> np.ndarray:
    """Huber-weighted least-squares standard errors: σ²·diag((AᵀWA)⁻¹), σ the weighted RMS
    residual (with a floor so exact data still expose a singular design)."""
    r = A @ x - b
    dof = max(b.size - A.shape[1], 1)
    sigma2 = max(float((w * r * r).sum()) / dof, 1e-12)
    G = (A * w[:, None]).T @ A
    if weak is not None and weak.size:
        G = G + _penalty(weak)
    d = np.sqrt(np.maximum(np.diag(G), 1e-300))
    Gn = G / np.outer(d, d)  # unit-diagonal: conditioning independent of column scale
    try:
        if np.linalg.cond(Gn) > 1e12:
            raise np.linalg.LinAlgError
        inv = np.linalg.inv(Gn)
    except np.linalg.LinAlgError:
        # singular: the parameters lying in the null space are not identifiable at all
        inv = np.linalg.pinv(Gn)
        null = np.linalg.eigh(Gn)[1][:, np.abs(np.linalg.eigvalsh(Gn)) < 1e-12]
        bad = np.abs(null).sum(axis=1) > 1e-9 if null.size else np.zeros(G.shape[0], bool)
        diag = np.diag(inv).copy()
        diag[bad] = np.inf
        return np.sqrt(sigma2 * np.maximum(diag, 0.0)) / d
    return np.sqrt(sigma2 * np.maximum(np.diag(inv), 0.0)) / d


def _tolerances(A: np.ndarray, free: list[int]) -> dict[int, float]:
    """Per free column, 1 − uncentered R² of its regression on the other free columns
    (from the Gram matrix: one pass over the rows)."""
    Af = A[:, free]
    G = Af.T @ Af
    out: dict[int, float] = {}
    for i, j in enumerate(free):
        gjj = float(G[i, i])
        if gjj <= 0:
            out[j] = 0.0
            continue
        o = [x for x in range(len(free)) if x != i]
        if not o:
            out[j] = 1.0
            continue
        g = G[o, i]
        coef = np.linalg.lstsq(G[np.ix_(o, o)], g, rcond=None)[0]
        out[j] = max(gjj - float(g @ coef), 0.0) / gjj
    return out


# -- all phases ---------------------------------------------------------------------------------

def _arrays(priced: Any, measured: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    T = np.column_stack([np.asarray(priced[f"{t}_ns"], np.int64) for t in TERMS])
    code = phase_code(np.asarray(priced["prefill_requests"]),
                      np.asarray(priced["decode_requests"]))
    y = np.asarray(priced[measured], np.float64)
    if y.size and not (np.all(np.isfinite(y)) and float(y.min()) > 0):
        raise ValueError(f"{measured!r} must be finite and > 0 on every step to fit "
                         "(bad measurements are rejected before fitting)")
    return T, code, y


def _fit_arrays(T: np.ndarray, code: np.ndarray, y: np.ndarray, opts: FitOptions,
                w_init: np.ndarray | None = None
                ) -> tuple[Law, dict[str, PhaseFit], np.ndarray]:
    """Fit every phase class; also the robust weight of every step (1 where unfitted)."""
    phases = {}
    weights = np.ones(y.size)
    for i, name in enumerate(PHASES):
        sel = code == i
        phases[name] = fit_phase(name, T[sel], y[sel], opts,
                                 None if w_init is None else w_init[sel])
        if phases[name].weights is not None:
            weights[sel] = phases[name].weights
    law = Law(*(phases[p].correction() for p in PHASES))
    return law, phases, weights


def _predict(law: Law, T: np.ndarray, priced: Any) -> np.ndarray:
    return calibrated_ns(law, tuple(T[:, j] for j in range(len(TERMS))),
                         np.asarray(priced["prefill_requests"]),
                         np.asarray(priced["decode_requests"]))


def _summaries(rel: np.ndarray, code: np.ndarray) -> dict[str, Summary]:
    out = {"all": summarise(rel)}
    for i, name in enumerate(PHASES):
        sel = code == i
        if sel.any():
            out[name] = summarise(rel[sel])
    return out


def fit(priced: Any, measured: str = "measured_ns", *, folds: int = 5,
        groups: np.ndarray | None = None, fold_by: str | None = None, seed: int = 0,
        options: FitOptions | None = None) -> FitResult:
    """Fit a calibration on a priced table with a measured column, and cross-validate it.

    ``priced`` is anything indexable by column name (a polars DataFrame, a dict of arrays)
    with the per-resource ``*_ns`` columns, ``prefill_requests``, ``decode_requests`` and
    ``measured`` (ns, > 0). ``groups``: one label per step; each fold then holds out whole
    groups (``fold_by`` names them in the result). ``folds`` < 2 skips cross-validation.
    """
    opts = options or FitOptions()
    T, code, y = _arrays(priced, measured)
    law, phases, weights = _fit_arrays(T, code, y, opts)
    pred = _predict(law, T, priced)
    result = FitResult(law, phases, _summaries(relative_error(pred, y), code))
    if folds >= 2 and y.size >= 2:
        oof = cross_validate(priced, measured, folds=folds, groups=groups, seed=seed,
                             options=opts, w_init=weights)
        result.held_out = _summaries(relative_error(oof, y), code)
        result.held_out_predictions = oof
        result.folds = min(folds, _n_folds(y.size, groups, folds))
        result.fold_by = fold_by
    return result


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


def cross_validate(priced: Any, measured: str = "measured_ns", *, folds: int = 5,
                   groups: np.ndarray | None = None, seed: int = 0,
                   options: FitOptions | None = None,
                   w_init: np.ndarray | None = None) -> np.ndarray:
    """Out-of-fold calibrated ns for every step (each scored by a fit without its fold;
    ``w_init``, the full fit's robust weights, is where each fold's fit starts)."""
    opts = options or FitOptions()
    T, code, y = _arrays(priced, measured)
    lab = fold_labels(y.size, folds, groups, seed)
    out = np.zeros(y.size, np.int64)
    pre = np.asarray(priced["prefill_requests"])
    dec = np.asarray(priced["decode_requests"])
    for f in np.unique(lab):
        test = lab == f
        train = ~test
        law, _, _ = _fit_arrays(T[train], code[train], y[train], opts,
                                None if w_init is None else w_init[train])
        out[test] = calibrated_ns(law, tuple(T[test, j] for j in range(len(TERMS))),
                                  pre[test], dec[test])
    return out
