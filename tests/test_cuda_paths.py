"""The CUDA branches, held on a CPU: channels_last training, the wire's layout, vmapped victims and reference
models, bf16 autocast, and every attack's inputs on the device (issue 38).

The GPU path had never run: on a GPU the card's command crashed as deepinversion started (cuDNN's BatchNorm
asks for a layout ``vmap`` cannot answer when the victims' states are ``channels_last``), and every test pinned
the CPU. Here the CUDA code runs under :func:`tests.fake_cuda.fake_cuda` — the same dispatch, layouts and device
checks as on a GPU, no data — up to where faking stops: the first backward pass or the first read of a value.
Each test names that place, so a test that stopped earlier than it should fails too. One test forces
channels_last on the CPU with real numbers and checks what crosses the wire and what the engine stacks.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import pytest
import torch
from torch import Tensor

from fedaudit.api import run_config
from fedaudit.attack import Access, AttackerPrior, attack_setup
from fedaudit.attacks import ATTACKS
from fedaudit.attacks.deepinversion import DeepInversion
from fedaudit.attacks.deepinversion import engine
from fedaudit.attacks.deepinversion.engine import InversionSettings, InversionTarget, invert
from fedaudit.attacks.mia.reference_models import inclusion_masks, train_reference_models
from fedaudit.audit.session import attacker_prior, run_attacks
from fedaudit.data import load_dataset, lodo_split
from fedaudit.methods import METHODS, get_method
from fedaudit.models import build_model
from fedaudit.tensor_ops.aggregation import model_state
from fedaudit.simulation.federation import Federation
from fedaudit.simulation.recipes import SGDRecipe
from fedaudit.simulation.training import Preprocess
from fedaudit.simulation.wire import SERVER, Artifact, ArtifactKind, Wire, WireView
from tests.fake_cuda import CUDA, PROJECT, is_own_code, run_faked

SIZE = 16
TINY = dict(dataset="digits", image_size=SIZE, rounds=1, local_epochs=1, batch_size=32, judge_steps=2,
            inversion_iters=2, reference_models=2)

# Where a round stops under faking: local training's first backward pass (ELCFS's in its episodic update),
# or, for FedSB, MixStyle's Beta draw (no fake kernel) in the first forward pass.
FIRST_STOP = {"fedsb": "unfaked mixstyle.py:forward", "elcfs": "backward elcfs.py:episodic_backward"}


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits", SIZE)
    return ds, lodo_split(ds, ds.domains[-1], seed=0)


def test_where_faking_stopped_is_told_by_the_projects_packages_not_by_a_path_prefix():
    """Issue 46: with a virtual environment inside the checkout (the layout a newcomer makes), torch's frames
    under .venv/…/site-packages lie under the checkout too and were taken for the project's."""
    venv_torch = PROJECT / ".venv/lib/python3.11/site-packages/torch/autograd/graph.py"
    assert not is_own_code(str(venv_torch))
    assert not is_own_code(str(PROJECT / "tests/test_cuda_paths.py"))
    assert is_own_code(str(PROJECT / "fedaudit/simulation/training.py"))
    assert is_own_code(str(PROJECT / "attacks/deepinversion/engine.py"))


def _config(method: str, **options):
    cfg, _ = run_config(method, None, None, None, {**TINY, "device": "cuda", **options})
    return cfg


def _uploads(fed: Federation) -> None:
    """Every client's FULL_MODEL upload after a round, as FedAvg sends it (local training's backward pass is
    where faking stops, so the round cannot send them itself)."""
    with torch.no_grad():
        for client in fed.clients:
            fed.send(Artifact(ArtifactKind.FULL_MODEL, client.role, SERVER, 1, model_state(fed.model)))


def _sent(wire: Wire) -> dict[str, Tensor]:
    return {f"{a.kind.value}/{a.sender}->{a.receiver}/{k}": t for a in wire.retained.values() for k, t in a.tensors.items()}


def _channels_last(model: torch.nn.Module) -> bool:
    convs = [p for p in model.parameters() if p.dim() == 4]
    return bool(convs) and all(p.is_contiguous(memory_format=torch.channels_last) for p in convs)


