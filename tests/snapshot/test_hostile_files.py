"""Hostile snapshot files: odd cells are RowErrors, odd files one clear line, nothing hangs.

Each case here broke the build before (a traceback from ``vecsched estimate``,
or a value silently accepted); the fuzz test at the end keeps the whole
family closed: whatever a file holds, the command answers in one line or
estimates, and the rows it did not touch get the figures they would get if
the damaged rows were simply absent.
"""

from __future__ import annotations

import copy
import json
import math
import signal
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vecsched
from vecsched.cli import main
from vecsched.snapshot.cells import MAX_STRING_BYTES, printable_id
from vecsched.snapshot.snapshot import MAX_DEPTH, SnapshotError, json_depth


def _sibling(name: str) -> Any:
    """A test module beside this one, loaded by path (tests are not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_sibling_{name}", Path(__file__).parent / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_bad_input = _sibling("test_bad_input")
J, R, W = _bad_input.J, _bad_input.R, _bad_input.W
base_horde, frames, with_bad_row = _bad_input.base_horde, _bad_input.frames, _bad_input.with_bad_row

LONG = "x" * (MAX_STRING_BYTES + 1)
# Fits by characters but not by bytes: 130 two-byte characters.
LONG_BYTES = "é" * 130

HOSTILE_ROWS = [
    ("lone surrogate worker id", "workers", 1, {**W, "id": "w\ud800"}, "id"),
    ("lone surrogate user id", "requests", 1, {**R, "id": "bad", "user_id": "\udfff"}, "user_id"),
    ("oversized user id", "requests", 1, {**R, "id": "bad", "user_id": LONG}, "user_id"),
    ("oversized by bytes", "workers", 1, {**W, "id": "bad", "user_id": LONG_BYTES}, "user_id"),
    ("oversized model name", "workers", 1, {**W, "id": "bad", "models": ["m", LONG]}, "models"),
    ("oversized request model", "requests", 1, {**R, "id": "bad", "models": [LONG]}, "models"),
    ("oversized bridge agent", "workers", 1, {**W, "id": "bad", "bridge_agent": LONG}, "bridge_agent"),
    ("oversized state tag", "workers", 1, {**W, "id": "bad", "state": LONG}, "state"),
    ("oversized targeted worker", "requests", 1, {**R, "id": "bad", "worker_ids": [LONG]}, "worker_ids"),
    ("oversized id", "requests", 1, {**R, "id": LONG}, "id"),
    ("NUL in an id", "jobs", 1, {**J, "id": "j\x00"}, "id"),
    ("most negative priority", "requests", 1, {**R, "id": "bad", "extra_priority": -(2**63)}, "extra_priority"),
    ("priority past 32 bits", "requests", 1, {**R, "id": "bad", "extra_priority": 2**31}, "extra_priority"),
    ("priority as a float", "requests", 1, {**R, "id": "bad", "extra_priority": 1e300}, "extra_priority"),
    ("integral float threads", "workers", 1, {**W, "id": "bad", "threads": 3.0}, "threads"),
    ("fractional threads", "workers", 1, {**W, "id": "bad", "threads": 3.7}, "threads"),
    ("fractional n", "requests", 1, {**R, "id": "bad", "n": 2.5}, "n"),
    ("maintenance as text", "workers", 1, {**W, "id": "bad", "maintenance": "yes"}, "maintenance"),
    ("maintenance as 1", "workers", 1, {**W, "id": "bad", "maintenance": 1}, "maintenance"),
    ("huge max_pixels", "workers", 0, {**W, "id": "bad", "gentype": "image", "max_pixels": 2**40}, "max_pixels"),
    ("integer beyond int64", "requests", 1, {**R, "id": "bad", "width": 10**30}, "width"),
    ("numeric created", "requests", 1, {**R, "id": "bad", "created": 1.7e9}, "created"),
    ("NaN expiry", "requests", 1, {**R, "id": "bad", "expiry": float("nan")}, "expiry"),
    ("list as a time", "jobs", 1, {**J, "id": "bad", "started": ["2026-11-29T11:59:55Z"]}, "started"),
    ("null required string", "workers", 1, {**W, "id": "bad", "user_id": None}, "user_id"),
]


@pytest.mark.parametrize("case, table, position, row, field", HOSTILE_ROWS, ids=[c[0] for c in HOSTILE_ROWS])
def test_hostile_cell_is_named_and_left_out(case: str, table: str, position: int, row: dict[str, Any], field: str) -> None:
    snapshot = vecsched.load_snapshot(with_bad_row(table, position, row))
    assert len(snapshot.rejected) == 1, [str(e) for e in snapshot.rejected]
    error = snapshot.rejected[0]
    assert (error.table, error.row, error.field) == (table, position, field)
    assert error.id == printable_id(row.get("id"))
    str(error).encode("utf-8")  # printable even when the id is not
    clean = vecsched.load_snapshot(base_horde())
    for (name, got), (_, want) in zip(frames(snapshot), frames(clean)):
        pd.testing.assert_frame_equal(got, want, check_exact=True, obj=name)


def test_a_rejected_id_is_printable_and_short() -> None:
    doc = base_horde()
    doc["requests"].append({**R, "id": "r\ud800" + "y" * 5000})
    (error,) = vecsched.load_snapshot(doc).rejected
    text = str(error)
    text.encode("utf-8")  # a lone surrogate would fail here
    assert len(text) < 200 and "\\ud800" in text


def test_bad_excluded_pair_is_a_row_error() -> None:
    doc = base_horde()
    doc["excluded_pairs"].append(["w1", "r\ud800"])
    doc["excluded_pairs"].append([LONG, "r1"])
    snap = vecsched.load_snapshot(doc)
    assert [(e.table, e.field) for e in snap.rejected] == [("excluded_pairs", "pair")] * 2
    assert len(snap.excluded_pairs) == 1
    json.dumps(snap.to_dict())  # writable back


def test_json_depth_ignores_brackets_in_strings() -> None:
    assert json_depth(b'[[["\\"[[[[[", "\\\\"], {"a": "]]]]"}]]') == 3
    assert json_depth(b"") == 0


# -- whole files ----------------------------------------------------------------------------------


def _cli(tmp_path: Path, capsys: Any, text: str | bytes, *extra: str) -> tuple[int, str, str]:
    path = tmp_path / "snap.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass"))
    code = main(["estimate", str(path), *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(code: int, err: str) -> None:
    assert code in (1, 2)  # 2: not a snapshot; 1: anything else (the output path)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vecsched: "), err
    assert len(lines[0]) < 400


def _doc_text(**changes: Any) -> str:
    doc = base_horde()
    doc.update(changes)
    return json.dumps(doc)


DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(
    "case, text",
    [
        ("deep at the top", DEEP),
        ("deep inside a row", _doc_text(workers=[{**W, "models": json.loads("[" * 500 + "]" * 500)}]).replace(
            '"models": [', '"models": ' + "[" * 4000 + "]" * 4000 + ', "x": [', 1)),
        ("deep in an unknown key", _doc_text().replace('{"format"', '{"junk": ' + DEEP + ', "format"', 1)),
        ("now is NaN", _doc_text(now=float("nan"))),
        ("now is infinite", _doc_text(now=float("inf"))),
        ("now is a huge number", _doc_text().replace('"now": "2026-11-29T12:00:00Z"', '"now": 1e400')),
        ("now is an integer", _doc_text(now=1764417600)),
        ("now is true", _doc_text(now=True)),
        ("now is a list", _doc_text(now=["2026-11-29T12:00:00Z"])),
        ("now is oversized", _doc_text(now="2" * 10_000_000)),
        ("format is oversized", _doc_text(format="f" * 1_000_000)),
        ("truncated", _doc_text()[:-40]),
        ("invalid UTF-8", _doc_text().encode() + b"\xff"),
    ],
)
def test_odd_file_is_one_clear_line(tmp_path: Path, capsys: Any, case: str, text: str | bytes) -> None:
    code, out, err = _cli(tmp_path, capsys, text)
    _one_line(code, err)
    assert out == ""


def test_depth_limit_is_named(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text(DEEP)
    with pytest.raises(SnapshotError, match=f"at most {MAX_DEPTH}"):
        vecsched.load_snapshot(path)


@pytest.mark.parametrize("where", ["missing folder", "a directory", "read-only folder"])
def test_output_path_problem_is_one_line(tmp_path: Path, capsys: Any, where: str) -> None:
    target = {
        "missing folder": tmp_path / "nope" / "out.json",
        "a directory": tmp_path,
        "read-only folder": tmp_path / "ro" / "out.json",
    }[where]
    if where == "read-only folder":
        (tmp_path / "ro").mkdir(mode=0o500)
        if (tmp_path / "ro").stat().st_mode & 0o200 or __import__("os").geteuid() == 0:
            pytest.skip("running as root: permissions do not apply")
    code, _, err = _cli(tmp_path, capsys, _doc_text(), "-o", str(target))
    _one_line(code, err)
    assert str(target) in err


def test_lone_surrogate_id_is_rejected_and_output_is_utf8(tmp_path: Path, capsys: Any) -> None:
    doc = base_horde()
    doc["requests"].append({**R, "id": "r\ud800"})
    out_path = tmp_path / "out.json"
    code, _, err = _cli(tmp_path, capsys, json.dumps(doc), "-o", str(out_path))
    assert code == 0 and "requests[5]" in err and "\\ud800" in err
    estimates = json.loads(out_path.read_text(encoding="utf-8"))["estimates"]
    assert set(estimates) == {"r1", "r2", "r3", "r4", "r5"}


# -- fuzz -----------------------------------------------------------------------------------------

HOSTILE_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, -(2**63), 2**63, 1e300, -1e300, 2.5, 3.0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["\ud800", "a\x00b", LONG, LONG_BYTES, "yes", "2026-11-29T11:59:00", "text", "image", ""]),
    st.lists(st.one_of(st.text(max_size=5), st.integers(), st.just(LONG), st.just("\udc80")), max_size=7),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.integers(min_value=1, max_value=200).map(lambda d: json.loads("[" * d + "]" * d)),
)

TABLE_FIELDS = {table: sorted({k for row in base_horde()[table] for k in row} | extra)
                for table, extra in (("workers", {"maintenance", "max_pixels", "state", "bridge_agent"}),
                                     ("requests", {"extra_priority", "worker_ids", "width", "user_id"}),
                                     ("jobs", {"state"}))}


@st.composite
def damaged_docs(draw: Any) -> tuple[dict[str, Any], set[tuple[str, int]]]:
    doc = base_horde()
    touched: set[tuple[str, int]] = set()
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        table = draw(st.sampled_from(sorted(TABLE_FIELDS)))
        row = draw(st.integers(min_value=0, max_value=len(doc[table]) - 1))
        field = draw(st.sampled_from(TABLE_FIELDS[table]))
        if draw(st.integers(0, 9)) == 0:
            doc[table][row].pop(field, None)
        else:
            doc[table][row][field] = draw(HOSTILE_VALUES)
        touched.add((table, row))
    return doc, touched


class _Hang(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(damaged=damaged_docs())
def test_fuzzed_files_never_traceback_hang_or_move_untouched_rows(tmp_path: Path, damaged: Any) -> None:
    doc, touched = damaged
    path = tmp_path / "fuzz.json"
    # allow_nan: JSON files in the wild carry NaN; surrogatepass: and broken text.
    path.write_bytes(json.dumps(doc, allow_nan=True).encode("utf-8", "surrogatepass"))
    # Only a hang reaches this: one tiny horde estimates in well under a second.
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)
    try:
        try:
            snap = vecsched.load_snapshot(path)
        except SnapshotError as exc:
            assert "\n" not in str(exc)
            return
        got = vecsched.estimate(snap).to_frame()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    # Only damaged rows are rejected...
    rejected = {(e.table, e.row) for e in snap.rejected}
    assert rejected <= touched | {(t, r) for t, r in rejected if t == "excluded_pairs"}, snap.rejected
    for error in snap.rejected:
        str(error).encode("utf-8")
    # ...and every other request's figures are those of the file without the rejected rows.
    clean = copy.deepcopy(doc)
    for table in ("workers", "requests", "jobs"):
        clean[table] = [r for k, r in enumerate(clean[table]) if (table, k) not in rejected]
    want = vecsched.estimate(vecsched.load_snapshot(clean)).to_frame()
    pd.testing.assert_frame_equal(got, want, check_exact=True)
    assert not any(isinstance(v, float) and math.isnan(v) for v in got.index)
