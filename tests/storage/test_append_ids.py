"""``ingest --append`` maps the input's user ids onto the store's reading the store's ids a slice of blocks at a
time: the same indices whatever the slice (one block, several, all), segments' new users included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import streamdp
from streamdp.storage import append as A
from streamdp.storage.store import open_store


@pytest.mark.parametrize("ids", ["int", "str"])
def test_users_onto_reads_any_slice_of_blocks_alike(tmp_path, ids):
    rng = np.random.default_rng(4)
    name = (lambda u: f"u{u:05d}") if ids == "str" else (lambda u: int(u) * 3 + 11)
    base = pd.DataFrame({"user": [name(u) for u in rng.integers(100, 400, 3000)], "item": rng.integers(0, 30, 3000),
                         "rating": rng.integers(1, 6, 3000).astype(float)})
    more = pd.DataFrame({"user": [name(u) for u in rng.integers(0, 150, 500)], "item": rng.integers(0, 30, 500),
                         "rating": rng.integers(1, 6, 500).astype(float)})
    out = str(tmp_path / "s.zarr")
    streamdp.ingest(base, out, block_users=16, rating_range=(1, 5))
    streamdp.ingest(more, out, append=True)  # new users with smaller ids: a block unsorted
    st = open_store(out)
    bu = st.info.block_users
    probe = sorted({name(u) for u in rng.integers(0, 700, 900)})
    keys = pa.array(probe, pa.string() if ids == "str" else pa.int64())
    per_id = A._STR_ID_BYTES if ids == "str" else 8
    results = [A._users_onto(keys, st, limit) for limit in (1, 32 * per_id * bu * 3, 1 << 40)]
    store_ids = list(st.user_ids())
    for index, new in results:
        np.testing.assert_array_equal(index, results[0][0])
        assert new.to_pylist() == results[0][1].to_pylist()
        old = index < st.info.n_users
        assert [store_ids[i] for i in index[old]] == [p for p, o in zip(probe, old) if o]
        assert set(new.to_pylist()) == set(probe) - set(store_ids)
