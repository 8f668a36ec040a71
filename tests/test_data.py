"""Tests for fedaudit.data: built-in datasets, folder loader, LODO split."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import torch.nn as nn
import torch.nn.functional as F

from fedaudit.data import DATASETS, ClientData, LODOSplit, MultiDomainDataset, load_dataset, lodo_split
from fedaudit.data.shapes import render_domain
from fedaudit.data.split import stratified_split
from fedaudit.errors import FedauditError


@pytest.fixture(scope="module")
def shapes() -> MultiDomainDataset:
    return load_dataset("shapes")


@pytest.fixture(scope="module")
def digits() -> MultiDomainDataset:
    return load_dataset("digits")


# ---------------------------------------------------------------- registry / spec


def test_registry_lists_every_spec():
    assert set(DATASETS) == {"shapes", "shapes:N", "digits", "folder:PATH"}
    assert all(isinstance(v, str) and v and "\n" not in v for v in DATASETS.values())


def test_unknown_dataset_names_the_valid_choices():
    with pytest.raises(FedauditError) as e:
        load_dataset("pacs")
    msg = str(e.value)
    assert "'pacs'" in msg and "shapes" in msg and "digits" in msg and "folder:PATH" in msg
    assert "\n" not in msg


@pytest.mark.parametrize("size", [15, 257, 0, -32, 32.0, True])
def test_image_size_out_of_range(size):
    with pytest.raises(FedauditError, match="image size"):
        load_dataset("shapes", image_size=size)


def test_seed_must_be_an_integer(shapes):
    with pytest.raises(FedauditError, match="seed"):
        load_dataset("digits", seed=1.5)
    with pytest.raises(FedauditError, match="seed"):
        lodo_split(shapes, "sketch", seed="0")
    with pytest.raises(FedauditError, match="seed"):
        lodo_split(shapes, "sketch", seed=True)
    a = lodo_split(shapes, "sketch", seed=np.int64(4))  # numpy integers (e.g. from a config) are fine
    assert torch.equal(a.sources[0].train_idx, lodo_split(shapes, "sketch", seed=4).sources[0].train_idx)


# ---------------------------------------------------------------- shapes


def test_shapes_layout(shapes):
    assert shapes.name == "shapes"
    assert shapes.domains == ["photo", "painting", "cartoon", "sketch"]
    assert len(shapes.classes) == 7 and len(set(shapes.classes)) == 7
    assert shapes.image_size == 32 and shapes.hflip is True and shapes.skipped == 0
    for d in shapes.domains:
        x, y = shapes.images[d], shapes.labels[d]
        assert x.dtype == torch.uint8 and x.shape == (1050, 3, 32, 32) and x.device.type == "cpu"
        assert y.dtype == torch.int64 and y.shape == (1050,)
        assert torch.bincount(y, minlength=7).tolist() == [150] * 7


def test_shapes_deterministic(shapes):
    again = load_dataset("shapes", seed=0)
    assert again.fingerprint() == shapes.fingerprint()
    assert torch.equal(again.images["painting"], shapes.images["painting"])
    assert load_dataset("shapes", seed=1).fingerprint() != shapes.fingerprint()


def test_shapes_render_at_64():
    x, y = render_domain("photo", 64, seed=0, per_class=3)
    assert x.shape == (21, 3, 64, 64) and x.dtype == torch.uint8
    assert torch.bincount(y, minlength=7).tolist() == [3] * 7
    x32, y32 = render_domain("photo", 32, seed=0, per_class=3)
    assert torch.equal(y, y32)  # same scenes, finer pixels
    small = F.interpolate(x.float(), size=32, mode="area")
    assert (small - x32.float()).abs().mean() < 25  # mostly the same picture


def test_shapes_domains_look_different(shapes):
    def stats(d):
        x = shapes.images[d].float() / 255
        grey_gap = (x - x.mean(1, keepdim=True)).abs().mean().item()  # 0 for greyscale
        return x.mean().item(), grey_gap

    sketch_mean, sketch_colour = stats("sketch")
    assert sketch_mean > 0.8 and sketch_colour < 1e-6  # black pencil on white paper
    for d in ("photo", "painting", "cartoon"):
        assert stats(d)[1] > 0.03, d  # coloured
    # cartoon is flat colour (most neighbouring pixels equal); painting's strokes and grain leave almost none
    def flat(d):
        x = shapes.images[d]
        return (x[..., 1:] == x[..., :-1]).all(1).float().mean().item()

    assert flat("cartoon") > 0.5 > 0.2 > max(flat("photo"), flat("sketch")) > 0.02 > flat("painting")


def test_shapes_classes_are_learnable():
    """A tiny CNN learns a domain's classes well above chance in a few seconds."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny convs: one thread is as fast, and immune to a busy machine
    try:
        torch.manual_seed(0)
        x, y = render_domain("cartoon", 32, seed=0, per_class=60)
        x = (x.float() / 255 - 0.5) / 0.5
        xtr, ytr, xte, yte = x[:300], y[:300], x[300:], y[300:]
        layers, c = [], 3
        for w in (16, 32, 64):
            layers += [nn.Conv2d(c, w, 3, padding=1), nn.BatchNorm2d(w), nn.ReLU(), nn.MaxPool2d(2)]
            c = w
        model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 7))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for _ in range(12):
            model.train()
            perm = torch.randperm(len(xtr))
            for k in range(0, len(xtr), 32):
                b = perm[k : k + 32]
                loss = F.cross_entropy(model(xtr[b]), ytr[b])
                opt.zero_grad()
                loss.backward()
                opt.step()
        model.eval()
        with torch.no_grad():
            acc = (model(xte).argmax(1) == yte).float().mean().item()
    finally:
        torch.set_num_threads(threads)
    assert acc > 0.5, acc  # chance is 1/7


