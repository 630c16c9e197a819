"""``model.json``'s claims must agree with ``privacy.json`` (the ledger); reports take them from the ledger.

Before: editing only ``epsilon`` in ``model.json`` to 0.01 made ``evaluate --json`` report
0.01 (the ledger says 1), and editing ``method`` had ``evaluate`` call an als model "oja".
Now every field both files carry is compared when the model is loaded, and a difference
is one line naming the field and both files.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from streamdp.cli import main


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from streamdp.storage.generate import generate_store
    from streamdp.training import train

    d = tmp_path_factory.mktemp("claims")
    st = generate_store(str(d / "s.zarr"), n_users=300, n_items=40, ratings_per_user=8, rank=2, seed=4,
                        test_fraction=0.2)
    train(st, method="als", out=str(d / "m"), epsilon=1.0, delta=1e-5, rank=2, seed=3, evaluate_test=False)
    return d


def edited(trained, tmp_path, **changes):
    out = tmp_path / "m"
    shutil.copytree(trained / "m", out)
    info = json.loads((out / "model.json").read_text())
    for k, v in changes.items():
        if isinstance(v, dict) and isinstance(info.get(k), dict):
            info[k] = {**info[k], **v}
        else:
            info[k] = v
    (out / "model.json").write_text(json.dumps(info))
    return out


def run(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    return r


def test_evaluate_reports_the_ledger(trained):
    r = run("evaluate", trained / "m", trained / "s.zarr", "--json")
    assert r.exit_code == 0, r.output
    ev = json.loads(r.stdout)
    assert ev["epsilon"] == 1.0 and ev["method"] == "als"


@pytest.mark.parametrize("changes,field", [
    ({"epsilon": 0.01}, "epsilon"),
    ({"epsilon": "inf"}, "epsilon"),
    ({"method": "oja"}, "method"),
    ({"delta": 0.5}, "delta"),
    ({"seed": None}, "seed"),
    ({"store_fingerprint": "hmac-sha256:00"}, "store_fingerprint"),
    ({"n_users": 5}, "n_users"),
    ({"rating_range": {"max": 10.0}}, "rating_range.max"),
])
def test_an_edited_claim_is_refused_in_one_line(trained, tmp_path, changes, field):
    m = edited(trained, tmp_path, **changes)
    for args in (["evaluate", m, trained / "s.zarr", "--json"], ["evaluate", m, trained / "s.zarr"],
                 ["recommend", m, "--store", trained / "s.zarr", "--out", tmp_path / "r.parquet"]):
        r = run(*args)
        assert r.exit_code == 2, (args, r.output)
        lines = r.stderr.strip().splitlines()
        assert r.stdout == "" and len(lines) == 1, r.output
        assert f"disagree on {field}" in lines[0] and "model.json" in lines[0] and "privacy.json" in lines[0], lines
    assert not (tmp_path / "r.parquet").exists()
