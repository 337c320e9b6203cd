"""A built kernel saved to a file and loaded back without YAML, DuckDB or resolution.

The file is a pickle of the frozen resolution record (:class:`~kernel.model.resolved.ResolvedPool`),
the pool as stated, its :class:`~kernel.model.types.Resolution`, the digests of the documents it was
built from and its calibration (if any), behind a header that names the
format, its version and the engine behaviour it was resolved for. Loading checks the header
first, so a file from another format version or engine version is refused with the reason
instead of pricing with stale coefficients.

Pickle runs code from the file when it is loaded: load only files you (or your own sweep)
wrote. Workers of a sweep receive kernels this way (in memory) instead of rebuilding them.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

from pipeline.constants import ENGINE_BEHAVIOUR_VERSION

from ..model.resolved import ResolvedPool
from ..model.types import Resolution
from .kernel import Kernel

FORMAT = "blis-kernel resolved pool"
VERSION = 1

__all__ = ["FORMAT", "VERSION", "dumps", "load_kernel", "loads", "save_kernel"]


def _engine() -> str:
    return ENGINE_BEHAVIOUR_VERSION


def dumps(k: Kernel) -> bytes:
    """The kernel as bytes (see :func:`save_kernel`)."""
    header = {"format": FORMAT, "version": VERSION, "engine": _engine(),
              "scenario": k.resolved_pool.scenario, "pool": k.resolved_pool.pool_index}
    body = (k.resolved_pool, k.deployment(), k.resolved(), k.documents(), k.calibration)
    return pickle.dumps((header, body), protocol=pickle.HIGHEST_PROTOCOL)


def loads(data: bytes, source: str = "<bytes>") -> Kernel:
    """A kernel from :func:`dumps` bytes; ValueError naming ``source`` if they are not one."""
    try:
        header, body = pickle.loads(data)  # noqa: S301 - the documented trust boundary
    except Exception as exc:  # not a pickle, truncated, or a class that no longer exists
        raise ValueError(f"{source}: not a saved blis-kernel pool ({type(exc).__name__}: "
                         f"{exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise ValueError(f"{source}: not a saved blis-kernel pool (format "
                         f"{header.get('format') if isinstance(header, dict) else header!r})")
    if header.get("version") != VERSION:
        raise ValueError(f"{source}: saved pool format version {header.get('version')!r}; this "
                         f"blis-kernel reads version {VERSION}: save it again")
    if header.get("engine") != _engine():
        raise ValueError(f"{source}: resolved for engine behaviour {header.get('engine')!r}; "
                         f"this blis-kernel prices {_engine()!r}: save it again")

    resolved, pool, resolution, documents, calibration = _parts(body, source)
    if not isinstance(resolved, ResolvedPool) or not isinstance(resolution, Resolution):
        raise ValueError(f"{source}: the saved pool's body is not a resolution record")
    return Kernel(resolved, pool, resolution, documents, calibration)


def _parts(body: Any, source: str) -> tuple[Any, Any, Any, Any, Any]:
    if not isinstance(body, tuple) or len(body) != 5:
        raise ValueError(f"{source}: the saved pool's body is not a resolution record")
    return body[0], body[1], body[2], body[3], body[4]


def save_kernel(k: Kernel, path: str | os.PathLike[str]) -> Path:
    """Write ``k`` to ``path`` (written aside and renamed: never half a file); returns it."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_bytes(dumps(k))
    tmp.replace(out)
    return out


def load_kernel(path: str | os.PathLike[str]) -> Kernel:
    """The kernel saved at ``path`` by :func:`save_kernel` (or :meth:`Kernel.save`)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read the saved pool: {exc.strerror or exc}") from None
    return loads(data, str(path))
