"""resdyn.activations: streamed layer files equal the collect-then-write path."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from resdyn import activations
from test_arch import make_model  # noqa: F401


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_streamed_files_equal_collected(tmp_path, dtype):
    model = make_model("llama")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (3, 12))
    sids = np.array([7, 8, 9])
    attrs = {"model_id": "tiny", "samples_hash": "abc", "extra": {"a": 1}}
    states = activations.collect_boundary_states(model, ids, 1, progress=False)
    a = activations.write_activation_files(states, sids, 1, tmp_path / "a", dtype, attrs)
    b = activations.stream_activation_files(model, ids, sids, 1, tmp_path / "b", dtype, attrs, progress=False)
    assert [p.name for p in a] == [p.name for p in b]
    assert not list((tmp_path / "b").glob(".*")), "temporary files left behind"
    for pa, pb in zip(a, b):
        with h5py.File(pa) as fa, h5py.File(pb) as fb:
            assert sorted(fa) == sorted(fb) and dict(fa.attrs) == dict(fb.attrs)
            for key in fa:
                assert fa[key].dtype == fb[key].dtype
                np.testing.assert_array_equal(fa[key][()], fb[key][()])
    with pytest.raises(ValueError, match="skip_positions"):
        activations.stream_activation_files(model, ids, sids, 12, tmp_path / "c", dtype, attrs, progress=False)