# ---------------------------------------------------------------- shapes:N (size)


def test_shapes_size_spec_renders_n_per_class_deterministically(shapes):
    assert load_dataset("shapes:150").fingerprint() == shapes.fingerprint()  # plain shapes is shapes:150, byte for byte
    small = load_dataset("shapes:12", image_size=16)
    assert small.name == "shapes:12" and small.domains == shapes.domains and small.classes == shapes.classes
    for d in small.domains:
        assert small.images[d].shape == (84, 3, 16, 16) and small.images[d].dtype == torch.uint8
        assert torch.bincount(small.labels[d], minlength=7).tolist() == [12] * 7
    assert load_dataset("shapes:12", image_size=16).fingerprint() == small.fingerprint()
    assert load_dataset("shapes:12", image_size=16, seed=1).fingerprint() != small.fingerprint()
    assert load_dataset("shapes:13", image_size=16).fingerprint() != small.fingerprint()


@pytest.mark.parametrize("spec", ["shapes:", "shapes:abc", "shapes:9", "shapes:1001", "shapes:37.5", "shapes:-40",
                                  "shapes: 375", "shapes:1e3", "shapes:375:2"])
def test_bad_shapes_size_names_the_fix(spec):
    with pytest.raises(FedauditError) as e:
        load_dataset(spec)
    msg = str(e.value)
    assert repr(spec) in msg and "shapes:N" in msg and "shapes:375" in msg and "10 to 1000" in msg and "\n" not in msg


def test_shapes_375_leaves_every_source_client_1000_non_members():
    """Membership TPR at 1% FPR is resolved from 1,000 non-members (a client's holdout) on; shapes:375
    gives every source client that many at the default split, whichever domain is the target."""
    from fedaudit.statistics.membership_statistics import min_nonmembers

    big = load_dataset("shapes:375")
    for d in big.domains:
        assert big.images[d].shape == (2625, 3, 32, 32)
        assert torch.bincount(big.labels[d], minlength=7).tolist() == [375] * 7
    holdouts = {c.holdout_idx.numel() for t in big.domains for c in lodo_split(big, t).sources}
    assert holdouts == {1051} and min(holdouts) >= min_nonmembers(0.01) == 1000  # 1,051: the number DATASETS states
    assert "1,051" in DATASETS["shapes:N"]


# ---------------------------------------------------------------- fingerprint


def test_fingerprint_ignores_name_and_sees_one_pixel(digits):
    def clone(ds, name):
        return MultiDomainDataset(
            name=name,
            classes=list(ds.classes),
            domains=list(ds.domains),
            images={d: t.clone() for d, t in ds.images.items()},
            labels={d: t.clone() for d, t in ds.labels.items()},
        )

    a = clone(digits, "folder:/somewhere")
    assert a.fingerprint() == digits.fingerprint()
    assert re.fullmatch("[0-9a-f]{16}", a.fingerprint()), a.fingerprint()  # 64 bits of the digest, as hex
    a.images["rotated"][7, 1, 3, 4] ^= 1
    assert a.fingerprint() != digits.fingerprint()
    b = clone(digits, "digits")
    b.labels["clean"][0] = (b.labels["clean"][0] + 1) % 10
    assert b.fingerprint() != digits.fingerprint()


