"""``ingest --force`` / ``generate --force`` over a store keep its budget ledger: spent budget is never forgotten."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from streamdp import open_store
from streamdp.cli import main
from streamdp.privacy import GUARANTEE_USER_DP, Ledger, calibrate_gaussian, gaussian_event
from streamdp.privacy.budget import BUDGET_FILE, StoreBudget

DATA = "1\t10\t4\t100\n2\t10\t3\t101\n2\t11\t5\t102\n3\t11\t4\t103\n"


def _ledger(eps, delta):
    return Ledger(method="demo", guarantee=GUARANTEE_USER_DP, epsilon=eps, delta=delta,
                  events=[gaussian_event(calibrate_gaussian(eps, delta))])


def cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r.exit_code, r.output


def test_ingest_force_carries_the_ledger_over(tmp_path):
    data = tmp_path / "r.data"
    data.write_text(DATA * 1)
    s = tmp_path / "s.zarr"
    assert cli("ingest", data, "--out", s, "--budget", "2,1e-2")[0] == 0
    old_checksum = open_store(s).checksum
    b = StoreBudget(s)
    b.complete(b.reserve(_ledger(1.0, delta=1e-3)))
    b.reserve(_ledger(0.5, delta=1e-3))  # a run still going (or killed): reserved, counted
    before = b.show()

    data.write_text(DATA + "4\t12\t2\t104\n")
    code, out = cli("ingest", data, "--out", s, "--force")
    assert code == 0, out
    new = open_store(s)
    assert new.n_users == 4 and new.checksum != old_checksum
    after = StoreBudget(s).show()
    assert after["entries"] == before["entries"] and after["budget"] == before["budget"]
    assert after["spent"] == before["spent"]  # still counted, against the same total
    (h,) = after["history"]
    assert h["event"] == "data replaced" and h["by"] == "ingest" and h["n_entries"] == 2
    assert h["old_checksum"] == old_checksum and h["new_checksum"] == new.checksum
    code, out = cli("budget", s)
    assert code == 0 and "data replaced by ingest" in out and "the 2 release(s) before it still count" in out

    # --budget on a forced ingest changes the total only
    code, out = cli("ingest", data, "--out", s, "--force", "--budget", "3,1e-2")
    assert code == 0, out
    again = StoreBudget(s).show()
    assert again["budget"]["epsilon"] == 3.0 and again["entries"] == before["entries"]
    assert len(again["history"]) == 2
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == []


def test_generate_force_carries_the_ledger_over(tmp_path):
    s = tmp_path / "s.zarr"
    small = ["--users", "200", "--items", "10", "--ratings-per-user", "4", "--rank", "2"]
    assert cli("generate", "--out", s, *small)[0] == 0
    assert cli("budget", s, "--set", "1,1e-4")[0] == 0
    assert cli("generate", "--out", s, *small, "--seed", "9", "--force")[0] == 0
    d = json.loads((s / BUDGET_FILE).read_text())
    assert d["budget"]["epsilon"] == 1.0 and d["history"][0]["by"] == "generate"


def test_corrupt_ledger_refuses_the_replacement(tmp_path):
    data = tmp_path / "r.data"
    data.write_text(DATA)
    s = tmp_path / "s.zarr"
    assert cli("ingest", data, "--out", s)[0] == 0
    (s / BUDGET_FILE).write_text("{torn")
    checksum = open_store(s).checksum
    data.write_text(DATA + "4\t12\t2\t104\n")
    code, out = cli("ingest", data, "--out", s, "--force")
    assert code == 2 and out.strip().splitlines() == [
        f"streamdp: error: {s / BUDGET_FILE}: line 1: corrupt budget ledger (Expecting property name enclosed "
        f"in double quotes)"]
    assert open_store(s).checksum == checksum and (s / BUDGET_FILE).read_text() == "{torn"
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == []


def test_the_writer_does_not_import_the_ledger_and_refuses_a_replacement_without_a_keeper(tmp_path, monkeypatch):
    """The storage layer is below the privacy layer: the package root hands the ledger's part down to it."""
    import numpy as np
    import pytest

    from streamdp.errors import StoreError
    from streamdp.privacy.budget import carried_over
    from streamdp.storage import writer

    assert writer.ledger_keeper().carried_over is carried_over and writer.ledger_keeper().ledger is StoreBudget
    data = tmp_path / "r.data"
    data.write_text(DATA)
    s = tmp_path / "s.zarr"
    assert cli("ingest", data, "--out", s, "--budget", "2,1e-2")[0] == 0
    checksum, ledger = open_store(s).checksum, (s / BUDGET_FILE).read_text()
    monkeypatch.setattr(writer, "_ledger_keeper", None)
    with pytest.raises(StoreError, match="privacy-budget ledger carried over"):
        with writer.StoreWriter(str(s), n_users=2, n_items=2, block_users=2, force=True) as w:
            w.write_block(0, np.array([0, 1, 2]), np.array([0, 1], np.int32), np.array([1.0, 2.0], np.float32))
            w.finalize({"rating_min": 1.0, "rating_max": 5.0, "rating_range_source": "data"})
    assert open_store(s).checksum == checksum and (s / BUDGET_FILE).read_text() == ledger
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == []
