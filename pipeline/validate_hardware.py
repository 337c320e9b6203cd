"""Field checks on a chip, a fabric and the storage classes (model.md §12.4)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .documents import Chip, Fabric, StorageDevice
from .errors import Problem
from .validate_common import PROVENANCES, Collector, go_float

# Chip numbers that must be finite and > 0 (YAML key, field).
_CHIP_POSITIVE = (("TFlopsPeak", "tflops_peak"), ("BwPeakTBs", "bw_peak_tbs"),
                  ("MemoryGiB", "memory_gib"), ("IntraNodeBwGBps", "intra_node_bw_gbps"),
                  ("SMCount", "sm_count"))
# Optional chip numbers: finite, >= 0.
_CHIP_OPTIONAL = (("TFlopsFP8", "tflops_fp8"), ("TFlopsNVFP4", "tflops_nvfp4"),
                  ("GPUsPerNode", "gpus_per_node"), ("GPUsPerRack", "gpus_per_rack"),
                  ("IntraRackBwGBps", "intra_rack_bw_gbps"))
_STORAGE_POSITIVE = ("read_bandwidth_mb_s", "write_bandwidth_mb_s", "base_latency_us")


def validate_chip(doc: Chip, file: str, lines: Mapping[str, int] | None = None) -> list[Problem]:
    """Every field problem of one chip (PascalCase key paths)."""
    c = Collector(file, lines)
    c.one_of("Provenance", doc.provenance, PROVENANCES)
    for key, attr in _CHIP_POSITIVE:
        c.positive(key, float(getattr(doc, attr)))
    ok = {}
    for key, attr in _CHIP_OPTIONAL:
        value = float(getattr(doc, attr))
        ok[key] = c.finite(key, value)
        if ok[key]:
            c.not_negative(key, value)
    if ok["TFlopsFP8"] and doc.tflops_fp8 > 0 and doc.tflops_fp8 <= doc.tflops_peak:
        c.error("TFlopsFP8", f"{go_float(doc.tflops_fp8)} must exceed TFlopsPeak "
                f"{go_float(doc.tflops_peak)}; omit it for a chip without native FP8")
    if doc.gpus_per_rack > 0 and doc.gpus_per_node > 0 and doc.gpus_per_rack % doc.gpus_per_node:
        c.error("GPUsPerRack", f"{doc.gpus_per_rack} is not a multiple of GPUsPerNode "
                f"{doc.gpus_per_node}")
    if ok["IntraRackBwGBps"] and doc.intra_rack_bw_gbps > 0 and doc.gpus_per_rack <= 0:
        c.error("IntraRackBwGBps", "stated without GPUsPerRack, so no rack bounds it")
    return c.problems


def validate_fabric(doc: Fabric, file: str,
                    lines: Mapping[str, int] | None = None) -> list[Problem]:
    """Every field problem of one fabric."""
    c = Collector(file, lines)
    c.one_of("Provenance", doc.provenance, PROVENANCES)
    c.positive("InterNodeBwGBps", doc.inter_node_bw_gbps)
    return c.problems


def validate_storage(devices: Iterable[StorageDevice], file: str,
                     lines: Mapping[str, int] | None = None) -> list[Problem]:
    """Every field problem of the storage classes; paths ``<class>.<key>``."""
    c = Collector(file, lines)
    for device in devices:
        if not device.name:
            c.error("", "a storage class must have a name")
        at = c.at(device.name)
        for key in _STORAGE_POSITIVE:
            at.positive(key, getattr(device, key))
    return c.problems
