"""The embedded scenarios the tests iterate over, and the ones that need the assumed extension."""

from __future__ import annotations

from pipeline.resources import data_dir

# The registry measures h200 collectives at 2, 4 and 8 ranks only, and an unmeasured width
# inside {2,4,8,16} is a refusal (case 85), so these 16-wide deployments price only with the
# assumed extension for unmeasured widths (on by default); turned off, they are refused (why).
ASSUMED_WIDTHS = {
    "minimax-m25-h200-ep16": "no 16-rank all_reduce measurement",
    "deepseek-v4-pro-h200-fp8-vllm-tp8-ep8-dp2-cfg2": "no 16-rank alltoall measurement",
}
# Every embedded scenario builds with the defaults.
BUILDABLE = sorted(p.stem for p in (data_dir() / "scenarios").glob("*.yaml"))