@pytest.mark.parametrize("method,precision", [(m, "fp32") for m in METHODS] + [("fedavg", "bf16"), ("gperxan", "bf16")])
def test_a_cuda_round_trains_channels_last_and_sends_contiguous_tensors(method, precision, digits):
    ds, split = digits
    cfg = _config(method, precision=precision)
    wire, built = Wire(), {}

    def one_round():
        fed = built["fed"] = Federation(cfg, get_method(method)(cfg), ds, split, CUDA, wire)
        fed.setup()
        fed.run_round(1)

    assert run_faked(one_round) == FIRST_STOP.get(method, "backward training.py:train_steps")
    assert _channels_last(built["fed"].model)  # the CUDA branch ran: the model trains in channels_last
    sent = _sent(wire)
    assert sent and all(t.device.type == "cuda" for t in sent.values())
    # What crosses the wire is layout-neutral: the same bytes a CPU run sends, whatever layout trained it.
    assert [k for k, t in sent.items() if not t.is_contiguous()] == []


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_engine_inverts_channels_last_victims_batched_under_vmap(precision):
    """The issue's crash: cuDNN's BatchNorm inside vmap over channels_last states. The engine stacks
    contiguous states whatever layout its victims arrive in."""
    torch.manual_seed(0)
    model = build_model("cnn", 10, SIZE).eval()

    def invert_two():
        gpu = model.to(CUDA, memory_format=torch.channels_last)
        state = {k: v.clone() for k, v in gpu.state_dict().items()}  # clones keep channels_last
        assert not state["encoder.blocks.0.0.weight"].is_contiguous()
        settings = InversionSettings(iters=2, per_class=1, victims="vmap", precision=precision)
        invert(gpu, [InversionTarget("a", state), InversionTarget("b", state)], 10, SIZE, settings,
               torch.full((3,), -1.0), torch.full((3,), 1.0), CUDA)

    assert run_faked(invert_two) == "backward engine.py:_step_gradients"  # the forward pass of every victim ran


@pytest.mark.parametrize("model", ["cnn", "resnet18"])
def test_the_card_command_inverts_a_cuda_federations_uploads(model, digits):
    """``fedaudit evaluate --method gperxan --attack deepinversion --device cuda``: XAN layers, victims
    batched (vmap is the CUDA default), states from a federation that trained channels_last."""
    ds, split = digits
    cfg = _config("gperxan", model=model, attack="deepinversion")
    method, built = get_method("gperxan")(cfg), {}

    def setup():
        fed = built["fed"] = Federation(cfg, method, ds, split, CUDA, Wire())
        fed.setup()
        _uploads(fed)

    assert run_faked(setup) == "completed"
    fed = built["fed"]
    prior = attacker_prior(cfg, method, fed, ds)
    attack = DeepInversion.from_config(attack_setup(DeepInversion, cfg), prior)
    assert attack.settings.victims == "auto"  # vmap on CUDA
    victims = [c.domain for c in fed.clients]
    view = fed.wire.view(SERVER)
    assert run_faked(lambda: attack.run_batch(view, prior, victims, CUDA)) == "backward engine.py:_step_gradients"
    # The twin and positive-control inversions (audit/reconstruction.py): the victims alone, no untrained
    # control stacked beside them — where the resnet18 run still crashed after a first fix.
    counterfactual = attack.for_counterfactual()
    assert run_faked(lambda: counterfactual.run_batch(view, prior, victims, CUDA)) == "backward engine.py:_step_gradients"
    # The one-record control: one image per victim, no class target (issue 58).
    single = attack.for_counterfactual(images=1)
    assert run_faked(lambda: single.run_batch(view, prior, victims, CUDA)) == "backward engine.py:_step_gradients"


def test_reference_models_train_batched_under_vmap_on_cuda(digits):
    ds, _ = digits
    images, labels = ds.images["clean"][:64], ds.labels["clean"][:64]
    masks = inclusion_masks(64, 4, torch.Generator().manual_seed(0))

    def train():
        train_reference_models(lambda: build_model("cnn", 10, SIZE, norm="gn"), images.to(CUDA), labels.to(CUDA),
                                     masks, SGDRecipe(epochs=1, batch_size=16), path="vmap",
                                     preprocess=Preprocess(ds.mean, ds.std, CUDA, hflip=ds.hflip))

    # vmap(grad(...)): the stacked forward runs; its backward is where faking stops.
    assert run_faked(train) == "backward reference_models.py:_train_vmap"


# -- every attack's inputs on the device ------------------------------------------------------------------

