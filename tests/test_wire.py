"""The wire's ledger (bytes) and views (who saw what) — the audit's evidence."""

import torch

from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, Wire, client_role


def _art(kind, sender, receiver, rnd, **tensors):
    return Artifact(kind, sender, receiver, rnd, tensors)


def test_bytes_are_numel_times_element_size():
    wire = Wire()
    wire.send(_art(ArtifactKind.FULL_MODEL, client_role("a"), SERVER, 1, w=torch.zeros(10, 3), n=torch.zeros(4, dtype=torch.int64)))
    wire.send(_art(ArtifactKind.FULL_MODEL, SERVER, client_role("a"), 1, w=torch.zeros(5, dtype=torch.float16)))
    s = wire.summary()
    assert s["bytes_up"] == 10 * 3 * 4 + 4 * 8
    assert s["bytes_down"] == 5 * 2
    assert s["by_kind"]["full_model"] == {"up": 152, "down": 10}


def test_sent_tensors_do_not_change_when_the_sender_keeps_training():
    wire = Wire()
    w = torch.ones(3)
    got = wire.send(_art(ArtifactKind.FULL_MODEL, client_role("a"), SERVER, 1, w=w))
    w.add_(5)
    assert torch.equal(got["w"], torch.ones(3))
    assert torch.equal(wire.view(SERVER).latest(ArtifactKind.FULL_MODEL).tensors["w"], torch.ones(3))


def test_views_follow_the_threat_model():
    wire = Wire()
    a, b = client_role("a"), client_role("b")
    wire.send(_art(ArtifactKind.FULL_MODEL, SERVER, a, 1, g=torch.zeros(1)))
    wire.send(_art(ArtifactKind.FULL_MODEL, SERVER, b, 1, g=torch.zeros(1)))
    wire.send(_art(ArtifactKind.STYLE_BANK, a, SERVER, 1, s=torch.zeros(2)))
    wire.send(_art(ArtifactKind.STYLE_BANK, b, SERVER, 1, s=torch.zeros(2)))
    server = wire.view(SERVER)
    assert {x.sender for x in server.of_kind(ArtifactKind.STYLE_BANK)} == {a, b}
    seen_by_a = wire.view(a)
    # A curious client sees what was sent to it (and its own uploads), never another client's upload.
    assert all(b not in (x.sender, x.receiver) for x in seen_by_a)
    assert {x.kind for x in seen_by_a} == {ArtifactKind.FULL_MODEL, ArtifactKind.STYLE_BANK}


def test_latest_keeps_the_newest_round_only_in_memory():
    wire = Wire()
    for rnd in (1, 2, 3):
        wire.send(_art(ArtifactKind.FULL_MODEL, client_role("a"), SERVER, rnd, w=torch.full((2,), float(rnd))))
    view = wire.view(SERVER)
    assert len(view) == 1 and view.latest(ArtifactKind.FULL_MODEL).round == 3
    assert len(wire.ledger) == 3  # the ledger still counts every message


def test_keep_artifacts_writes_each_message_as_safetensors(tmp_path):
    from safetensors.torch import load_file

    wire = Wire(tmp_path / "artifacts")
    for rnd in (1, 2):
        wire.send(_art(ArtifactKind.FULL_MODEL, client_role("a b/c"), SERVER, rnd, w=torch.full((2,), float(rnd))))
    files = sorted((tmp_path / "artifacts").glob("*.safetensors"))
    assert len(files) == 2
    assert torch.equal(load_file(str(files[0]))["w"], torch.ones(2))
