"""YAML limits (aliases, depth, encoding), int64 at decode, and names inside their roots."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline import yamlio
from pipeline.decode import decode
from pipeline.errors import DocumentError
from pipeline.load import Repos, resolve_scenario_path
from pipeline.yamlio import MAX_ALIAS_NODES, read_documents, to_plain

LAUGHS = "\n".join([
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]',
    *(f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi",
                                                                   strict=True))]) + "\n"


def _problem(path: Path) -> str:
    with pytest.raises(DocumentError) as err:
        read_documents(path)
    [problem] = err.value.problems
    return problem.message


def test_a_billion_laughs_is_an_error_before_anything_expands(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No wall-clock bound (the machine is shared): the size is counted without expanding, so
    # the tree builder must never run; the message gives the full size (about 4.9·10^8 nodes).
    def never(*_: object) -> None:
        raise AssertionError("the document was expanded")

    monkeypatch.setattr(yamlio, "_convert", never)
    (tmp_path / "bomb.yaml").write_text(LAUGHS)
    message = _problem(tmp_path / "bomb.yaml")
    assert f"aliases may add at most {MAX_ALIAS_NODES:,} nodes" in message
    assert int(message.split("expand the document to ")[1].split()[0].replace(",", "")) > 10**8


def test_a_few_aliases_still_read_as_written_out(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("x: &x {a: 1, b: [2, 3]}\ny: *x\nz: [*x, *x]\n")
    (tmp_path / "b.yaml").write_text("x: {a: 1, b: [2, 3]}\ny: {a: 1, b: [2, 3]}\n"
                                     "z: [{a: 1, b: [2, 3]}, {a: 1, b: [2, 3]}]\n")
    assert to_plain(read_documents(tmp_path / "a.yaml")[0]) == \
        to_plain(read_documents(tmp_path / "b.yaml")[0])


@pytest.mark.parametrize("content,needle", [
    (b"a: &a [*a]\n", "recursive"),
    (b"[" * 300 + b"]" * 300 + b"\n", "nest"),
    (b"\xff\xfe not text\n", "not UTF-8"),
    (b"a: 1\x00\n", "NUL"),
    (b"\x89PNG\r\n\x1a\n", "UTF-8"),
])
def test_bad_bytes_are_one_line_errors(tmp_path: Path, content: bytes, needle: str) -> None:
    (tmp_path / "x.yaml").write_bytes(content)
    message = _problem(tmp_path / "x.yaml")
    assert needle in message and "\n" not in message


@pytest.mark.parametrize("value,ok", [("9223372036854775807", True),
                                      ("9223372036854775808", False), ("1e20", False),
                                      ("-9223372036854775809", False), ("0x7fffffffffffffff", True)])
def test_integers_beyond_int64_are_an_error_at_decode(tmp_path: Path, value: str,
                                                      ok: bool) -> None:
    from pipeline.documents import Deployment

    text = f"kind: Deployment\nname: d\npools:\n  - role: colocated\n    nodes: 1\n" \
           f"    engine: {{max_num_seqs: {value}}}\n"
    (tmp_path / "d.yaml").write_text(text)
    tree = read_documents(tmp_path / "d.yaml")[0]
    if ok:
        dep, _ = decode(Deployment, tree, "d.yaml")
        assert dep.pools[0].engine.max_num_seqs == int(value, 0)
    else:
        with pytest.raises(DocumentError, match="out of range"):
            decode(Deployment, tree, "d.yaml")


@pytest.mark.parametrize("name", ["../../../../etc/passwd", "..", ".", "a/b", "a\\b",
                                  "x..y", "nul\x00byte", "a" * 300])
def test_a_name_cannot_leave_its_root(name: str) -> None:
    with pytest.raises(DocumentError):
        resolve_scenario_path(name, Repos())


def test_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.yaml"
    outside.write_text("kind: Scenario\n")
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape.yaml").symlink_to(outside)
    (root / "inside.yaml").write_text("kind: Scenario\n")
    assert resolve_scenario_path("inside", Repos(scenarios=root)) == root / "inside.yaml"
    with pytest.raises(DocumentError):
        resolve_scenario_path("escape", Repos(scenarios=root))
