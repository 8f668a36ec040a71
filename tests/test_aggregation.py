"""Averaging mechanics every method relies on."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedaudit.models import build_model
from fedaudit.tensor_ops.aggregation import load_state_, weighted_average_


def test_average_of_identical_clients_is_the_client():
    model = build_model("cnn", 5, 16)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    out = {k: torch.zeros_like(v) for k, v in state.items()}
    weighted_average_(out, [state, state, state], [10, 3, 7])
    for k in state:
        assert torch.allclose(out[k], state[k], atol=1e-6), k


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(0.1, 100), min_size=2, max_size=5))
def test_weighted_mean_matches_the_formula(weights):
    states = [{"w": torch.full((3,), float(i)), "n": torch.tensor(i, dtype=torch.int64)} for i in range(len(weights))]
    out = {"w": torch.zeros(3), "n": torch.tensor(0)}
    weighted_average_(out, states, weights)
    expected = sum(w * i for i, w in enumerate(weights)) / sum(weights)
    assert torch.allclose(out["w"], torch.full((3,), expected), atol=1e-4)
    # the integer counter is the weighted mean rounded to the nearest integer
    # (an exact .5 may go either way under float error)
    assert abs(out["n"].item() - expected) <= 0.5 + 1e-9


def test_the_aggregate_is_the_uploads_mean_whatever_the_server_held():
    """A diverged global model (NaN, inf in its tensors) does not poison the next round's aggregate of finite uploads."""
    out = {"w": torch.tensor([float("nan"), float("inf"), -1.0])}
    weighted_average_(out, [{"w": torch.zeros(3)}, {"w": torch.ones(3)}], [1.0, 3.0])
    assert torch.equal(out["w"], torch.full((3,), 0.75))


def test_load_state_copies_in_place():
    model = build_model("cnn", 5, 16)
    before = {k: v.data_ptr() for k, v in model.state_dict().items()}
    src = {k: torch.randn_like(v.float()).to(v.dtype) for k, v in model.state_dict().items()}
    load_state_(model, src)
    after = model.state_dict()
    assert {k: v.data_ptr() for k, v in after.items()} == before  # same storage: no new tensors
    assert all(torch.equal(after[k], src[k]) for k in src)
