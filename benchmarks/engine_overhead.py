"""Engine overhead: fedaudit's federation vs a bare training loop, same work.

Both sides do the same FedAvg rounds on the same data in one process: per
round and client, load the global state, the same number of SGD steps with
the same batch size, normalisation and augmentation, then the sample-weighted
average, then accuracy on every source val split and the target domain. The
engine adds what an audit needs — the wire (a cloned copy of every message
and its ledger row), in-place state swapping, per-round history — and this
script prints what that costs as a ratio engine/bare (1.00 = free), and what the
run directory's per-round writes add on top (history, ledger and checkpoint:
one batched device-to-host copy per round, written off the training thread;
timed until the last round's files are on disk).

    python benchmarks/engine_overhead.py                   # cnn on CPU
    python benchmarks/engine_overhead.py --device cuda --model resnet18 --deterministic
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from fedaudit.api import resolve_device
from fedaudit.pipeline import save_progress
from fedaudit.data import load_dataset, lodo_split
from fedaudit.methods.fedavg import FedAvg
from fedaudit.models import build_model
from fedaudit.run.config import RunConfig
from fedaudit.run.numerics import numerics, run_numerics
from fedaudit.run.run_directory import ProgressWriter
from fedaudit.run.seeds import derive_seed
from fedaudit.simulation.federation import Federation
from fedaudit.simulation.training import Preprocess
from fedaudit.simulation.wire import Wire


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_engine(cfg: RunConfig, ds, split, device, run_dir: Path | None = None) -> float:
    """The federation's round loop; with ``run_dir``, also the per-round
    history, ledger and checkpoint writes that ``fedaudit evaluate`` does."""
    fed = Federation(cfg, FedAvg(cfg), ds, split, device, Wire())
    sync(device)
    t0 = time.perf_counter()
    fed.setup()
    if run_dir is None:
        fed.run()
    else:
        with ProgressWriter(run_dir) as writer:  # timed until the last round's files are on disk
            fed.run(lambda f, rnd: save_progress(writer, f))
    sync(device)
    return time.perf_counter() - t0


def run_deterministic(cfg: RunConfig, ds, split, device) -> float:
    """The engine under ``--deterministic``'s settings (fedaudit.run.numerics)."""
    with run_numerics(True):
        return run_engine(replace(cfg, deterministic=True), ds, split, device)


def run_bare(cfg: RunConfig, ds, split, device) -> float:
    """What a researcher would write by hand for the same FedAvg rounds."""
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, len(ds.classes), cfg.image_size, norm=cfg.norm).to(device)
    if device.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    prep = Preprocess(ds.mean, ds.std, device, hflip=ds.hflip, channels_last=device.type == "cuda")
    clients = [c.to(device) for c in split.sources]
    tx, ty = split.target_x.to(device), split.target_y.to(device)
    sync(device)
    t0 = time.perf_counter()
    global_sd = {k: v.clone() for k, v in model.state_dict().items()}
    for rnd in range(1, cfg.rounds + 1):
        states, weights = [], []
        for i, c in enumerate(clients):
            model.load_state_dict(global_sd)
            model.train()
            opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
            g = torch.Generator(device=device).manual_seed(derive_seed(cfg.seed, rnd, i))
            n = c.train_y.shape[0]
            bs = min(cfg.batch_size, n)
            for _ in range(cfg.local_epochs):
                perm = torch.randperm(n, generator=g, device=device)
                for b in range(n // bs):
                    idx = perm[b * bs:(b + 1) * bs]
                    loss = F.cross_entropy(model(prep(c.train_x[idx], g)), c.train_y[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
            states.append({k: v.clone() for k, v in model.state_dict().items()})
            weights.append(n)
        total = sum(weights)
        global_sd = {k: (sum(s[k].double() * w for s, w in zip(states, weights)) / total).to(v.dtype)
                     for k, v in global_sd.items()}
        model.load_state_dict(global_sd)
        model.eval()
        with torch.no_grad():
            for x, y in [(c.val_x, c.val_y) for c in clients] + [(tx, ty)]:
                correct = sum((model(prep(x[s:s + 512])).argmax(1) == y[s:s + 512]).sum() for s in range(0, len(y), 512))
                _ = correct.item()
    sync(device)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--dataset", default="shapes")
    ap.add_argument("--image-size", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=6, help="rounds of the sides (a multiple of their number: each side "
                    "as often in each position)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--deterministic", action="store_true", help="also time the engine under --deterministic")
    args = ap.parse_args()

    device = resolve_device(args.device)
    ds = load_dataset(args.dataset, args.image_size)
    split = lodo_split(ds, ds.domains[-1], seed=0)
    cfg = RunConfig(model=args.model, dataset=args.dataset, image_size=args.image_size, rounds=args.rounds, device=device.type)
    run_engine(cfg, ds, split, device)  # warm-up: allocator, kernels, caches
    sides = {"bare": lambda tmp: run_bare(cfg, ds, split, device),
             "engine": lambda tmp: run_engine(cfg, ds, split, device),
             "with_io": lambda tmp: run_engine(cfg, ds, split, device, Path(tmp))}
    if args.deterministic:
        sides["deterministic"] = lambda tmp: run_deterministic(cfg, ds, split, device)
    times: dict[str, list[float]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):  # interleaved, each repeat in a rotated order: drift and order hit all alike
            names = list(sides)
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(sides[name](tmp))
    steps = sum(c.train_y.shape[0] // min(cfg.batch_size, c.train_y.shape[0]) for c in split.sources) * cfg.rounds * cfg.local_epochs
    print(f"device={device.type} ({device_name(device)}) model={args.model} dataset={args.dataset} "
          f"image_size={args.image_size} clients={len(split.sources)} rounds={cfg.rounds} sgd_steps={steps} "
          f"repeats={args.repeats} threads={torch.get_num_threads()} torch={torch.__version__}")
    print(f"numerics: {numerics(device)}")
    labels = {"bare": "bare loop", "engine": "engine", "with_io": "engine + run-directory writes",
              "deterministic": "engine, --deterministic"}
    for name, label in labels.items():
        if name not in times:
            continue
        t = times[name]
        print(f"{label:30s}: min {min(t):.3f} s  median {statistics.median(t):.3f} s  ({', '.join(f'{x:.2f}' for x in t)})")
    # Ratios within each repeat (its three runs are back to back, so a shared machine's drift in speed
    # cancels), then their median over the repeats.
    def paired(side: str, base: str) -> float:
        return statistics.median(t / b for t, b in zip(times[side], times[base]))

    print(f"ratio engine/bare = {paired('engine', 'bare'):.3f}")
    print(f"ratio (engine + run-directory writes)/bare = {paired('with_io', 'bare'):.3f}")
    print(f"ratio (engine + run-directory writes)/engine = {paired('with_io', 'engine'):.3f}  (the writes alone)")
    if args.deterministic:
        print(f"ratio (engine, --deterministic)/engine = {paired('deterministic', 'engine'):.3f}  (its cost)")
    print("(each: the median over repeats of the ratio within a repeat)")


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


if __name__ == "__main__":
    main()
