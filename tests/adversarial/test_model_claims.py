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
    from streamdp.workflows.training import train

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


# -- every other field: the digest of model.json the ledger keeps (issue 40, third round) ----------------------------

@pytest.fixture(scope="module")
def ials_model(trained):
    from streamdp.workflows.training import train

    out = trained / "ials"
    if not out.exists():
        train(str(trained / "s.zarr"), method="ials", out=str(out), epsilon=1.0, delta=1e-5, seed=3, iters=1,
              evaluate_test=False)
    return out


def _recommend_lines(m, tmp_path):
    f = tmp_path / "me.csv"
    f.write_text("item,rating\n1,5\n2,4\n")
    r = run("recommend", m, "--ratings", f)
    return r, r.stderr.strip().splitlines()


@pytest.mark.parametrize("edit", [
    lambda i: i.pop("local_implicit"),
    lambda i: i.__setitem__("local_implicit", False),
    lambda i: i.__setitem__("ridge", "x"),
    lambda i: i["selection"].__setitem__("chart_below", 1000),
    lambda i: i.__setitem__("popularity_column", not i.get("popularity_column")),
    lambda i: i.__setitem__("factors_released", not i.get("factors_released")),
], ids=["no local_implicit", "local_implicit false", "ridge string", "chart_below", "popularity_column",
        "factors_released"])
def test_a_model_json_edited_after_release_is_refused_in_one_line(ials_model, tmp_path, edit):
    """Before: the first three were tracebacks, the last three accepted silently (they change every user's list)."""
    m = tmp_path / "m"
    shutil.copytree(ials_model, m)
    info = json.loads((m / "model.json").read_text())
    info.setdefault("selection", {})
    edit(info)
    (m / "model.json").write_text(json.dumps(info))
    r, lines = _recommend_lines(m, tmp_path)
    assert r.exit_code == 2 and len(lines) == 1 and "Traceback" not in r.output, r.output
    assert "model.json was edited after the model was released" in lines[0], lines


def test_a_ledger_without_the_digest_is_refused(ials_model, tmp_path):
    m = tmp_path / "m"
    shutil.copytree(ials_model, m)
    led = json.loads((m / "privacy.json").read_text())
    del led["model_digest"]
    (m / "privacy.json").write_text(json.dumps(led))
    r, lines = _recommend_lines(m, tmp_path)
    assert r.exit_code == 2 and len(lines) == 1 and "keeps no digest of model.json" in lines[0], r.output


@pytest.mark.parametrize("key,value,said", [("ridge", "x", "ridge is 'x'"), ("local_implicit", False, "local_implicit"),
                                            ("local_implicit", None, "no local_implicit")])
def test_a_malformed_field_behind_a_recomputed_digest_is_one_line(ials_model, tmp_path, key, value, said):
    """Both files edited (the digest recomputed): the field's own check answers, never a traceback."""
    from streamdp.manifest import released_digest

    m = tmp_path / "m"
    shutil.copytree(ials_model, m)
    info = json.loads((m / "model.json").read_text())
    if value is None:
        info.pop(key)
    else:
        info[key] = value
    (m / "model.json").write_text(json.dumps(info))
    led = json.loads((m / "privacy.json").read_text())
    led["model_digest"] = released_digest(info)
    (m / "privacy.json").write_text(json.dumps(led))
    r, lines = _recommend_lines(m, tmp_path)
    assert r.exit_code == 2 and len(lines) == 1 and said in lines[0] and "Traceback" not in r.output, r.output


def test_an_unedited_ials_model_recommends(ials_model, tmp_path):
    r, _ = _recommend_lines(ials_model, tmp_path)
    assert r.exit_code == 0, r.output
