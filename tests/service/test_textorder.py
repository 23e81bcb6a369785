"""The NumPy code point order of strings against Python's sort."""

from __future__ import annotations

from hypothesis import example, given, settings, strategies as st

from vecsched.service.sql.textorder import code_point_order

def _fit(cell: str, width: int) -> str:
    """``cell`` cut or padded to exactly ``width`` UTF-8 bytes (two-byte characters kept where they fit)."""
    while len(cell.encode()) > width:
        cell = cell[:-1]
    return cell + "a" * (width - len(cell.encode()))


# Few characters and short prefixes, so cells share long prefixes and tie often;
# a lone surrogate or a NUL leaves the cells to Python (None).
_CELLS = st.lists(
    st.one_of(
        st.text(alphabet="ab\u00e9\u4e2d\U0001f600", max_size=20),
        st.builds(lambda k, tail: "req-" + "0" * k + tail, st.integers(0, 30), st.text(alphabet="0123z", max_size=3)),
        st.text(max_size=12),
    ),
    max_size=60,
) | st.integers(0, 20).flatmap(  # cells of one width in bytes (ids such as uuids): the matrix route
    lambda width: st.lists(st.text(alphabet="0a-\u00e9", max_size=width).map(lambda c: _fit(c, width)), max_size=60))


@settings(max_examples=400, deadline=None)
@given(_CELLS)
@example(["abcdefgh", "abcdefgh", "abcdefg", "abcdefghi", ""])  # equal cells and cells ending inside a chunk
@example(["x" * 17 + "b", "x" * 17 + "a", "x" * 16, "x" * 24])
@example(["abcdefgh1", "abcdefgh0", "abcdefgh1"])
@example(["\u00e9a", "abc", "a\u00e9", "\u00e9a", "-0a"])  # one width in bytes, not in characters
@example(["\ud800", "a"])
@example(["a\x00b", "a"])
def test_code_point_order_is_pythons_stable_sort(cells: list[str]) -> None:
    order = code_point_order(cells)
    clean = all("\x00" not in c for c in cells) and all(not any(0xD800 <= ord(ch) < 0xE000 for ch in c) for c in cells)
    if not clean and len(cells) > 1:  # one cell or none is in order whatever it holds
        assert order is None
        return
    assert order is not None
    assert order.tolist() == sorted(range(len(cells)), key=cells.__getitem__)


def test_code_point_order_refuses_what_is_not_text() -> None:
    assert code_point_order(["a", 3]) is None
    assert code_point_order(["b", "a"]).tolist() == [1, 0]
