"""Row files: 1-based line numbers everywhere, every kind of damage named as FILE:LINE."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adora_openrlhf.datafiles import DataFileError, read_rows, read_rows_lenient

LINES = {
    "object": lambda i: json.dumps({"prompt": f"p{i}", "label": str(i)}).encode(),
    "blank": lambda i: b"   ",
    "torn": lambda i: b'{"prompt": "p' + str(i).encode(),
    "array": lambda i: b"[1, 2]",
    "number": lambda i: b"7",
    "latin1": lambda i: b'{"prompt": "caf\xe9"}',
}


@settings(max_examples=150, deadline=None)
@given(kinds=st.lists(st.sampled_from(sorted(LINES)), min_size=1, max_size=12))
def test_lenient_reader_numbers_every_line_from_one(tmp_path_factory, kinds):
    """Property: the rows are exactly the object lines, under their 1-based line numbers; every other
    non-blank line is reported once as FILE:LINE; blank lines are neither."""
    path = tmp_path_factory.mktemp("f") / "rows.jsonl"
    path.write_bytes(b"\n".join(LINES[k](i) for i, k in enumerate(kinds, 1)) + b"\n")
    if all(k == "blank" for k in kinds):
        with pytest.raises(DataFileError, match="holds no rows"):
            read_rows_lenient(path)
        return
    rows, bad = read_rows_lenient(path)
    assert [n for n, _ in rows] == [i for i, k in enumerate(kinds, 1) if k == "object"]
    assert all(r["label"] == str(n) for n, r in rows)
    assert [m.split(":")[1] for m in bad] == [str(i) for i, k in enumerate(kinds, 1) if k not in ("object", "blank")]
    assert all(m.startswith(f"{path}:") for m in bad)
    first_bad = next((i for i, k in enumerate(kinds, 1) if k not in ("object", "blank")), None)
    if first_bad is None:
        assert read_rows(path) == rows
    else:
        with pytest.raises(DataFileError, match=rf"^{path}:{first_bad}: "):
            read_rows(path)


def test_hand_cases(tmp_path):
    p = tmp_path / "a.jsonl"
    p.write_bytes(b'{"a": 1}\n\n{"a": 2\n')
    with pytest.raises(DataFileError, match=r"a.jsonl:3: not valid JSON \(Expecting ',' delimiter at column 8\)"):
        read_rows(p)
    p.write_bytes(b'{"a": 1}\r\n{"a": "\xff"}\r\n')
    with pytest.raises(DataFileError, match=r"a.jsonl:2: not UTF-8 text \(byte 8 of the line\)"):
        read_rows(p)
    j = tmp_path / "b.json"
    j.write_text('[{"a": 1}, 3]')
    with pytest.raises(DataFileError, match=r"b.json:2: item 2 is not a JSON object"):
        read_rows(j)
    j.write_text('{"a": 1}\n{"a": 2}\n')  # JSON Lines saved as .json
    assert [n for n, _ in read_rows(j)] == [1, 2]
    for path, message in ((tmp_path / "none.jsonl", "does not exist"), (tmp_path, "is a directory")):
        with pytest.raises(DataFileError, match=message):
            read_rows(path)
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(DataFileError, match="e.jsonl: data file is empty"):
        read_rows(empty)
    bad_parquet = tmp_path / "x.parquet"
    bad_parquet.write_text("not parquet")
    with pytest.raises(DataFileError, match="x.parquet: cannot read as parquet"):
        read_rows(bad_parquet)
