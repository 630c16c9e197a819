"""Hostile or careless input files for ``streamdp ingest``: one line naming the file and the line, or accepted.

* a truncated compressed file (an interrupted download: ``.gz``, ``.bz2``; small, when
  the first 64 KiB already fail, and large, when pyarrow's reader fails mid-stream)
  names the line where its data stops (was a traceback, or "cannot read" without a line);
* a UTF-8 byte-order mark (spreadsheet exports) is accepted: the first header name is
  recognised and a headerless file keeps integer ids (was "unknown column name
  '\\ufeffuser'");
* latin-1 bytes (a file in another encoding) name their line and column (was pyarrow's
  "invalid UTF8 data" without a line), also under ``--skip-bad-lines``;
* a corrupt (not only truncated) compressed stream is one line naming the file.
"""

from __future__ import annotations

import bz2
import gzip

import numpy as np
import pytest
from click.testing import CliRunner

from streamdp.cli import main
from streamdp.storage.store import open_store

HEADER = "user,item,rating\n"


def rows(n_users: int, n_items: int = 40) -> list[str]:
    return [f"{u},{i},{1 + (u * 3 + i) % 5}\n" for u in range(n_users) for i in range(0, n_items, 1 + u % 4)]


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr, r.exception


def assert_error(code, err, exc, *needles):
    assert code == 2, (code, err, exc)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("streamdp: error: ") and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, err)


# --------------------------------------------------------------------------------------
# truncated and corrupt compressed files
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["gz", "bz2"])
@pytest.mark.parametrize("n_users", [60, 4000], ids=["small", "large"])
def test_truncated_compressed_file_names_the_line(tmp_path, codec, n_users):
    text = (HEADER + "".join(rows(n_users))).encode()
    data = (gzip.compress if codec == "gz" else bz2.compress)(text)
    cut = data[: len(data) * 2 // 3]
    src = tmp_path / f"r.csv.{codec}"
    src.write_bytes(cut)
    # where the data stops: the line that the decompressible prefix cuts off
    d = gzip.GzipFile(fileobj=__import__("io").BytesIO(cut)) if codec == "gz" else bz2.BZ2Decompressor()
    if codec == "gz":
        got = b""
        try:
            while chunk := d.read1(1 << 16):
                got += chunk
        except EOFError:
            pass
    else:
        got = d.decompress(cut)
    line = got.count(b"\n") + 1
    code, _, err, exc = run("ingest", src, "--out", tmp_path / "s.zarr")
    assert_error(code, err, exc, f"r.csv.{codec}: line {line}:", "truncated or corrupt")
    assert not (tmp_path / "s.zarr").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [src.name]  # no temporary directory left


def test_corrupt_gzip_names_the_file(tmp_path):
    text = (HEADER + "".join(rows(3000))).encode()
    data = bytearray(gzip.compress(text))
    data[len(data) // 2: len(data) // 2 + 64] = bytes(64)  # zeroed bytes in the middle of the deflate stream
    src = tmp_path / "r.csv.gz"
    src.write_bytes(bytes(data))
    code, _, err, exc = run("ingest", src, "--out", tmp_path / "s.zarr")
    assert_error(code, err, exc, "r.csv.gz: ")
    assert not (tmp_path / "s.zarr").exists()


# --------------------------------------------------------------------------------------
# byte-order mark
# --------------------------------------------------------------------------------------


BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize("header", [True, False])
def test_utf8_bom_is_accepted(tmp_path, header):
    body = "".join(rows(50))
    src = tmp_path / "r.csv"
    src.write_bytes(BOM + ((HEADER if header else "") + body).encode())
    plain = tmp_path / "plain.csv"
    plain.write_text((HEADER if header else "") + body)
    code, _, err, exc = run("ingest", src, "--out", tmp_path / "s.zarr")
    assert code == 0, (err, exc)
    assert run("ingest", plain, "--out", tmp_path / "p.zarr")[0] == 0
    s, p = open_store(tmp_path / "s.zarr"), open_store(tmp_path / "p.zarr")
    assert (s.n_users, s.n_items, s.n_ratings) == (p.n_users, p.n_items, p.n_ratings) == (50, 40, len(rows(50)))
    assert s.checksum == p.checksum  # same ids (integers, not "\ufeff0"), same ratings
    assert np.issubdtype(np.asarray(s.user_ids()).dtype, np.integer)


def test_bom_with_named_columns_and_other_separators(tmp_path):
    src = tmp_path / "r.dat"
    src.write_bytes(BOM + "".join(f"{u}::{i}::{1 + (u + i) % 5}::{100 + i}\n" for u in range(20)
                                  for i in range(5)).encode())
    assert run("ingest", src, "--out", tmp_path / "d.zarr")[0] == 0
    assert open_store(tmp_path / "d.zarr").n_ratings == 100
    csv = tmp_path / "named.csv"
    csv.write_bytes(BOM + ("userId,movieId,score\n" + "".join(rows(10))).encode())
    code, _, err, exc = run("ingest", csv, "--out", tmp_path / "n.zarr", "--columns", "userId,movieId,score")
    assert code == 0, (err, exc)


# --------------------------------------------------------------------------------------
# another encoding
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("skip", [False, True])
def test_latin1_bytes_name_their_line(tmp_path, skip):
    lines = [HEADER] + [f"u{k},{name},4\n" for k, name in enumerate(["pomme", "poire", "kiwi"] * 20)]
    lines[38] = "u99,caf\xe9 cr\xe8me,3\n"  # line 39 of the file
    src = tmp_path / "r.csv"
    src.write_bytes("".join(lines).encode("latin-1"))
    code, _, err, exc = run("ingest", src, "--out", tmp_path / "s.zarr", *(["--skip-bad-lines"] if skip else []))
    assert_error(code, err, exc, "r.csv: line 39:", "not UTF-8", "byte 0xe9 at character 8")
    assert not (tmp_path / "s.zarr").exists()


def test_latin1_in_a_headerless_whitespace_file(tmp_path):
    src = tmp_path / "ratings.txt"
    src.write_bytes(b"".join(b"%d %d 3\n" % (u, i) for u in range(10) for i in range(4)) + b"7 \xe9t\xe9 2\n")
    code, _, err, exc = run("ingest", src, "--out", tmp_path / "s.zarr")
    assert_error(code, err, exc, "ratings.txt: line 41:", "not UTF-8")


def test_damaged_parquet_is_one_line(tmp_path):
    """Zeroed bytes inside a Parquet file's data pages: one line naming the file (was a traceback)."""
    import pandas as pd

    g = np.random.default_rng(0)
    n = 60_000
    pd.DataFrame({"user": g.integers(0, 2000, n), "item": g.integers(0, 300, n),
                  "rating": g.integers(1, 6, n).astype(float)}).to_parquet(tmp_path / "ok.parquet",
                                                                            row_group_size=10_000)
    data = bytearray((tmp_path / "ok.parquet").read_bytes())
    data[len(data) // 3: len(data) // 3 + 2000] = bytes(2000)
    src = tmp_path / "r.parquet"
    src.write_bytes(bytes(data))
    code, _, err, exc = run("ingest", src, "--out", tmp_path / "s.zarr")
    assert_error(code, err, exc, "r.parquet: damaged Parquet data after row ")
    assert not (tmp_path / "s.zarr").exists()