class _Captured(Exception):
    pass


def _to_cuda(obj):
    """``obj`` with every tensor it holds on the (fake) CUDA device, as a GPU run's auditor hands it over;
    but a view's SCALARS stay real (sample counts: read on the host, a sync that would end faking early)."""
    if isinstance(obj, Tensor):
        return obj.to(CUDA)
    if isinstance(obj, WireView):
        return WireView(obj.role, [a if a.kind == ArtifactKind.SCALARS else dataclasses.replace(a, tensors=_to_cuda(a.tensors))
                                   for a in obj])
    if isinstance(obj, dict):
        return {k: _to_cuda(v) for k, v in obj.items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, (type, AttackerPrior)):
        return dataclasses.replace(obj, **{f.name: _to_cuda(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                           if f.init})
    return obj


# Where each attack stops on fake CUDA, having placed its inputs: an optimisation's first backward pass, a
# statistic read on the host, or the end (the loss attack computes on the device and reads once).
ATTACK_STOPS = {
    "deepinversion": "backward engine.py:_step_gradients",
    "gradinv": "read __init__.py:_attack",  # which parameters the victim moved: one read, before simulating
    # LiRA and RMIA replay the victim's rounds: first the check that the released model is the final round's mean
    # (the deployed model and the mean both answer the probe records on the device; one read of their gap).
    "mia": "read replay.py:release_replay",  # mia = loss, LiRA, RMIA, domain
    "mia-loss": "completed",
    "mia-lira": "read replay.py:release_replay",
    "mia-rmia": "read replay.py:release_replay",
    "mia-domain": "completed",
    "mia-artifact": "read scorers.py:ledoit_wolf_shrinkage",
}


# From-scratch references (``--reference-training scratch``): the reference models' training is reached.
SCRATCH_STOPS = {"mia-lira": "backward training.py:train_steps",  # BatchNorm: the sequential path, the victim's recipe
                 "mia-rmia": "backward training.py:train_steps"}
CASES = [(n, {}, ATTACK_STOPS[n]) for n in ATTACKS if n != "canary"] + [
    (n, {"reference_training": "scratch"}, stop) for n, stop in SCRATCH_STOPS.items()]


@pytest.mark.parametrize(("name", "options", "stop"), CASES,
                         ids=[n + "".join(f"-{v}" for v in o.values()) for n, o, _ in CASES])
def test_every_attack_takes_its_inputs_on_the_cuda_device(name, options, stop, digits, monkeypatch):
    """What the auditor hands an attack on a GPU run — the wire view, the challenges, the deployed model
    behind the query — is on the device; the attack's own tensors must join them there. Captured from a
    real CPU audit, replayed on fake CUDA; a CPU tensor meeting a CUDA one fails as it would on a GPU."""
    ds, split = digits
    cfg, _ = run_config("fedavg", None, None, None, {**TINY, "device": "cpu", "attack": name, **options})
    method = get_method("fedavg")(cfg)
    fed = Federation(cfg, method, ds, split, torch.device("cpu"), Wire())
    fed.setup()
    fed.run()
    cls, calls = ATTACKS[name], []

    def capture(self, view, prior, victims, device, access=None):
        calls.append((self, view, prior, victims, access))
        raise _Captured

    for attack_cls in {cls, *(c for c in ATTACKS.values() if c.family and c.family == cls.family)}:
        monkeypatch.setattr(attack_cls, "run_batch", capture)
    with tempfile.TemporaryDirectory() as tmp, pytest.raises(_Captured):
        run_attacks([cls], Path(tmp), cfg, method, fed, ds, torch.device("cpu"))
    monkeypatch.undo()
    attack, view, prior, victims, access = calls[0]

    def run_on_cuda():
        granted = dataclasses.replace(access or Access(), cache_dir=None)  # no reference-logit cache to key
        if granted.query is not None:
            deployed = fed.deployed_model().to(CUDA, memory_format=torch.channels_last).eval()
            granted = dataclasses.replace(granted, query=lambda x: method.predict(deployed, x))
        attack.run_batch(_to_cuda(view), prior, victims, CUDA, _to_cuda(granted))

    assert run_faked(run_on_cuda) == stop


# -- channels_last with real numbers, on the CPU --------------------------------------------------------------

@pytest.mark.parametrize("victims", ["vmap", "loop"])
def test_channels_last_training_sends_contiguous_tensors_and_the_engine_stacks_contiguous_states(victims, digits,
                                                                                                 monkeypatch):
    ds, split = digits
    cfg, _ = run_config("fedavg", None, None, None, {**TINY, "device": "cpu"})
    cpu = torch.device("cpu")
    fed = Federation(cfg, get_method("fedavg")(cfg), ds, split, cpu, Wire(), channels_last=True)
    fed.setup()
    fed.run()
    assert _channels_last(fed.model)
    sent = _sent(fed.wire)
    assert len(sent) > 20 and [k for k, t in sent.items() if not t.is_contiguous()] == []

    seen: list[bool] = []
    forward = engine.functional_call

    def laid_out(t):  # under vmap every state contiguous (issue 38); the loop's convolutions channels_last on purpose
        if victims == "loop" and t.dim() == 4:
            return t.is_contiguous(memory_format=torch.channels_last)
        return t.is_contiguous()

    def spy(module, state, args):
        seen.extend(laid_out(t) for part in state for t in part.values())
        return forward(module, state, args)

    monkeypatch.setattr(engine, "functional_call", spy)
    state = model_state(fed.model)  # a channels_last state, as a CUDA client holds it
    assert not all(t.is_contiguous() for t in state.values())
    result = invert(fed.model, [InversionTarget("a", state), InversionTarget("b", state)], 10, SIZE,
                    InversionSettings(iters=2, per_class=1, victims=victims), torch.full((3,), -1.0),
                    torch.full((3,), 1.0), cpu)
    assert seen and all(seen)
    assert torch.isfinite(result.images).all()


# -- GPU numerics on record ------------------------------------------------------------------------------------

def test_deterministic_settings_are_applied_recorded_and_restored():
    import warnings

    from fedaudit.run.numerics import numerics, run_numerics

    torch.set_float32_matmul_precision("high")  # TF32 asked for through the API that locks out the legacy flags
    try:
        before = numerics(torch.device("cpu")), torch.backends.cuda.matmul.fp32_precision
        with warnings.catch_warnings(record=True) as passed:
            warnings.simplefilter("always")
            with run_numerics(True) as unpinned:
                assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
                assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.conv.fp32_precision == "ieee"
                assert torch.backends.cuda.matmul.fp32_precision == "ieee" and os.environ["CUBLAS_WORKSPACE_CONFIG"]
                pinned = numerics(torch.device("cpu"))
                for _ in range(2):  # what torch says when an op has no deterministic CUDA kernel, twice
                    warnings.warn("scatter_add_cuda_kernel does not have a deterministic implementation, but you set "
                                  "'torch.use_deterministic_algorithms(True, warn_only=True)'.", UserWarning, stacklevel=2)
                warnings.warn("an unrelated warning", UserWarning, stacklevel=2)
        after = numerics(torch.device("cpu")), torch.backends.cuda.matmul.fp32_precision
    finally:
        torch.set_float32_matmul_precision("highest")  # torch's default, for the tests after this one
    assert unpinned == ["scatter_add_cuda_kernel"] and pinned["deterministic_algorithms"]
    assert [str(w.message) for w in passed] == ["an unrelated warning"]  # other warnings still reach the user
    assert after == before and before[1] == "tf32" and not torch.backends.cudnn.deterministic
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_a_run_records_its_numerics_and_deterministic_runs_name_what_was_not_pinned(tiny_run):
    plain = tiny_run("fedavg", rounds=1).metrics["provenance"]["numerics"]
    assert plain["deterministic_algorithms"] is False and "nondeterministic_ops" not in plain
    pinned = tiny_run("fedavg", rounds=1, deterministic=True).metrics["provenance"]["numerics"]
    assert pinned["deterministic_algorithms"] is True and pinned["nondeterministic_ops"] == []
    assert not torch.are_deterministic_algorithms_enabled()  # the next run starts from torch's own settings


def test_cuda_numerics_name_the_versions_tf32_and_cudnn_settings(monkeypatch):
    from fedaudit.run.numerics import numerics

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    got = numerics(CUDA)
    assert got["capability"] == "9.0" and got["cuda"] == torch.version.cuda
    assert {"cudnn", "matmul_fp32_precision", "cudnn_conv_fp32_precision", "cudnn_deterministic", "cudnn_benchmark",
            "cublas_workspace_config"} <= set(got)
