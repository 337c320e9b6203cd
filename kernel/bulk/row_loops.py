"""The partition's per-row loops as plain Python, compiled by numba where it is on (decision SJ1).

:mod:`kernel.bulk.partition` scatters each validated chunk to its pieces (a stable counting
sort on the piece number) and gathers each piece from its chunks. With numpy and Arrow that
is a sort of the keys, a search for each piece's start and one gather per column, each a
separate pass over the chunk; compiled (:func:`kernel.model.jit.compiled`: nopython, the GIL
released, so the pricing workers overlap) it is one counting pass and one placement pass,
then one gather per column at C speed.

Each function here is the specification of its compiled self: numba compiles these loops as
written, once per combination of argument types (uint16, int32, int64, ...). The numpy/Arrow
path serves when compiled loops are off and gives the same integers (the tests run both).
"""

from __future__ import annotations

import numpy as np

__all__ = ["batch_keys", "grouped_ids", "ids_from_low", "piece_keys", "place_into",
           "place_steps_into", "row_steps", "rows_from_steps", "shifted_into", "stable_order",
           "take_into"]


def piece_keys(ids: np.ndarray, lo: int, shift: int, piece_of_cell: np.ndarray, n: int,
               low: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's piece (``piece_of_cell[(id - lo) >> shift]``, the table's type) and where
    each piece starts once the rows are ordered by piece (int64, ``n + 1``: the last is the
    row count). ``lo <= id`` and ``(id - lo) >> shift`` within the table for every id.
    ``low``: uint16, as long as ``ids`` (then each id's low 16 bits are written to it, in the
    same pass) or empty."""
    keys = np.empty(ids.size, piece_of_cell.dtype)
    offsets = np.zeros(n + 1, np.int64)
    with_low = low.size > 0
    for i in range(ids.size):
        k = piece_of_cell[(ids[i] - lo) >> shift]
        keys[i] = k
        offsets[k + 1] += 1
        if with_low:
            low[i] = ids[i] & 0xFFFF
    for k in range(n):
        offsets[k + 1] += offsets[k]
    return keys, offsets


def stable_order(keys: np.ndarray, offsets: np.ndarray, order: np.ndarray) -> None:
    """``order``: the row positions sorted by key, stably (a counting sort's placement pass:
    each row goes to the next free place of its piece, so rows keep input order within it)."""
    pos = offsets[:-1].copy()
    for i in range(keys.size):
        k = keys[i]
        j = pos[k]
        pos[k] = j + 1
        order[j] = i


def shifted_into(order: np.ndarray, first: int, out: np.ndarray) -> None:
    """``out[j] = order[j] + first`` (the row numbers of a chunk whose rows are numbered
    ``first, first + 1, ...``, taken in ``order``)."""
    for j in range(order.size):
        out[j] = order[j] + first


def take_into(order: np.ndarray, src: np.ndarray, out: np.ndarray) -> None:
    """``out[j] = src[order[j]]``, cast to ``out``'s type as numpy's ``astype`` casts
    (narrowing an integer keeps its low bits)."""
    for j in range(order.size):
        out[j] = src[order[j]]


def ids_from_low(low: np.ndarray, first: int, out: np.ndarray) -> None:
    """Batch ids (``out``, int64) from their low 16 bits (``low``, uint16) and their piece's
    first id: each id's offset from ``first`` is below 2**16, so it is the difference of the
    low bits modulo 2**16."""
    for i in range(low.size):
        out[i] = first + ((np.int64(low[i]) - first) & 0xFFFF)



def row_steps(row: np.ndarray, seg: np.ndarray, steps: np.ndarray, firsts: np.ndarray) -> bool:
    """A spilled slice's row numbers as steps (decision SW2): ``steps[i]`` (uint16) is row
    ``i``'s number less that of the row before it in its piece, 0 for a piece's first row,
    whose number goes to ``firsts`` (int64, one per piece; 0 for a piece with no row).
    ``seg``: where each piece starts in the slice, then its length. False (``steps`` and
    ``firsts`` partly written) as soon as a step is negative or beyond 65,535."""
    for k in range(seg.size - 1):
        a = seg[k]
        b = seg[k + 1]
        firsts[k] = 0
        if b <= a:
            continue
        prev = np.int64(row[a])
        firsts[k] = prev
        steps[a] = 0
        for i in range(a + 1, b):
            d = np.int64(row[i]) - prev
            if d < 0 or d > 0xFFFF:
                return False
            steps[i] = d
            prev = np.int64(row[i])
    return True


def rows_from_steps(steps: np.ndarray, seg: np.ndarray, firsts: np.ndarray,
                    out: np.ndarray) -> None:
    """The row numbers :func:`row_steps` encoded, into ``out`` (their own type)."""
    for k in range(seg.size - 1):
        acc = firsts[k]
        for i in range(seg[k], seg[k + 1]):
            acc += steps[i]
            out[i] = acc


def batch_keys(ids: np.ndarray, starts: np.ndarray, ends: np.ndarray, first: int, low: bool,
               counts: np.ndarray, dest: np.ndarray) -> None:
    """A piece's rows grouped by batch, stably (decision SW5): the piece's rows are
    ``ids[starts[s]:ends[s]]`` for each source ``s`` in turn (input order); each row's key is
    its id less ``first`` (taken modulo 2**16 from the id's low 16 bits when ``low``).
    ``counts`` (int64, zeroed, one per key) gets each key's rows and ``dest`` (as long as the
    piece) where each row goes once the rows are ordered by key, rows of a key in input order."""
    j = 0
    for s in range(starts.size):
        for i in range(starts[s], ends[s]):
            key = np.int64(ids[i]) - first
            if low:
                key &= 0xFFFF
            counts[key] += 1
            dest[j] = key
            j += 1
    pos = np.empty(counts.size, np.int64)
    acc = 0
    for k in range(counts.size):
        pos[k] = acc
        acc += counts[k]
    for j in range(dest.size):
        key = dest[j]
        dest[j] = pos[key]
        pos[key] += 1


def place_into(src: np.ndarray, starts: np.ndarray, ends: np.ndarray, dest: np.ndarray,
               out: np.ndarray) -> None:
    """``out[dest[j]]`` = the piece's ``j``-th row of ``src`` (the rows of
    ``src[starts[s]:ends[s]]`` for each source in turn), cast to ``out``'s type."""
    j = 0
    for s in range(starts.size):
        for i in range(starts[s], ends[s]):
            out[dest[j]] = src[i]
            j += 1


def place_steps_into(steps: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                     firsts: np.ndarray, dest: np.ndarray, out: np.ndarray) -> None:
    """:func:`place_into` of row numbers spilled as steps (:func:`row_steps`), decoded as
    they are placed: source ``s``'s rows are ``steps[starts[s]:ends[s]]``, one piece of one
    slice, from the first row number ``firsts[s]``."""
    j = 0
    for s in range(starts.size):
        acc = np.int64(firsts[s])
        for i in range(starts[s], ends[s]):
            acc += steps[i]
            out[dest[j]] = acc
            j += 1


def grouped_ids(counts: np.ndarray, first: int, ids: np.ndarray, inv: np.ndarray,
                starts: np.ndarray) -> int:
    """The batch id (``first`` + key) and dense batch index of each row of a piece grouped
    by :func:`batch_keys`, and each batch's first row (keys with no row are skipped);
    returns the number of batches."""
    r = 0
    b = 0
    for k in range(counts.size):
        c = counts[k]
        if c == 0:
            continue
        starts[b] = r
        for _ in range(c):
            ids[r] = first + k
            inv[r] = b
            r += 1
        b += 1
    return b
