"""Benchmark: why bulk pricing reads parquet one row group at a time (``docs/decisions.md``
RO15) rather than through the pyarrow.dataset scanner's readahead.

    python benchmarks/read_ahead.py            # the 1M-batch shuffled trace (~1 minute)

A consumer slower than the reader (as pricing is: ~0.1 s per million rows on 2 cores) takes
the trace's batches, holding none of them. Each way of reading runs in a fresh child process
and prints its peak RSS:

* ``scanner``: ``ds.Scanner.from_dataset(batch_readahead=2, fragment_readahead=1)``, the
  smallest readahead it offers;
* ``row groups``: one row-group fragment at a time (``to_table``), what
  :mod:`kernel.io.sources` does, a reader thread taking the next ones
  (:data:`kernel.bulk.stream.READ_AHEAD`) ahead.

If the scanner held back for a slow consumer, both would stay near a few row groups' size.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from price_trace import _peak_rss_bytes, make_traces  # noqa: E402

CONSUMER_SECONDS = 0.1  # per batch taken: slower than reading, as pricing is


def child(kind: str, path: str, batch_rows: int) -> dict[str, float]:
    import pyarrow.dataset as ds

    dset = ds.dataset(path)
    if kind == "scanner":
        it = ds.Scanner.from_dataset(dset, batch_size=batch_rows, batch_readahead=2,
                                     fragment_readahead=1, use_threads=True).to_batches()
    else:
        groups = [g for f in dset.get_fragments() for g in f.split_by_row_group()]
        it = (g.to_table(schema=dset.schema, use_threads=True) for g in groups)
    rows = 0
    t0 = time.perf_counter()
    for b in it:
        rows += b.num_rows
        time.sleep(CONSUMER_SECONDS)
    return {"rows": rows, "seconds": time.perf_counter() - t0, "rss": _peak_rss_bytes()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=1_000_000)
    ap.add_argument("--dir", help="where the trace goes (kept; default: a tmp dir)")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], int(args.child[2]))))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        path = make_traces(work, args.batches, ("shuffled",))["shuffled"]
        import pyarrow.parquet as pq

        md = pq.ParquetFile(path).metadata
        group_rows = md.row_group(0).num_rows
        print(f"{path.name}: {md.num_rows:,} rows in {md.num_row_groups} row groups of "
              f"{group_rows:,}, {path.stat().st_size / 2**30:.2f} GiB on disk")
        for kind in ("scanner", "row groups"):
            out = subprocess.run([sys.executable, __file__, "--child", kind, str(path),
                                  str(group_rows)], check=True, capture_output=True, text=True)
            r = json.loads(out.stdout)
            print(f"  {kind:<11} peak RSS {r['rss'] / 2**30:.2f} GiB, {r['rows']:,} rows in "
                  f"{r['seconds']:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