# ---------------------------------------------------------------- digits


def test_digits_layout(digits):
    assert digits.domains == ["clean", "colour", "rotated", "textured"]
    assert digits.classes == [str(i) for i in range(10)]
    assert digits.hflip is False and digits.image_size == 32
    for d in digits.domains:
        x = digits.images[d]
        assert x.dtype == torch.uint8 and x.shape[1:] == (3, 32, 32)
        assert digits.labels[d].dtype == torch.int64


def test_digits_partitions_are_disjoint_stratified_and_real(digits):
    from sklearn.datasets import load_digits

    target = torch.from_numpy(load_digits().target.astype(np.int64))
    assert digits.source_index is not None
    rows = [digits.source_index[d] for d in digits.domains]
    every = torch.cat(rows)
    assert every.numel() == 1797 and torch.equal(every.sort().values, torch.arange(1797))  # disjoint + covering
    for d, r in zip(digits.domains, rows):
        assert torch.equal(digits.labels[d], target[r])  # each record keeps its true label
    counts = torch.stack([torch.bincount(digits.labels[d], minlength=10) for d in digits.domains])
    assert (counts.max(0).values - counts.min(0).values).max() <= 1  # stratified by class


def test_digits_seed(digits):
    same = load_dataset("digits", seed=0)
    assert same.fingerprint() == digits.fingerprint()
    other = load_dataset("digits", seed=3)
    assert other.fingerprint() != digits.fingerprint()
    assert not torch.equal(other.source_index["clean"].sort().values, digits.source_index["clean"].sort().values)


def test_digits_domains_render_as_described(digits):
    clean = digits.images["clean"].float() / 255
    textured = digits.images["textured"].float() / 255
    colour = digits.images["colour"].float() / 255
    assert clean.mean() < 0.35  # light ink on black
    ground = textured[:, :, 0, 0].mean(1)  # the corner is always background
    assert (ground < 0.4).float().mean() > 0.3 and (ground > 0.6).float().mean() > 0.3  # dark and light grounds
    assert (textured - textured.mean(1, keepdim=True)).abs().mean() > 0.03  # coloured texture
    assert torch.equal(digits.images["clean"][:, 0], digits.images["clean"][:, 2])  # grey
    assert (colour - colour.mean(1, keepdim=True)).abs().mean() > 0.05  # coloured


# ---------------------------------------------------------------- LODO split


def test_split_disjoint_covering_stratified(shapes):
    sp = lodo_split(shapes, "sketch", seed=0)
    assert isinstance(sp, LODOSplit) and sp.target == "sketch"
    assert [c.domain for c in sp.sources] == ["photo", "painting", "cartoon"]
    assert torch.equal(sp.target_x, shapes.images["sketch"]) and torch.equal(sp.target_y, shapes.labels["sketch"])
    for c in sp.sources:
        assert isinstance(c, ClientData)
        n = shapes.labels[c.domain].numel()
        idx = torch.cat([c.train_idx, c.val_idx, c.holdout_idx])
        assert idx.dtype == torch.int64
        assert torch.equal(idx.sort().values, torch.arange(n))  # disjoint and covering
        assert (c.train_idx.numel(), c.val_idx.numel(), c.holdout_idx.numel()) == (525, 105, 420)
        for part, fr in ((c.train_idx, 0.5), (c.val_idx, 0.1), (c.holdout_idx, 0.4)):
            per_class = torch.bincount(shapes.labels[c.domain][part], minlength=7).float()
            assert ((per_class - 150 * fr).abs() <= 1).all()  # stratified
        assert torch.equal(c.train_x, shapes.images[c.domain][c.train_idx])
        assert torch.equal(c.holdout_y, shapes.labels[c.domain][c.holdout_idx])
        assert torch.equal(c.val_x, shapes.images[c.domain][c.val_idx])


