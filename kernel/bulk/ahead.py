"""Items taken from an iterator on a thread of their own, a few ahead of the consumer."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

__all__ = ["prefetched"]

T = TypeVar("T")


def prefetched(items: Iterable[T], depth: int, name: str = "blis-read", *,
               wait: bool = False) -> Iterator[T]:
    """``items``, each taken from the iterator on a thread named ``name`` ``depth`` items
    before it is wanted: reading a chunk waits on Arrow's decoding threads, and on a pricing
    worker (or the calling thread) that wait left a core idle (RO15). Closed early, the
    takes not started are dropped; ``wait``: and the one under way is waited for (the
    iterator reads files that are removed next)."""
    it = iter(items)
    reader = ThreadPoolExecutor(1, thread_name_prefix=name)
    try:
        ahead = deque(reader.submit(_next, it) for _ in range(depth + 1))
        while got := ahead.popleft().result():
            ahead.append(reader.submit(_next, it))
            yield got[0]
    finally:
        reader.shutdown(wait=wait, cancel_futures=True)


def _next(it: Iterator[T]) -> tuple[T] | tuple[()]:
    for x in it:
        return (x,)
    return ()
