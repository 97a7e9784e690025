"""ModelOutputs validates on construction and says which array is wrong."""

import numpy as np
import pytest
from selbench import DataError, ModelOutputs


def _arrays(n=6, d=3, k=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.normal(size=(n, k)), rng.integers(0, k, size=n)


def test_valid_outputs_are_cast_to_the_contract_dtypes():
    f, z, y = _arrays()
    out = ModelOutputs(features=f, logits=z, labels=y.astype(np.int32))
    assert out.features.dtype == np.float32 and out.logits.dtype == np.float32
    assert out.labels.dtype == np.int64
    assert len(out) == 6 and out.num_classes == 4 and out.feature_dim == 3
    np.testing.assert_allclose(out.probabilities().sum(1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(out.predictions(), np.argmax(z.astype(np.float32), 1))



@pytest.mark.parametrize("k", [2, 3, 10, 1000, 1139])
def test_confidence_is_the_probability_matrix_row_max_bit_for_bit(k):
    """confidence() skips the probability matrix (1 / row sum, in blocks of rows): the same
    float64 values as ``probabilities().max(axis=1)``, across blocks, with tied and extreme
    logits."""
    import selbench.contract.data as data

    rng = np.random.default_rng(k)
    n = data._CONFIDENCE_BLOCK // k + 7  # more than one block
    z = (rng.standard_normal((n, k)) * 4).astype(np.float32)
    z[0] = 0.0  # all tied
    z[1, :2] = [3e38, -3e38]  # the float32 range
    z[2] = np.round(z[2])  # some ties
    out = ModelOutputs(features=np.zeros((n, 1), np.float32), logits=z,
                       labels=rng.integers(0, k, n))
    want = out.probabilities().max(axis=1)
    assert want[0] == 1.0 / k and want[1] == 1.0
    assert np.array_equal(out.confidence().view(np.int64), want.view(np.int64))
    empty = ModelOutputs(features=np.zeros((0, 1)), logits=np.zeros((0, k)), labels=np.zeros(0))
    assert empty.confidence().shape == (0,)

@pytest.mark.parametrize("array", ["features", "logits"])
def test_nan_and_inf_name_the_array(array):
    f, z, y = _arrays()
    bad = {"features": f, "logits": z}
    bad[array][2, 1] = np.nan if array == "features" else np.inf
    with pytest.raises(DataError, match=rf"^{array}: contains NaN or infinite values \(first at index \(2, 1\)\)"):
        ModelOutputs(labels=y, **bad)


def test_row_count_mismatch_names_the_array():
    f, z, y = _arrays()
    with pytest.raises(DataError, match=r"^logits: has 5 rows but labels has 6"):
        ModelOutputs(features=f, logits=z[:5], labels=y)
    with pytest.raises(DataError, match=r"^features: expected a 2-D array"):
        ModelOutputs(features=f[:, 0], logits=z, labels=y)


def test_label_out_of_range():
    f, z, y = _arrays()
    y[3] = 4
    with pytest.raises(DataError, match=r"^labels: values must lie in \[0, 4\) for K=4 classes, found 4"):
        ModelOutputs(features=f, logits=z, labels=y)
    with pytest.raises(DataError, match="labels: expected integer class indices"):
        ModelOutputs(features=f, logits=z, labels=np.full(6, 0.5))


def test_probabilities_passed_as_logits_are_rejected():
    f, z, y = _arrays()
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    with pytest.raises(DataError, match="look like probabilities, not logits"):
        ModelOutputs(features=f, logits=p, labels=y)
    out = ModelOutputs.from_probabilities(p, y)
    np.testing.assert_allclose(out.probabilities(), p, atol=1e-6)
    np.testing.assert_allclose(out.features, p.astype(np.float32))


def test_npz_round_trip_keeps_arrays_domain_and_meta(tmp_path):
    f, z, y = _arrays()
    out = ModelOutputs(features=f, logits=z, labels=y, domain=np.arange(6) % 2, meta={"domains": ["a", "b"]})
    out.to_npz(tmp_path / "o.npz")
    back = ModelOutputs.from_npz(tmp_path / "o.npz")
    np.testing.assert_array_equal(back.features, out.features)
    np.testing.assert_array_equal(back.logits, out.logits)
    np.testing.assert_array_equal(back.labels, out.labels)
    np.testing.assert_array_equal(back.domain, out.domain)
    assert back.meta == {"domains": ["a", "b"]}
    sub = out.subset(np.array([4, 1]))
    np.testing.assert_array_equal(sub.labels, y[[4, 1]])