def test_split_seeded_and_independent_of_target(shapes):
    a = lodo_split(shapes, "sketch", seed=0)
    b = lodo_split(shapes, "sketch", seed=0)
    c = lodo_split(shapes, "sketch", seed=1)
    assert all(torch.equal(x.train_idx, y.train_idx) for x, y in zip(a.sources, b.sources))
    assert not torch.equal(a.sources[0].train_idx, c.sources[0].train_idx)
    # a client keeps its members whichever domain is held out
    d = lodo_split(shapes, "photo", seed=0)
    assert torch.equal(a.sources[1].train_idx, d.sources[0].train_idx)  # both are 'painting'
    assert a.sources[1].domain == d.sources[0].domain == "painting"


def test_split_custom_fractions_uneven_classes(digits):
    sp = lodo_split(digits, "clean", fractions=(0.6, 0.2, 0.2), seed=5)
    for c in sp.sources:
        n = digits.labels[c.domain].numel()
        assert c.train_idx.numel() == round(n * 0.6) and c.val_idx.numel() == round(n * 0.2)
        assert c.train_idx.numel() + c.val_idx.numel() + c.holdout_idx.numel() == n


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(st.integers(0, 5), min_size=1, max_size=300),
    raw=st.tuples(*[st.floats(0.05, 1.0)] * 3),
    seed=st.integers(0, 2**31),
)
def test_stratified_split_properties(labels, raw, seed):
    y = torch.tensor(labels, dtype=torch.int64)
    fr = tuple(r / sum(raw) for r in raw)
    parts = stratified_split(y, fr, torch.Generator().manual_seed(seed))
    every = torch.cat(parts)
    assert torch.equal(every.sort().values, torch.arange(len(y)))  # disjoint and covering
    assert parts[0].numel() == round(len(y) * fr[0]) and parts[1].numel() == min(
        round(len(y) * fr[1]), len(y) - parts[0].numel()
    )
    for part, f in zip(parts, fr):
        for c in y.unique():
            n_c = (y == c).sum().item()
            assert abs((y[part] == c).sum().item() - n_c * f) < 3.5  # proportional per class
    again = stratified_split(y, fr, torch.Generator().manual_seed(seed))
    assert all(torch.equal(a, b) for a, b in zip(parts, again))


def test_client_to_moves_every_tensor(shapes):
    c = lodo_split(shapes, "sketch").sources[0]
    moved = c.to("cpu")
    assert moved is not c and moved.domain == c.domain
    assert torch.equal(moved.train_x, c.train_x) and torch.equal(moved.holdout_idx, c.holdout_idx)


def test_unknown_target_names_valid_domains(shapes):
    with pytest.raises(FedauditError) as e:
        lodo_split(shapes, "art")
    msg = str(e.value)
    assert "'art'" in msg and all(d in msg for d in shapes.domains) and "\n" not in msg


@pytest.mark.parametrize(
    "fractions", [(0.5, 0.5, 0.1), (0.6, 0.5, -0.1), (1.0, 0.0, 0.0), (0.5, 0.5), (0.5, 0.1, 0.4, 0.0), ("a", 1, 1)]
)
def test_bad_fractions(shapes, fractions):
    with pytest.raises(FedauditError, match="fractions"):
        lodo_split(shapes, "sketch", fractions=fractions)


def test_fractions_tolerate_rounding(shapes):
    """0.7+0.1+0.2 != 1.0 exactly in floats: accepted, and every record of each source lands in one part, in those
    proportions."""
    split = lodo_split(shapes, "sketch", fractions=(0.7, 0.1, 0.2))
    for client in split.sources:
        parts = [client.train_idx, client.val_idx, client.holdout_idx]
        n = len(shapes.labels[client.domain])
        assert sorted(torch.cat(parts).tolist()) == list(range(n)), client.domain
        assert [round(len(p) / n, 1) for p in parts] == [0.7, 0.1, 0.2], [len(p) for p in parts]


def _tiny(n_per_domain: int) -> MultiDomainDataset:
    images = {d: torch.zeros(n_per_domain, 3, 16, 16, dtype=torch.uint8) for d in ("a", "b")}
    labels = {d: torch.zeros(n_per_domain, dtype=torch.int64) for d in ("a", "b")}
    return MultiDomainDataset(name="tiny", classes=["x"], domains=["a", "b"], images=images, labels=labels)


def test_split_refuses_empty_parts():
    with pytest.raises(FedauditError, match="'a'.*empty"):
        lodo_split(_tiny(3), "b")
    sp = lodo_split(_tiny(10), "b")  # 5 / 1 / 4
    assert [len(sp.sources[0].train_idx), len(sp.sources[0].val_idx), len(sp.sources[0].holdout_idx)] == [5, 1, 4]


