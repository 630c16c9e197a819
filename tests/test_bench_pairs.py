"""``bench/pairs.py``: a row per pass, each kernel the same bits as its NumPy form."""

from __future__ import annotations

import pytest

from bench import pairs


def test_small_block_table(capsys):
    assert pairs.main(["--users", "300", "--repeats", "1", "--inner", "1"]) == 0
    out = capsys.readouterr().out
    rows = [ln.strip("|").split(" | ") for ln in out.splitlines() if ln.startswith("| ") and "---" not in ln]
    assert rows[0][0].strip() == "pass" and len(rows) == 5
    assert all(r[-1].strip() == "yes" and r[3].endswith("x") for r in rows[1:])


def test_bad_arguments(capsys):
    with pytest.raises(SystemExit) as exc:
        pairs.main(["--users", "0"])
    assert exc.value.code == 2
    assert "--users" in capsys.readouterr().err
