"""Process-wide allocator settings for streaming runs, applied only when asked.

Streaming a trace allocates and frees arrays of a few MiB per chunk on several threads. With
glibc's defaults each such array is a fresh ``mmap`` (the kernel zeroes and maps every page
again, a page fault per 4 KiB), and each thread gets its own arena that grows to its own peak.
:func:`tune` changes that for the whole process, so it is the application's call: the command
line makes it (:mod:`kernel.cli`, at start-up) and the benchmarks do; no library call
does it (decision LF2). ``BLIS_KEEP_MALLOC=1`` vetoes it. Linux with glibc only.

``BLIS_ALLOCATOR=memory`` trades speed for a flat footprint instead (decision AL1): glibc is
left as it is and Arrow's buffers go to jemalloc (else mimalloc). On the 2-core machine a sorted
trace's peak RSS then stays within 7% from 1M to 30M batches (0.64 / 0.66 / 0.68 GiB, against
0.66 / 0.76 / 0.81 GiB tuned), for 4-15% more CPU (sorted 10M +5%, request-major 10M +4%,
shuffled 1M +15%). Measured again in one sitting (AL2): 0.61 / 0.67 / 0.70 GiB (1.14x) against
0.61 / 0.71 / 0.79 GiB tuned (1.30x), +7-9% CPU at 10M and 30M. The tuned heap's growth is
fragmentation, not data; no trim, threshold or pool tried fixed it at an acceptable cost (AL3).
``speed`` (the default) is what :func:`tune` describes below.

Measured on the 2-core machine, a sorted 1M-batch trace (decision RO12): ~50k page faults
with every setting applied before numpy starts its threads, 60-140k when applied later, 90-200k
without the single arena.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["ALLOCATOR_MODES", "tune"]

ALLOCATOR_MODES = ("speed", "memory")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

_TUNED = False


def tune() -> None:
    """Apply the settings once per process (call it before other imports where possible):

    * mmap threshold 32 MiB (glibc's maximum) and trim threshold 512 MiB: freed chunk-sized
      arrays stay in the heap and are reused without new page faults;
    * one arena for every thread: an array one pricing thread frees is reused by another.
      glibc only honours this for threads that have not yet allocated, so it counts most
      when called before numpy (whose BLAS starts threads) is imported;
    * Arrow's default memory pool: the system allocator, so Arrow's buffers share the one
      tuned heap (decision BT4);
    * mimalloc's purge delay 0 (``MIMALLOC_PURGE_DELAY``, unless set), in either mode;
    * numpy's transparent-huge-page advice off: where the kernel compacts memory to honour
      it (``transparent_hugepage/defrag = madvise``), each fault of fresh memory stalls
      (~30% more CPU for a shuffled trace, decision RO5).
    """
    global _TUNED
    mode = os.environ.get("BLIS_ALLOCATOR", "speed")
    if mode not in ALLOCATOR_MODES:
        raise ValueError(f"BLIS_ALLOCATOR={mode!r}: expected one of "
                         f"{', '.join(map(repr, ALLOCATOR_MODES))}")
    if _TUNED or not sys.platform.startswith("linux") or os.environ.get("BLIS_KEEP_MALLOC"):
        return
    _TUNED = True
    # (mimalloc — polars' allocator, and Arrow's where it is the pool — returns freed pages
    # at once: its share of a sorted run's peak no longer grows with the trace's length;
    # read when mimalloc starts, so only before polars and pyarrow are imported: AL5)
    os.environ.setdefault("MIMALLOC_PURGE_DELAY", "0")
    if mode == "memory":
        _memory_mode()
        return
    try:

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 512 << 20)
        libc.mallopt(_M_ARENA_MAX, 1)
    except (OSError, AttributeError):
        pass
    import numpy as np  # (heavy: numpy, loaded only on this path)
    import pyarrow as pa  # (heavy: Arrow, loaded only on this path)

    # Arrow's buffers in the same heap as numpy's (BT4): mimalloc kept its own freed pages
    # besides glibc's, and peak RSS crept with the trace's length (0.65 -> 0.73 GiB sorted,
    # 1M -> 10M batches; 0.54 -> 0.64 GiB in one heap)
    pa.set_memory_pool(pa.system_memory_pool())
    hugepage = getattr(getattr(np, "_core", None), "multiarray", None)
    if hugepage is not None and hasattr(hugepage, "_set_madvise_hugepage"):
        hugepage._set_madvise_hugepage(False)  # (numpy's NUMPY_MADVISE_HUGEPAGE=0)


def _memory_mode() -> None:
    """Arrow's buffers in jemalloc (else mimalloc), glibc untouched: each returns freed
    pages on its own schedule, so a long trace's footprint does not creep (AL1)."""
    import pyarrow as pa  # (heavy: Arrow, loaded only on this path)

    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except NotImplementedError:  # (a pyarrow built without jemalloc)
        pa.set_memory_pool(pa.mimalloc_memory_pool())
