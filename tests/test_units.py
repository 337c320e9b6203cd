"""Coefficients lift to SI from their declared ``units`` (pipeline/units.py, one table), and a
coefficient whose units do not measure what its name does is refused with its set and file."""

from __future__ import annotations

import dataclasses
import fnmatch

import pytest

from kernel.pool import build  # (importing it installs the cost laws the views call)
from pipeline import db, units
from pipeline.errors import RefusalError
from pipeline.validate_common import UNITS as VOCABULARY
from tests.resolution_support import entry, inputs, query, with_entries
from tests.test_sql_data import everything

DS3 = "deepseek-v3-h200-fp8-sglang-tp8"


def test_every_unit_of_the_vocabulary_has_a_row_and_every_quantity_a_label() -> None:
    assert {u.unit for u in units.UNITS} == set(VOCABULARY)
    assert {u.quantity for u in units.UNITS} | {q for _, q in units.QUANTITIES} <= set(
        units.QUANTITY_LABELS)
    for u in units.UNITS:  # one row per (unit, quantity): the lifting is never ambiguous
        assert sum((v.unit, v.quantity) == (u.unit, u.quantity) for v in units.UNITS) == 1


def test_sql_matches_names_to_quantities_as_the_table_says() -> None:
    rows = everything().execute("SELECT DISTINCT name, quantity, units, si_unit, units_fit "
                                "FROM coefficients_lifted").fetchall()
    assert len(rows) > 100
    for name, quantity, declared, si_unit, fit in rows:
        want = next((q for p, q in units.QUANTITIES if fnmatch.fnmatchcase(name, p)), None)
        unit = next(u for u in units.UNITS if u.unit == declared
                    and (want is None or u.quantity == want))
        assert (quantity, si_unit, fit) == (unit.quantity, unit.si_unit, True), name


def test_lifting_follows_the_declared_units() -> None:
    base = inputs(DS3)
    hw = (base.chip.name,)
    inp = with_entries(base, [
        entry("host_completion", 2.5, "assumed", hw, units="us_per_request"),
        entry("attention_decode_rate", 1234.5, "assumed", hw, units="bytes_per_us"),
        entry("my_own_figure", 7.25, "assumed", hw, units="us_per_hop"),  # the kernel reads
        entry("my_own_rate", 3.0, "assumed", hw, units="tokens"),  # neither of these two
    ])
    con = db.open_db(apply=False)
    key = db.register(con, inp)
    db.apply_views(con)
    got = {r["name"]: (r["si_unit"], r["si_value"], r["ns_value"]) for r in query(
        con, "SELECT name, si_unit, si_value, ns_value FROM coefficients_lifted "
        "WHERE scenario = ? AND set = 'test-extra'", key)}
    assert got == {"host_completion": ("ns", 2500.0, 2500),
                   "attention_decode_rate": ("bytes/s", 1234.5 * 1e6, None),
                   "my_own_figure": ("ns", 7250.0, 7250),
                   "my_own_rate": ("tokens", 3.0, None)}
    r, _ = build.resolve(inp)
    assert r.coefficients.host_completion_ns == 2500
    assert r.coefficients.attention_rate_bps == 1234.5 * 1e6


@pytest.mark.parametrize(("name", "declared", "label"), [
    ("hbm_derate", "us_per_transfer", "a dimensionless factor"),
    ("host_output_token", "dimensionless", "a duration"),
    ("attention_decode_rate", "tokens", "a byte rate"),
    ("engine_workspace_bytes", "bytes_per_us", "a byte count"),
])
def test_units_that_do_not_fit_the_name_are_refused_naming_set_and_file(
        name: str, declared: str, label: str) -> None:
    base = inputs(DS3)
    sets = []
    for cset in base.coefficients:  # change the units of the entry the pool uses, in place
        sets.append(dataclasses.replace(cset, coefficients=tuple(
            dataclasses.replace(e, units=declared) if e.name == name else e
            for e in cset.coefficients)))
    changed = [s for s, old in zip(sets, base.coefficients, strict=True) if s != old]
    assert changed, name
    where = base.sources[f"coefficients:{changed[-1].name}"].file
    with pytest.raises(RefusalError) as err:
        build.resolve(dataclasses.replace(base, coefficients=tuple(sets)))
    assert (err.value.setting, err.value.value) == (name, declared)
    reason = str(err.value)
    index = next(i for i, e in enumerate(changed[-1].coefficients) if e.name == name
                 and e.scope.hardware and base.chip.name in e.scope.hardware)
    for needle in (f"set {changed[-1].name} ({where})", f"coefficients[{index}].{name}.units "
                   f"is '{declared}', but {name} is {label}; accepted units: "):
        assert needle in reason, (needle, reason)
