"""A run's per-round progress: one batched host snapshot of the round's tensors, written off the training
thread, with the resume semantics of a synchronous write (issue 38, point 4)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from fedaudit.models import build_model
from fedaudit.run import run_directory
from fedaudit.run.run_directory import HostSnapshot, ProgressWriter
from fedaudit.tensor_ops.aggregation import model_state
from tests.fake_cuda import CUDA, fake_cuda


def _state() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return model_state(build_model("cnn", 10, 16).to(memory_format=torch.channels_last))


def test_a_snapshot_holds_the_tensors_as_they_were_contiguous_and_apart():
    state = _state()
    assert not all(t.is_contiguous() for t in state.values())
    before = {k: t.clone() for k, t in state.items()}
    snap = HostSnapshot(state)
    for t in state.values():  # training goes on changing the live tensors in place
        t.add_(1) if t.is_floating_point() else t.add_(7)
    got = snap.tensors()
    assert list(got) == list(before)
    for k, t in got.items():
        assert t.dtype == before[k].dtype and t.shape == before[k].shape and t.is_contiguous()
        assert torch.equal(t, before[k]), k
    pointers = {t.untyped_storage().data_ptr() for t in got.values()}
    assert len(pointers) == len(got)  # one storage each: safetensors refuses shared ones


def test_a_snapshot_keeps_every_dtype_and_shape():
    odd = {"bf16": torch.arange(5, dtype=torch.bfloat16), "flag": torch.tensor([True, False]), "count": torch.tensor(3),
           "none": torch.zeros(0, 3), "half": torch.ones(2, 2, dtype=torch.float16)}
    got = HostSnapshot(odd).tensors()
    assert all(got[k].dtype == t.dtype and torch.equal(got[k], t) for k, t in odd.items())


def test_a_cuda_snapshot_is_one_pinned_device_to_host_copy_per_dtype():
    """The checkpoint used to copy every tensor to the host one at a time: a synchronisation each."""
    torch.manual_seed(0)
    model = build_model("resnet18", 10, 32)
    with fake_cuda(count_host_copies=True) as mode:
        state = model_state(model.to(CUDA, memory_format=torch.channels_last))
        HostSnapshot(state)
    dtypes = {t.dtype for t in state.values()}
    assert len(state) > 100 and len(mode.host_copies) == len(dtypes) == mode.pinned
    assert sum(b for _, b in mode.host_copies) == sum(t.numel() * t.element_size() for t in state.values())
    with fake_cuda(count_host_copies=True) as mode, mock.patch("fedaudit.run.run_directory.SNAPSHOT_CHUNK_BYTES", 2**20):
        HostSnapshot(state)  # ResNet-18 is 45 MB of fp32: in buffers of at most 1 MB (or one tensor) on the device
    assert len(mode.host_copies) > 20  # many bounded copies, still far fewer than the state's tensors
    assert len(mode.host_copies) < len(state) / 2
    assert sum(b for _, b in mode.host_copies) == sum(t.numel() * t.element_size() for t in state.values())


def test_progress_is_on_disk_when_the_writer_is_left_and_each_round_replaces_the_last(tmp_path):
    state = _state()
    with ProgressWriter(tmp_path) as writer:
        for rnd in (1, 2):
            writer.submit([{"round": r} for r in range(1, rnd + 1)], [{"round": rnd}], state, {"rounds_done": rnd})
    tensors, saved = run_directory.load_checkpoint(tmp_path)
    assert saved == {"rounds_done": 2} and set(tensors) == set(state)
    assert (tmp_path / "history.csv").read_text().splitlines() == ["round", "1", "2"]
    assert (tmp_path / "wire.jsonl").read_text() == '{"round": 2}\n'


def test_a_failed_write_is_raised_not_lost(tmp_path):
    blocked = tmp_path / "run"
    blocked.write_text("a file where the run directory should be")
    writer = ProgressWriter(blocked)
    writer.submit([], [], _state(), {"rounds_done": 1})
    with pytest.raises(OSError):
        writer.submit([], [], _state(), {"rounds_done": 2})  # the previous round's error surfaces here
    writer.submit([], [], _state(), {"rounds_done": 3})
    with pytest.raises(OSError):
        writer.close()


def test_a_cuda_rounds_checkpoint_reaches_the_host_in_one_copy_per_dtype():
    """The whole checkpoint of a CUDA federation — model, wire, client state — not only one model state."""
    from fedaudit.api import run_config
    from fedaudit.data import load_dataset, lodo_split
    from fedaudit.methods import get_method
    from fedaudit.simulation.federation import Federation
    from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, Wire

    ds = load_dataset("digits", 16)
    split = lodo_split(ds, ds.domains[-1], seed=0)
    cfg, _ = run_config("fedavg", None, None, None, {"dataset": "digits", "image_size": 16, "device": "cuda"})
    with fake_cuda(count_host_copies=True) as mode:
        fed = Federation(cfg, get_method("fedavg")(cfg), ds, split, CUDA, Wire())
        fed.setup()
        for client in fed.clients:  # the uploads of a round (its training stops faking: tests/fake_cuda.py)
            fed.send(Artifact(ArtifactKind.FULL_MODEL, client.role, SERVER, 1, model_state(fed.model)))
        tensors, _ = fed.checkpoint()
        HostSnapshot(tensors)
    assert len(tensors) > 60
    assert len(mode.host_copies) == len({t.dtype for t in tensors.values()})


def test_a_kill_between_the_checkpoints_two_halves_leaves_the_last_whole_one(tmp_path, monkeypatch):
    """SIGKILL (a preempted job) between writing a round's tensors and its state: the resume must not pair
    round 2's weights with round 1's state and train round 2 again from them."""
    state = _state()
    run_directory.save_checkpoint(tmp_path, state, {"rounds_done": 1})

    def killed(path, text):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_directory, "write_text", killed)
    moved = {k: t + 1 if t.is_floating_point() else t for k, t in state.items()}
    with pytest.raises(KeyboardInterrupt):
        run_directory.save_checkpoint(tmp_path, moved, {"rounds_done": 2})
    monkeypatch.undo()
    tensors, saved = run_directory.load_checkpoint(tmp_path)
    assert saved == {"rounds_done": 1} and all(torch.equal(tensors[k], t) for k, t in state.items())
    run_directory.save_checkpoint(tmp_path, moved, {"rounds_done": 2})  # the next whole write replaces the pair
    tensors, saved = run_directory.load_checkpoint(tmp_path)
    assert saved == {"rounds_done": 2} and all(torch.equal(tensors[k], t) for k, t in moved.items())
    assert [p.name for p in (tmp_path / run_directory.CHECKPOINT).glob("tensors*")] == ["tensors-r000002.safetensors"]