# ---------------------------------------------------------------- folder


def _write_tree(root: Path, layout: dict[str, dict[str, int]], size=(20, 12)) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for dom, classes in layout.items():
        for cls, n in classes.items():
            (root / dom / cls).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
                Image.fromarray(arr).save(root / dom / cls / f"img{i}.png")


def test_folder_loads_skips_and_counts(tmp_path, caplog):
    from PIL import Image

    root = tmp_path / "my data"
    _write_tree(root, {"art painting": {"dög": 3, "cat & <b>": 2}, "sketch": {"dög": 2, "cat & <b>": 2}})
    (root / "sketch" / "dög" / "broken.jpg").write_bytes(b"this is not an image")
    good = root / "sketch" / "cat & <b>" / "trunc.jpg"
    Image.fromarray(np.full((64, 64, 3), 200, np.uint8)).save(good, quality=90)
    good.write_bytes(good.read_bytes()[:200])  # truncated JPEG: header fine, data cut
    (root / "sketch" / "dög" / ".DS_Store").write_bytes(b"junk")  # hidden: ignored, not "skipped"
    (root / ".cache").mkdir()  # hidden domain: ignored
    Image.fromarray(np.zeros((5, 5), np.uint8), mode="L").save(root / "art painting" / "dög" / "grey.png")

    with caplog.at_level(logging.WARNING, logger="fedaudit"):
        ds = load_dataset(f"folder:{root}", image_size=16)
    assert ds.domains == ["art painting", "sketch"]
    assert ds.classes == ["cat & <b>", "dög"]
    assert ds.skipped == 2
    warning = next(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "skipped 2" in warning and "broken.jpg" in warning and "trunc.jpg" in warning  # names the files
    assert ds.images["art painting"].shape == (6, 3, 16, 16) and ds.images["art painting"].dtype == torch.uint8
    assert ds.images["sketch"].shape == (4, 3, 16, 16)
    assert torch.bincount(ds.labels["art painting"]).tolist() == [2, 4]
    assert ds.name == f"folder:{root}"
    lodo_split(ds, "sketch", fractions=(0.5, 0.17, 0.33))  # usable downstream


def test_folder_expands_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    _write_tree(tmp_path / "pacs", {"a": {"c": 1}, "b": {"c": 1}})
    ds = load_dataset("folder:~/pacs", image_size=16)
    assert ds.domains == ["a", "b"]


def test_folder_class_sets_must_match(tmp_path):
    _write_tree(tmp_path, {"cartoon": {"dog": 1, "cat": 1}, "photo": {"dog": 1, "cat": 1}, "sketch": {"dog": 1, "horse": 1}})
    with pytest.raises(FedauditError) as e:
        load_dataset(f"folder:{tmp_path}")
    msg = str(e.value)
    assert "'cartoon'" in msg and "'sketch'" in msg and "cat" in msg and "horse" in msg and "\n" not in msg


def test_folder_errors(tmp_path):
    with pytest.raises(FedauditError, match="does not exist.*<domain>/<class>/<image>"):
        load_dataset(f"folder:{tmp_path / 'nope'}")
    (tmp_path / "archive.zip").write_bytes(b"PK")
    with pytest.raises(FedauditError, match="is a file, not a folder"):
        load_dataset(f"folder:{tmp_path / 'archive.zip'}")
    with pytest.raises(FedauditError, match="no path"):
        load_dataset("folder:")
    _write_tree(tmp_path / "one", {"only": {"c": 2}})
    with pytest.raises(FedauditError, match="at least 2"):
        load_dataset(f"folder:{tmp_path / 'one'}")
    _write_tree(tmp_path / "empty", {"a": {"c": 2}})
    (tmp_path / "empty" / "b" / "c").mkdir(parents=True)
    with pytest.raises(FedauditError, match="'b'.*no images"):
        load_dataset(f"folder:{tmp_path / 'empty'}")
    _write_tree(tmp_path / "junk", {"a": {"c": 2}})
    (tmp_path / "junk" / "b" / "c").mkdir(parents=True)
    (tmp_path / "junk" / "b" / "c" / "x.png").write_bytes(b"nope")
    with pytest.raises(FedauditError, match="'b'.*no readable images"):
        load_dataset(f"folder:{tmp_path / 'junk'}")
