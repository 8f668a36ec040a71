"""Folder datasets streamed from disk: the same split, fingerprint and results as in memory, in bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedaudit.data import load_dataset, lodo_split
from fedaudit.data.stream import DiskImages


def write_folder(root: Path, domains: list[str], per_class: int, classes: int = 3, side: int = 24, seed: int = 0) -> None:
    """PNG images with a class- and domain-dependent pattern (learnable), plus noise."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for d, dom in enumerate(domains):
        for c in range(classes):
            folder = root / dom / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                arr = rng.integers(0, 60, (side, side, 3), dtype=np.uint8)
                arr[:, c * side // classes:(c + 1) * side // classes, d % 3] += 180
                Image.fromarray(arr).save(folder / f"{i}.png")


def test_streamed_folder_reads_like_the_tensor_it_stands_for(tmp_path):
    write_folder(tmp_path / "data", ["a", "b", "c"], per_class=6)
    (tmp_path / "data" / "b" / "class0" / "broken.png").write_bytes(b"not an image")
    memory = load_dataset(f"folder:{tmp_path / 'data'}", image_size=16)
    stream = load_dataset(f"folder:{tmp_path / 'data'}", image_size=16, cache_mb=0.001)  # ~1 kB cache: 0 images
    assert isinstance(stream.images["a"], DiskImages) and isinstance(memory.images["a"], torch.Tensor)
    assert stream.skipped == memory.skipped == 1  # the same files kept
    assert stream.fingerprint() == memory.fingerprint()
    x, m = stream.images["b"], memory.images["b"]
    assert x.shape == m.shape and len(x) == len(m)
    idx = torch.tensor([5, 0, 3, 3])
    for key in (idx, slice(2, 9), 4, torch.arange(len(m)) % 2 == 0, [1, 2]):
        assert torch.equal(x[key], m[key])
    assert torch.equal(torch.cat([x.take(idx), x.take(torch.tensor([1]))])[:], m[torch.tensor([5, 0, 3, 3, 1])])
    assert torch.equal(x.float(), m.float())  # any other op decodes the view whole
    for bad in (torch.tensor([len(m)]), torch.ones(3, dtype=torch.bool), torch.tensor([0.5]), len(m)):
        with pytest.raises((IndexError, TypeError)):  # where a tensor refuses an index, so does the view
            x[bad]
    for key in (torch.tensor([[0, 1], [2, 3]]), (torch.tensor([1, 2]), slice(None), 0), (2, 1), np.int64(3)):
        assert torch.equal(x[key], m[key])
    import pickle

    assert torch.equal(pickle.loads(pickle.dumps(x))[:], m)  # a copy starts with an empty cache
    sa, sb = lodo_split(stream, "c"), lodo_split(memory, "c")
    for ca, cb in zip(sa.sources, sb.sources):
        assert isinstance(ca.train_x, DiskImages)  # the split stays on disk
        assert torch.equal(ca.train_idx, cb.train_idx) and torch.equal(ca.train_x[:], cb.train_x)
        assert torch.equal(ca.holdout_x[:], cb.holdout_x)


def test_a_streamed_run_gives_the_in_memory_runs_metrics(tmp_path, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="fedaudit")
    from fedaudit.api import evaluate

    write_folder(tmp_path / "data", ["a", "b", "c"], per_class=12)
    # two local epochs: the second pass's order is drawn between two batches' augmentations, from their generator
    opts = dict(dataset=f"folder:{tmp_path / 'data'}", image_size=16, rounds=1, local_epochs=2, batch_size=8,
                attack="deepinversion", victim="a", inversion_iters=3, inversion_batch=3, judge_steps=5, device="cpu")
    memory = evaluate("fedavg", out=str(tmp_path / "memory"), **opts).metrics
    stream = evaluate("fedavg", out=str(tmp_path / "stream"), cache_mb=0.05, **opts).metrics  # 68 of 108 images
    assert "streamed from disk" in caplog.text
    assert memory["provenance"]["dataset_fingerprint"] == stream["provenance"]["dataset_fingerprint"]
    def results(section: object) -> object:  # wall times aside
        if isinstance(section, dict):
            return {k: results(v) for k, v in section.items() if not k.startswith("seconds")}
        return [results(v) for v in section] if isinstance(section, list) else section

    for key in ("accuracy", "communication", "leakage", "verdict"):
        assert json.dumps(results(stream[key]), sort_keys=True) == json.dumps(results(memory[key]), sort_keys=True), key


PEAK = """
import resource, sys, torch
torch.set_num_threads(1)
from fedaudit.api import evaluate
evaluate("fedavg", dataset="folder:" + sys.argv[1], image_size=96, rounds=1, local_epochs=1, batch_size=16,
         attack="none", device="cpu", cache_mb=float(sys.argv[2]), out=sys.argv[3])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
"""


@pytest.mark.slow
def test_streamed_peak_memory_does_not_grow_with_the_dataset(tmp_path):
    """Two folders, one four times the other (decoded: 95 vs 380 MiB at 96 px). In memory the run's peak RSS
    grows by about the difference; streamed with a 4 MB cache it grows by far less."""
    small, large = tmp_path / "small", tmp_path / "large"
    write_folder(small, ["a", "b", "c"], per_class=400, side=96)
    write_folder(large, ["a", "b", "c"], per_class=1600, side=96)

    def peak(folder: Path, cache_mb: float) -> float:
        out = subprocess.run([sys.executable, "-c", PEAK, str(folder), str(cache_mb), str(tmp_path / "runs")],
                             capture_output=True, text=True, check=True)
        return int(out.stdout.strip().splitlines()[-1]) / 1024  # MiB

    grown_in_memory = peak(large, 1e6) - peak(small, 1e6)
    grown_streamed = peak(large, 4) - peak(small, 4)
    decoded_difference = 3 * 3 * 1200 * 3 * 96 * 96 / 2**20  # 3 domains × 3 classes × 1,200 more images
    print(f"peak RSS growth: in memory {grown_in_memory:.0f} MiB, streamed {grown_streamed:.0f} MiB "
          f"(decoded difference {decoded_difference:.0f} MiB)")
    assert grown_in_memory > 0.6 * decoded_difference, (grown_in_memory, decoded_difference)
    assert grown_streamed < 0.25 * decoded_difference, (grown_streamed, grown_in_memory)


def test_batches_are_read_ahead_and_reach_a_cuda_device_through_pinned_memory(tmp_path):
    from fedaudit.simulation.training import Indexed, index_batches
    from tests.fake_cuda import CUDA, fake_cuda

    write_folder(tmp_path / "data", ["a", "b"], per_class=6)
    stream = load_dataset(f"folder:{tmp_path / 'data'}", image_size=16, cache_mb=0.001)
    memory = load_dataset(f"folder:{tmp_path / 'data'}", image_size=16)
    disk, ram = stream.images["b"], memory.images["b"]

    def train_order(images):
        """What a training loop sees when batch order and augmentation share one generator (two passes, so
        the second pass's permutation is drawn between two batches' augmentations)."""
        g = torch.Generator().manual_seed(0)
        seen = []
        with Indexed(images, index_batches(len(ram), 5, g, torch.device("cpu"), epochs=2)) as batched:
            for idx, x in batched:
                seen.append((idx.tolist(), x.clone(), torch.rand(1, generator=g).item()))  # the augmentation's draw
                before = len(asked)
                batched.ahead()
                ahead.append(len(asked) - before)
        return seen

    asked: list[object] = []  # the batches whose records the streamed images were asked to read
    positions = disk.positions
    disk.positions = lambda idx: asked.append(idx) or positions(idx)
    ahead: list[int] = []
    want, got = train_order(ram), train_order(disk)
    assert [(i, a) for i, _, a in got] == [(i, a) for i, _, a in want] and len(got) == 6  # 18 records, batch 5
    assert all(torch.equal(x, y) for (_, x, _), (_, y, _) in zip(got, want))
    # streamed, ahead() started reading the next batch before the loop asked for it (all but the last)
    assert ahead == [0] * 6 + [1, 1, 1, 1, 1, 0]

    batches = [torch.tensor([5, 0, 3]), torch.tensor([], dtype=torch.long), slice(2, 9), torch.tensor([[1, 2], [3, 4]])]
    with fake_cuda() as mode, Indexed(disk.to(CUDA), batches) as batched:
        on_gpu = list(batched)
    assert [x.device.type for _, x in on_gpu] == ["cuda"] * 4
    assert [tuple(x.shape) for _, x in on_gpu] == [tuple(ram[b].shape) for b in batches]
    assert mode.pinned == 4  # each batch decoded into pinned memory, then copied without blocking
