"""A corpus of bad command lines, one per way a new user can get it wrong, over every command.

Each case asserts its exit code (1: the input was wrong; 2: the command line was), exactly one
``Error:`` line that says what was wrong (no doubled ``Error: error:``), a single line of
stderr for exit 1, and no traceback. Cases run in-process through click's runner; files they
need (a trace, a priced table, a FIFO, a YAML bomb, …) are made once per module.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from kernel.cli import cli
from pipeline.resources import data_dir

S = "llama-3.1-8b-h100-tp1"  # the smallest embedded scenario: cheap to open
DS = "deepseek-v3-h200-fp8-sglang-tp8"  # price once defaulted to it (now -s is required)
LONG = "a" * 300  # longer than a file name may be (NAME_MAX = 255 bytes)
BOMB = "\n".join([
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    *(f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi",
                                                                   strict=True))]) + "\n"


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    code: int
    needle: str


def case(id_: str, line: str | list[str], code: int, needle: str) -> Case:
    """``line`` is split on spaces; a list is taken as the arguments, as they are."""
    return Case(id_, tuple(line.split() if isinstance(line, str) else line), code, needle)


def sql(id_: str, query: str, code: int, needle: str, *more: str) -> Case:
    return case(id_, ["sql", query, *(more or ("--db", "{d}/r.db"))], code, needle)


CASES = [
    # -- step / memory: names, batch specs, batch files, documents, ranges -------------------
    case("step-name-escapes-root", "step -s ../../../../etc/passwd --batch 1x1@1", 1,
         "no path separator"),
    case("step-name-too-long", f"step -s {LONG} --batch 1x1@1", 1, "at most"),
    case("step-batch-binary-file", f"step -s {S} --batch {{d}}/binary.json", 2, "UTF-8"),
    case("step-batch-malformed-json", f"step -s {S} --batch {{d}}/bad.json", 2, "not valid JSON"),
    case("step-batch-not-a-list", f"step -s {S} --batch {{d}}/notlist.yaml", 2, "holds a list"),
    case("step-batch-bad-value", f"step -s {S} --batch {{d}}/badvalue.yaml", 2,
         "non-negative integer"),
    case("step-batch-yaml-bomb", f"step -s {S} --batch {{d}}/bomb.yaml", 2, "aliases"),
    case("step-batch-billion-requests", f"step -s {S} --batch 1000000000x1@1", 2, "more than"),
    case("step-batch-beyond-int64", f"step -s {S} --batch 1x1@100000000000000000000", 2, "2^63-1"),
    case("step-batch-garbage", f"step -s {S} --batch nonsense", 2, "COUNTxSCHEDULED"),
    case("step-missing-batch-file", f"step -s {S} --batch {{d}}/missing.json", 2, "no such"),
    case("step-negative-threshold", f"step -s {S} --batch 1x1@1 --decode-threshold -1", 2,
         "range"),
    case("step-negative-sm-budget", f"step -s {S} --batch 1x1@1 --sm-budget -1", 2, "range"),
    case("step-pool-out-of-range", f"step -s {S} --batch 1x1@1 --pool 4", 1, "pool index 4"),
    case("step-scenario-yaml-bomb", "step -s {d}/bomb.yaml --batch 1x1@1", 1, "aliases"),
    case("step-scenario-binary", "step -s {d}/binary.yaml --batch 1x1@1", 1, "UTF-8"),
    case("step-scenario-int-beyond-int64", "step -s {d}/seqs.yaml --batch 1x1@1", 1,
         "out of range"),
    case("memory-name-with-dotdot", "memory -s ..", 1, "not empty"),
    case("memory-negative-pool", f"memory -s {S} --pool -1", 2, "range"),
    case("memory-deep-yaml", "memory -s {d}/deep.yaml", 1, "nest"),
    case("memory-recursive-alias", "memory -s {d}/recursive.yaml", 1, "recursive"),
    case("memory-unknown-name", "memory -s no-such-scenario", 1, "no-such-scenario"),
    # -- resolved / provenance / evidence ----------------------------------------------------
    case("resolved-pool-out-of-range", f"resolved -s {S} --pool 5", 2, "pool(s)"),
    case("provenance-output-unknown-suffix", f"provenance -s {S} -o {{d}}/p.xyz", 2,
         "cannot tell the format"),
    case("evidence-output-directory", f"evidence -s {S} --format csv -o {{d}}/adir", 2,
         "directory"),
    case("resolved-output-fifo", f"resolved -s {S} --format json -o {{d}}/fifo", 1, "FIFO"),
    case("provenance-output-is-scenario", "provenance -s {d}/scen.yaml --format json -o "
         "{d}/scen.yaml", 1, "same file"),
    case("resolved-unknown-format", f"resolved -s {S} --format xml", 2, "xml"),
    # -- sql: the sandbox --------------------------------------------------------------------
    sql("sql-empty", "", 1, "empty"),
    sql("sql-copy-to", "COPY scenarios TO '{d}/leak.csv'", 1, "COPY"),
    sql("sql-copy-subquery-to", "COPY (SELECT * FROM scenarios) TO '{d}/leak.parquet'", 1,
        "COPY"),
    sql("sql-attach", "ATTACH '{d}/other.db' AS o", 1, "ATTACH"),
    sql("sql-install", "INSTALL httpfs", 1, "LOAD"),
    sql("sql-load", "LOAD httpfs", 1, "LOAD"),
    sql("sql-drop", "DROP TABLE scenarios", 1, "DROP"),
    sql("sql-read-csv", "SELECT * FROM read_csv('/etc/passwd')", 1, "disabled"),
    sql("sql-replacement-scan", "SELECT * FROM '{d}/t.parquet'", 1, "disabled"),
    sql("sql-reenable-access", "SET enable_external_access = true", 1, "SET"),
    sql("sql-stacked-drop", "SELECT 1; DROP TABLE scenarios", 1, "DROP"),
    sql("sql-export", "EXPORT DATABASE '{d}/exported'", 1, "EXPORT"),
    sql("sql-syntax", "SELEC nonsense", 1, "SQL"),
    sql("sql-missing-db", "SELECT 1", 1, "no database file", "--db", "{d}/missing.db"),
    sql("sql-db-not-duckdb", "SELECT 1", 1, "", "--db", "{d}/binary.yaml"),
    sql("sql-db-and-scenario", "SELECT 1", 2, "--db", "--db", "{d}/r.db", "--scenario", S),
    sql("sql-create-in-memory", "CREATE TABLE x AS SELECT 1", 1, "CREATE", "--scenario", S),
    # -- trace synth -------------------------------------------------------------------------
    case("synth-billion-requests", "trace synth --requests 1e9 -o {d}/s.parquet", 2, "range"),
    case("synth-zero-batches", "trace synth -n 0 -o {d}/s.parquet", 2, "range"),
    case("synth-mix-above-one", "trace synth --mix 1.5 -o {d}/s.parquet", 2, "range"),
    case("synth-bad-distribution", "trace synth -n 5 --prompt bogus -o {d}/s.parquet", 1,
         "bogus"),
    case("synth-unknown-suffix", "trace synth -n 5 -o {d}/s.txt", 2, "suffix"),
    case("synth-output-fifo", "trace synth -n 5 -o {d}/fifo.parquet", 1, "FIFO"),
    case("synth-too-many-requests", "trace synth -n 100000000 --requests 100000 -o "
         "{d}/s.parquet", 1, "at most"),
    case("synth-negative-seed", "trace synth --seed -1 -o {d}/s.parquet", 2, "range"),
    case("synth-zero-budget", "trace synth --budget 0 -o {d}/s.parquet", 2, "range"),
    # -- price: same-file outputs, targets, ranges, clusters, bad inputs ----------------------
    case("price-output-is-input", "price -s {ds} {d}/t.parquet -o {d}/t.parquet", 1, "same file"),
    case("price-output-dotdot-input", "price -s {ds} {d}/t.parquet -o {d}/adir/../t.parquet", 1,
         "same file"),
    case("price-output-symlink-to-input", "price -s {ds} {d}/t.parquet -o {d}/link.parquet", 1,
         "same file"),
    case("price-output-hardlink-of-input", "price -s {ds} {d}/t.parquet -o {d}/hard.parquet", 1,
         "same file"),
    case("price-rejects-is-input", "price -s {ds} {d}/t.parquet -o {d}/o.parquet --rejects "
         "{d}/t.parquet", 1, "same file"),
    case("price-rejects-is-output", "price -s {ds} {d}/t.parquet -o {d}/o.parquet --rejects "
         "{d}/o.parquet", 1, "same file"),
    case("price-db-is-input", "price -s {ds} {d}/t.parquet -o {d}/o.parquet --db {d}/t.parquet", 1,
         "same file"),
    case("price-output-fifo", "price -s {ds} {d}/t.parquet -o {d}/fifo", 1, "FIFO"),
    case("price-output-device", "price -s {ds} {d}/t.parquet -o /dev/null", 1, "device"),
    case("price-output-directory", "price -s {ds} {d}/t.parquet -o {d}/adir", 1, "directory"),
    case("price-output-name-too-long", f"price -s {DS} {{d}}/t.parquet -o {{d}}/{LONG}.parquet", 1,
         "too long"),
    case("price-chunk-rows-zero", "price -s {ds} {d}/t.parquet -o {d}/o.parquet --chunk-rows 0", 2,
         "range"),
    case("price-negative-sm-budget", "price -s {ds} {d}/t.parquet -o {d}/o.parquet --sm-budget -1",
         2, "range"),
    case("price-negative-threshold", "price -s {ds} {d}/t.parquet -o {d}/o.parquet "
         "--decode-threshold -1", 2, "range"),
    case("price-negative-pool", "price -s {ds} {d}/t.parquet -o {d}/o.parquet --pool -1", 2, "range"),
    case("price-local-zero-workers", "price -s {ds} {d}/t.parquet -o {d}/od --cluster local:0", 2,
         "1 <= N"),
    case("price-cluster-garbage", "price -s {ds} {d}/t.parquet -o {d}/od --cluster bogus", 2,
         "scheduler address"),
    case("price-cluster-unreachable", "price -s {ds} {d}/t.parquet -o {d}/od --cluster 127.0.0.1:1 "
         "--connect-timeout 0.2", 1, "127.0.0.1:1"),
    case("price-cluster-ignored-option", "price -s {ds} {d}/t.parquet -o {d}/od --cluster local:1 "
         "--chunk-rows 5", 2, "--chunk-rows"),
    case("price-binary-trace", f"price {{d}}/binary.yaml -o {{d}}/o.parquet -s {S}", 1,
         "cannot read trace"),
    case("price-malformed-batch-table", f"price {{d}}/t.parquet -o {{d}}/o.parquet -s {S} "
         "--batches-file {d}/bad.json", 1, ""),
    case("price-scenario-escapes-root", "price {d}/t.parquet -o {d}/o.parquet -s "
         "../../etc/passwd", 1, "no path separator"),
    case("price-bad-column-map", "price -s {ds} {d}/t.parquet -o {d}/o.parquet --column nonsense", 2,
         "CANONICAL=SOURCE"),
    case("price-output-inside-trace-directory", "price -s {ds} {d}/tdir -o {d}/tdir/o.parquet", 2,
         "inside the TRACE directory"),
    case("price-output-is-a-part-of-the-trace", "price -s {ds} {d}/tdir -o {d}/tdir/part.parquet", 1,
         "same file"),
    case("price-pool-out-of-range", f"price {{d}}/t.parquet -o {{d}}/o.parquet -s {S} "
         "--pool 3", 1, "pool index 3"),
    # -- report / anatomy / compare / sweep / demo ---------------------------------------------
    case("report-not-priced", "report {d}/t.parquet -o {d}/r.html", 2, "not a priced trace"),
    case("report-output-symlink-to-input", "report {d}/p.parquet -o {d}/plink.html", 1,
         "same file"),
    case("report-binary-input", "report {d}/binary.yaml -o {d}/r.html", 1, ""),
    case("report-mislabel", "report {d}/ps.parquet -o {d}/r.html --scenario "
         "qwen3-30b-a3b-h100-tp2", 1, "was priced on scenario"),
    case("compare-mislabel", "compare {d}/ps.parquet --scenario qwen3-30b-a3b-h100-tp2", 1,
         "was priced on scenario"),
    case("report-bad-suffix", "report {d}/p.parquet -o {d}/r.txt", 2, "suffix"),
    case("report-directory-not-a-replay", "report {d} -o {d}/r.html", 2,
         "not a replay's output"),
    case("anatomy-bad-suffix", f"anatomy -s {S} -o {{d}}/a.txt", 2, "suffix"),
    case("anatomy-output-fifo", f"anatomy -s {S} -o {{d}}/fifo.png", 1, "FIFO"),
    case("anatomy-zero-batch", f"anatomy -s {S} -o {{d}}/a.png --max-batch 0", 2, "range"),
    case("anatomy-name-escapes-root", "anatomy -s ../../etc/passwd -o {d}/a.png", 1,
         "no path separator"),
    case("compare-unknown-scenario", "compare {d}/t.parquet --scenario nope", 1, "nope"),
    case("compare-output-symlink-to-input", f"compare {{d}}/t.parquet --scenario {S} -o "
         "{d}/tlink.html", 1, "same file"),
    case("compare-negative-threshold", f"compare {{d}}/t.parquet --scenario {S} "
         "--decode-threshold -1", 2, "range"),
    case("sweep-absolute-glob", "sweep {d}/t.parquet -s /etc/* -o {d}/sw", 2,
         "relative"),
    case("sweep-no-match", "sweep {d}/t.parquet -s nope* -o {d}/sw", 2,
         "matches no scenario"),
    case("sweep-local-zero", f"sweep {{d}}/t.parquet -s {S} --cluster local:0 -o "
         "{d}/sw", 2, "1 <= N"),
    case("sweep-output-is-trace-file", f"sweep {{d}}/t.parquet -s {S} -o "
         "{d}/t.parquet", 2, "file"),
    case("demo-zero-batches", "demo --batches 0 -o {d}/demo", 2, "range"),
    case("demo-name-escapes-root", "demo --batches 5 --scenario ../../etc/passwd -o "
         "{d}/demo", 1, "no path separator"),
    case("demo-negative-seed", "demo --seed -3 -o {d}/demo", 2, "range"),
    case("graph-derive-malformed-json", "graph derive {d}/bad.json -o {d}/g", 1, "not JSON"),
    case("graph-derive-binary", "graph derive {d}/binary.json -o {d}/g", 1, "JSON"),
    case("graph-derive-unknown-architecture", "graph derive {d}/nope.json -o {d}/g", 1,
         "no handler"),
    case("graph-derive-name-escapes", "graph derive {d}/nope.json --name ../../x -o {d}/g", 1,
         "not a valid model name"),
    case("graph-derive-missing-config", "graph derive {d}/missing.json", 2, "does not exist"),
    case("catalog-add-model-malformed", "catalog add-model {d}/bad.json --catalog {d}/cat", 1,
         "not JSON"),
    case("catalog-add-model-name-escapes", "catalog add-model {d}/nope.json --catalog {d}/cat "
         "--name ../../../evil", 1, "not a valid model name"),
    case("catalog-add-model-no-catalog", "catalog add-model {d}/nope.json", 2, "--catalog"),
    case("calibrate-output-is-trace", f"calibrate {{d}}/t.parquet -s {S} --measured m -o "
         "{d}/t.parquet", 1, "same file"),
    case("calibrate-missing-column", f"calibrate {{d}}/t.parquet -s {S} --measured nope -o "
         "{d}/c.yaml", 1, "nope"),
    case("calibrate-negative-folds", f"calibrate {{d}}/t.parquet -s {S} --measured m --folds -1 "
         "-o {d}/c.yaml", 2, "range"),
    case("calibrate-bad-unit", f"calibrate {{d}}/t.parquet -s {S} --measured m --measured-unit "
         "hours -o {d}/c.yaml", 2, "hours"),
    case("measurements-output-is-a-file", "measurements splitwise -o {d}/t.parquet", 2,
         "is a file"),
    # -- requests (issue 29) -----------------------------------------------------------------
    # -- registry fit / scenario from-vllm-config --------------------------------------------
    case("registry-missing-tables-dir", "registry fit --operator-tables {d}/missing --chip h100 "
         "--engine vllm:0.31.0 -o {d}/layer", 2, "does not exist"),
    case("registry-no-tables-in-dir", "registry fit --operator-tables {d} --chip h100 "
         "--engine vllm:0.31.0 -o {d}/layer", 1, "no operator tables found"),
    case("scenario-missing-config", "scenario from-vllm-config {d}/missing.json --hardware h100 "
         "-o {d}/sc", 2, "does not exist"),
    case("scenario-unknown-model", "scenario from-vllm-config {d}/unknown_model.json "
         "--hardware h100 -o {d}/sc", 1, "is not a catalog model"),
    case("requests-no-source", "requests", 2, "exactly one of"),
    case("requests-trace-not-requests", "requests {d}/t.parquet", 1, "needs column"),
    case("requests-missing-file", "requests {d}/missing.jsonl", 1, "does not exist"),
    case("requests-binary-jsonl", "requests {d}/binary.json", 1, "UTF-8"),
    case("requests-bad-json", "requests {d}/bad.json", 1, "not JSON"),
    case("requests-header-without-data", "requests {d}/bomb.yaml", 1, "without its data CSV"),
    case("requests-load-half-stage", "requests --load rate=5", 1, "go together"),
    case("requests-load-bad-lengths", "requests --load rate=1,duration=1,prompt=zipf:2", 1,
         "bad length distribution"),
    case("requests-load-yaml-bomb", "requests --load {d}/bomb.yaml", 1, "aliases"),
    case("requests-negative-seed", "requests --load rate=1,duration=1 --seed -1", 2, "range"),
    case("requests-seed-when-reading", "requests {d}/t.parquet --seed 3", 2, "does not apply"),
    # -- replay (issue 29) -------------------------------------------------------------------
    case("replay-missing-file", f"replay {{d}}/missing.jsonl --scenario {S} -o {{d}}/o", 2,
         "no such file"),
    case("replay-trace-not-requests", f"replay {{d}}/t.parquet --scenario {S} -o {{d}}/o", 1,
         "needs column"),
    case("replay-bad-slo", f"replay rate=1,duration=1 --scenario {S} -o {{d}}/o --slo "
         "ttft=fast", 2, "KEY=DURATION"),
    case("replay-unknown-slo", f"replay rate=1,duration=1 --scenario {S} -o {{d}}/o --slo "
         "p99=1s", 2, "unknown SLO"),
    case("replay-calibrated-without-calibration", f"replay rate=1,duration=1 --scenario {S} "
         "-o {d}/o --estimate calibrated", 1, "needs a kernel opened with a calibration"),
    case("replay-output-is-a-file", f"replay rate=1,duration=1 --scenario {S} -o "
         "{d}/t.parquet", 2, "is a file"),
    case("replay-half-stage", f"replay rate=5 --scenario {S} -o {{d}}/o", 1, "go together"),
    # -- replay --rates (capacity) and --report ---------------------------------------------
    case("replay-bad-rates", f"replay rate=1,duration=1 --scenario {S} -o {{d}}/o --rates 2,x",
         2, "comma-separated rates"),
    case("replay-rate-twice", f"replay rate=1,duration=1 --scenario {S} -o {{d}}/o --rates 2,2",
         2, "given twice"),
    case("replay-grid-without-rates", f"replay rate=1,duration=1 --scenario {S} --scenario {S} "
         "-o {d}/o", 2, "needs --rates"),
    case("replay-grid-repeats-a-scenario", f"replay rate=1,duration=1 --scenario {S} --scenario "
         f"{S} -o {{d}}/o --rates 1 --cluster inline", 1, "scenarios repeat"),
    case("replay-rates-closed-loop", f"replay users=2,requests_per_user=2 --scenario {S} -o "
         "{d}/o --rates 1 --cluster inline", 1, "closed-loop"),
    case("replay-rates-bad-cluster", f"replay rate=1,duration=1 --scenario {S} -o {{d}}/o "
         "--rates 1 --cluster nowhere", 2, "scheduler address"),
    case("replay-rates-zero-attainment", f"replay rate=1,duration=1 --scenario {S} -o {{d}}/o "
         "--rates 1 --min-attainment 0", 2, "range"),
    case("validate-name-too-long", f"validate {LONG}", 1, "too long"),
    case("validate-unknown-name", "validate no-such-scenario", 2, "no such file"),
    # -- issue 33 classes, per command: an output onto an input (RL1), a format by suffix
    #    (RL3), a bounded input (RL4), meaningless input (RL8/RL9), a bad number (RL7) ------
    case("step-scalar-too-long", "step -s {d}/long.yaml --batch 1x1@1", 1, "--max-scalar-bytes"),
    case("step-zero-token-batch", f"step -s {S} --batch 2x0@5", 1, "no forward pass"),
    case("step-block-size-17", "step -s {d}/b17.yaml --batch 1x1@1", 1, "multiple of 16"),
    case("memory-scalar-too-long", "memory -s {d}/long.yaml", 1, "--max-scalar-bytes"),
    case("memory-token-budget-zero", "memory -s {d}/mbt0.yaml", 1, "schedules no token"),
    case("memory-document-too-big", "memory -s {d}/long.yaml --max-document-bytes 1000", 1,
         "--max-document-bytes"),
    case("resolved-scalar-too-long", "resolved -s {d}/long.yaml", 1, "--max-scalar-bytes"),
    case("resolved-output-format-mismatch", f"resolved -s {S} --format csv -o {{d}}/r.jsonl", 2,
         "agree"),
    case("provenance-output-inside-catalog", f"provenance -s {S} --catalog {{d}}/cat -o "
         "{d}/cat/p.csv", 1, "inside"),
    case("evidence-output-inside-catalog", f"evidence -s {S} --catalog {{d}}/cat --format json "
         "-o {d}/cat/e.json", 1, "inside"),
    sql("sql-two-statements", "SELECT 1; SELECT 2", 1, "2 statements"),
    sql("sql-explain-analyze-create", "EXPLAIN ANALYZE CREATE TABLE x AS SELECT 1", 1,
        "CREATE", "--scenario", S),
    sql("sql-timeout-nan", "SELECT 1", 2, "finite", "--db", "{d}/r.db", "--timeout", "nan"),
    sql("sql-over-max-rows", "SELECT * FROM range(20)", 1, "--max-rows", "--db", "{d}/r.db",
        "--max-rows", "5"),
    sql("sql-runaway-query", "SELECT count(*) FROM range(100000000000) a", 1, "--timeout",
        "--db", "{d}/r.db", "--timeout", "0.3"),
    sql("sql-output-is-db", "SELECT 1", 1, "same file", "--db", "{d}/r.db", "--format", "csv",
        "-o", "{d}/r.db"),
    sql("sql-output-format-mismatch", "SELECT 1", 2, "agree", "--db", "{d}/r.db", "--format",
        "csv", "-o", "{d}/x.parquet"),
    case("synth-mix-nan", "trace synth --mix nan -o {d}/s.parquet", 2, "finite"),
    case("synth-output-json", "trace synth -n 5 -o {d}/s.json", 2, "suffix"),
    case("price-output-json", "price -s {ds} {d}/t.parquet -o {d}/o.json", 2, ".jsonl"),
    case("price-rejects-unknown-suffix", "price -s {ds} {d}/t.parquet -o {d}/o.parquet --rejects "
         "{d}/r.txt", 2, "cannot tell the format"),
    case("price-format-mismatch", "price -s {ds} {d}/t.parquet -o {d}/o.csv --format parquet", 2,
         "agree"),
    case("price-db-is-scenario", "price {d}/t.parquet -s {d}/scen.yaml -o {d}/o.parquet "
         "--db {d}/scen.yaml", 1, "same file"),
    case("price-output-inside-catalog", f"price {{d}}/t.parquet -s {S} --catalog {{d}}/cat "
         "-o {d}/cat/o.parquet", 1, "inside"),
    case("price-scalar-too-long", "price {d}/t.parquet -s {d}/long.yaml -o {d}/o.parquet", 1,
         "--max-scalar-bytes"),
    case("price-block-size-17", "price {d}/t.parquet -s {d}/b17.yaml -o {d}/o.parquet", 1,
         "multiple of 16"),
    case("price-connect-timeout-nan", "price -s {ds} {d}/t.parquet -o {d}/od --cluster 127.0.0.1:1 "
         "--connect-timeout nan", 2, "finite"),
    case("price-stdout-with-db", "price -s {ds} {d}/t.parquet -o - --db {d}/x.db", 2, "-o -"),
    case("report-output-is-the-trace", "report {d}/p.parquet --trace {d}/tt.html -o "
         "{d}/tt.html", 1, "same file"),
    case("report-scalar-too-long", "report {d}/ps.parquet -o {d}/r.html --scenario "
         "{d}/long.yaml", 1, "--max-scalar-bytes"),
    case("anatomy-scalar-too-long", "anatomy -s {d}/long.yaml -o {d}/a.png", 1,
         "--max-scalar-bytes"),
    case("anatomy-block-size-17", "anatomy -s {d}/b17.yaml -o {d}/a.png", 1, "multiple of 16"),
    case("anatomy-output-inside-catalog", f"anatomy -s {S} --catalog {{d}}/cat -o "
         "{d}/cat/a.png", 1, "inside"),
    case("compare-block-size-17", "compare {d}/t.parquet --scenario {d}/b17.yaml", 1,
         "multiple of 16"),
    case("compare-output-inside-catalog", f"compare {{d}}/t.parquet --scenario {S} --catalog "
         "{d}/cat -o {d}/cat/c.html", 1, "inside"),
    case("sweep-connect-timeout-nan", f"sweep {{d}}/t.parquet -s {S} -o {{d}}/sw "
         "--connect-timeout nan", 2, "finite"),
    case("sweep-output-holds-scenario", "sweep {d}/t.parquet -s {d}/sw2/scen.yaml "
         "-o {d}/sw2", 1, "holds"),
    case("demo-scalar-too-long", "demo --batches 5 --scenario {d}/long.yaml -o {d}/demo",
         1, "--max-scalar-bytes"),
    case("demo-out-inside-catalog", f"demo --batches 5 --scenario {S} --catalog {{d}}/cat "
         "-o {d}/cat/demo", 1, "inside"),
    case("graph-derive-into-config-folder", "graph derive {d}/qcfg/config.json -o {d}/qcfg", 1,
         "folder of CONFIG"),
    case("catalog-add-model-onto-its-own-config", "catalog add-model "
         "{d}/cat2/models/qcfg/config.json --name qcfg --catalog {d}/cat2", 1, "same file"),
    case("calibrate-output-is-scenario", "calibrate {d}/t.parquet -s {d}/scen.yaml --measured "
         "m -o {d}/scen.yaml", 1, "same file"),
    case("calibrate-block-size-17", "calibrate {d}/t.parquet -s {d}/b17.yaml --measured m -o "
         "{d}/c.yaml", 1, "multiple of 16"),
    case("measurements-output-is-a-fifo", "measurements splitwise -o {d}/fifo", 1, "exists"),
    case("requests-output-is-the-source", "requests {d}/rq/requests.parquet -o "
         "{d}/rq/requests.parquet", 1, "same file"),
    case("replay-output-folder-holds-its-requests", f"replay {{d}}/rq/requests.parquet "
         f"--scenario {S} -o {{d}}/rq", 1, "same file"),
    case("replay-scalar-too-long", "replay {d}/rq/requests.parquet --scenario {d}/long.yaml "
         "-o {d}/rpo", 1, "--max-scalar-bytes"),
    case("replay-block-size-17", "replay {d}/rq/requests.parquet --scenario {d}/b17.yaml "
         "-o {d}/rpo", 1, "multiple of 16"),
]

# validate prints each problem as a line (not an ``Error:``) and exits 1.
VALIDATE_CASES = [
    ("validate-yaml-bomb", "{d}/bomb.yaml", "aliases"),
    ("validate-binary", "{d}/binary.yaml", "UTF-8"),
    ("validate-int-beyond-int64", "{d}/seqs.yaml", "out of range"),
    ("validate-recursive-alias", "{d}/recursive.yaml", "recursive"),
    ("validate-heads-not-divisible-by-tp", "{d}/tp3.yaml", "refuses"),
    ("validate-scalar-too-long", "{d}/long.yaml", "--max-scalar-bytes"),
    ("validate-block-size-17", "{d}/b17.yaml", "multiple of 16"),
    ("validate-token-budget-zero", "{d}/mbt0.yaml", "schedules no token"),
    ("validate-max-model-len-beyond-int32", "{d}/mml.yaml", "beyond int32"),
]


@pytest.fixture(scope="module")
def d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kernel import bulk
    from kernel.facade.factory import open as open_kernel
    from kernel.io.synth import write_synth
    from pipeline import db

    root = tmp_path_factory.mktemp("fuzz")
    write_synth(root / "t.parquet", 30, requests_per_batch=4.0, seed=1)
    (root / "tdir").mkdir()
    (root / "tdir" / "part.parquet").write_bytes((root / "t.parquet").read_bytes())
    (root / "link.parquet").symlink_to(root / "t.parquet")
    os.link(root / "t.parquet", root / "hard.parquet")
    bulk.price_file(open_kernel(S), root / "t.parquet", root / "p.parquet", progress=False)
    made = CliRunner().invoke(cli, ["price", str(root / "t.parquet"), "-s", S, "-o",
                                    str(root / "ps.parquet"), "--no-progress"])
    assert made.exit_code == 0, made.output  # a stamped priced file (its scenario inside)
    (root / "plink.html").symlink_to(root / "p.parquet")
    (root / "tlink.html").symlink_to(root / "t.parquet")
    os.mkfifo(root / "fifo")
    os.mkfifo(root / "fifo.png")
    os.mkfifo(root / "fifo.parquet")
    (root / "adir").mkdir()
    (root / "binary.json").write_bytes(b"\xff\xfe\x00\x01binary")
    (root / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff")
    (root / "bad.json").write_text('[{"scheduled": 1')
    (root / "unknown_model.json").write_text('{"model": "no-such-model", "tensor_parallel_size": 1}')
    (root / "nope.json").write_text('{"architectures": ["NopeForCausalLM"]}')
    (root / "notlist.yaml").write_text("requests: 5\n")
    (root / "badvalue.yaml").write_text("- {scheduled: abc, computed: 1}\n")
    (root / "bomb.yaml").write_text(BOMB)
    (root / "deep.yaml").write_text("[" * 5000 + "]" * 5000 + "\n")
    (root / "recursive.yaml").write_text("a: &a [*a]\n")
    text = (data_dir() / "scenarios" / f"{S}.yaml").read_text()
    (root / "scen.yaml").write_text(text)
    (root / "seqs.yaml").write_text(text.replace("max_num_seqs: 256", "max_num_seqs: 1e20"))
    (root / "tp3.yaml").write_text(text.replace("tp: 1", "tp: 3"))
    (root / "long.yaml").write_text(text.replace("block_size: 16", "block_size: 16\n"
                                                 "      cudagraph_mode: " + "P" * 70_000))
    (root / "b17.yaml").write_text(text.replace("block_size: 16", "block_size: 17"))
    (root / "mbt0.yaml").write_text(text.replace("max_num_batched_tokens: 8192",
                                                 "max_num_batched_tokens: 0"))
    (root / "mml.yaml").write_text(text.replace("max_model_len: 32768", "max_model_len: 1e12"))
    (root / "tt.html").write_bytes((root / "t.parquet").read_bytes())
    (root / "sw2").mkdir()
    (root / "sw2" / "scen.yaml").write_text(text)
    (root / "cat").mkdir()
    (root / "rq").mkdir()
    import polars as pl
    pl.DataFrame({"arrival": [0.0, 0.1], "prompt_tokens": [100, 50], "output_tokens": [4, 3]}
                 ).write_parquet(root / "rq" / "requests.parquet")
    qwen = (data_dir() / "catalog" / "models" / "qwen3-30b-a3b" / "config.json").read_bytes()
    (root / "qcfg").mkdir()
    (root / "qcfg" / "config.json").write_bytes(qwen)
    (root / "cat2" / "models" / "qcfg").mkdir(parents=True)
    (root / "cat2" / "models" / "qcfg" / "config.json").write_bytes(qwen)
    db.load_scenarios([S], con=db.open_db(root / "r.db")).close()
    return root


def _args(c: Case, d: Path) -> list[str]:
    return [a.replace("{d}", str(d)).replace("{ds}", DS) for a in c.args]


def assert_one_line_error(result: Result, code: int, needle: str) -> None:
    shown = f"exit {result.exit_code}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert result.exit_code == code, shown
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        repr(result.exception), shown)
    assert "Traceback" not in result.output, shown
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, shown
    assert "error: " not in errors[0], shown  # no doubled "Error: error:" anywhere in it
    assert "internal error" not in errors[0], shown
    if code == 1:
        assert result.stderr.strip() == errors[0], shown
    assert needle.lower() in errors[0].lower(), shown


def test_the_corpus_is_large_and_spans_every_command() -> None:
    assert len(CASES) + len(VALIDATE_CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)
    used = {c.args[0] if c.args[0] != "trace" else "trace synth" for c in CASES} | {"validate"}
    commands = set(cli.commands) - {"trace"} | {"trace synth"}
    assert used == commands


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_a_one_line_error(c: Case, d: Path) -> None:
    before = (d / "t.parquet").read_bytes()
    result = CliRunner().invoke(cli, _args(c, d))
    assert_one_line_error(result, c.code, c.needle)
    assert (d / "t.parquet").read_bytes() == before  # no case destroys the input
    assert not list(d.glob(".*.tmp")) and not list(d.glob(".blis-*"))


@pytest.mark.parametrize("name,path,needle", VALIDATE_CASES, ids=[c[0] for c in VALIDATE_CASES])
def test_validate_reports_a_problem_line(name: str, path: str, needle: str, d: Path) -> None:
    result = CliRunner().invoke(cli, ["validate", path.replace("{d}", str(d))])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("error")]
    assert lines and any(needle.lower() in line.lower() for line in lines), result.output
