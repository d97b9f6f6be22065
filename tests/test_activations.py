"""resdyn.study_a.activations: streamed layer files equal the collect-then-write path."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from resdyn.artifacts import Activations, BoundaryView
from resdyn.study_a import activations

from helpers.tiny_models import make_model


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_streamed_files_equal_collected(tmp_path, dtype):
    model = make_model("llama")
    rng = np.random.default_rng(0)
    ids = rng.integers(0, model.config.vocab_size, (3, 12))
    sids = np.array([7, 8, 9])
    attrs = {"model_id": "tiny", "samples_hash": "abc", "extra": {"a": 1}}
    states = activations.collect_boundary_states(model, ids, 1, progress=False)
    a = Activations.write(states, sids, 1, tmp_path / "a", dtype, attrs)
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


def test_boundary_view_gives_the_same_geometry_as_reading_everything(tmp_path):
    from resdyn.study_b import geometry

    model = make_model("llama")
    ids = np.random.default_rng(1).integers(0, model.config.vocab_size, (5, 12))
    activations.stream_activation_files(model, ids, np.arange(5), 1, tmp_path, "float32", {}, progress=False)
    full = Activations.read_all_boundaries(tmp_path)
    view = BoundaryView(tmp_path)
    assert view.shape == full.shape
    np.testing.assert_array_equal(view[1:4, 3, 2:, :], full[1:4, 3, 2:, :])
    np.testing.assert_array_equal(view[:, -1, :, :], full[:, -1])
    a = geometry.layer_geometry(full, chunk_samples=2)
    b = geometry.layer_geometry(view, chunk_samples=2)
    num = a.select_dtypes("number").columns
    np.testing.assert_allclose(b[num].to_numpy(float), a[num].to_numpy(float), rtol=1e-12, equal_nan=True)
    with pytest.raises(TypeError):
        view[0]
