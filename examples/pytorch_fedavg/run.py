"""A hand-written PyTorch FedAvg loop over three folder clients, recorded for ``fedaudit audit``. No Flower.

The deployment's side is plain PyTorch: its own model (``net.Net``), ``torchvision``'s ``ImageFolder``
per client, SGD, a weighted average. fedaudit's part is the :class:`~fedaudit.interop.recording.Recorder`: one
``send`` per message, and ``release`` for the final model. The clients' records live in the layout the auditor
reads (``members/<client>/<class>/*.png`` trained on, ``holdout/<client>/…`` never trained on,
``unseen/<domain>/…``); without ``--data`` the example writes fedaudit's built-in ``digits`` there first, inside
the recording (``<out>/auditor-records``), where the audit finds them. Records elsewhere (``--data DIR``) are read
only when the reviewer names them: ``fedaudit audit REC --records DIR``.

    python -m examples.pytorch_fedavg.run --out runs/pt-fedavg
    fedaudit audit runs/pt-fedavg --model examples.pytorch_fedavg.net:Net

(run both from the repository root: ``--model`` imports the clients' model from there.)
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from examples.pytorch_fedavg.net import Net
from fedaudit.errors import FedauditError
from fedaudit.interop.recording import Recorder
from fedaudit.interop.recording_writer import check_fresh

RECIPE = {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 32, "augment": False}
NORMALISE = {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}


def local_train(model: torch.nn.Module, loader: DataLoader, epochs: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=RECIPE["lr"], momentum=RECIPE["momentum"],
                          weight_decay=RECIPE["weight_decay"])
    model.train()
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()


def average(states: list[dict[str, torch.Tensor]], weights: list[int]) -> dict[str, torch.Tensor]:
    total = sum(weights)
    return {k: sum(s[k].double() * (w / total) for s, w in zip(states, weights)).to(states[0][k].dtype)
            for k in states[0]}


def fedavg(data: Path, out: Path, rounds: int, local_epochs: int, seed: int) -> None:
    inside = data.resolve().is_relative_to(out.resolve())
    torch.manual_seed(seed)
    to_tensor = transforms.Compose([transforms.ToTensor(), transforms.Normalize(NORMALISE["mean"], NORMALISE["std"])])
    clients = sorted(p.name for p in (data / "members").iterdir() if p.is_dir())
    loaders = {c: DataLoader(datasets.ImageFolder(str(data / "members" / c), to_tensor), RECIPE["batch_size"],
                             shuffle=True, generator=torch.Generator().manual_seed(seed + i))
               for i, c in enumerate(clients)}
    classes = datasets.ImageFolder(str(data / "members" / clients[0])).classes
    model = Net(num_classes=len(classes))
    recorder = Recorder(out, model=model,  # the manifest: what fedaudit audit needs to know, all of it public
                        architecture={"model": "examples.pytorch_fedavg.net:Net", "num_classes": len(classes),
                                      "image_size": 32},
                        data={"records": str(data.resolve().relative_to(out.resolve())) if inside else str(data.resolve()),
                              "seed": seed},
                        recipe={**RECIPE, "local_epochs": local_epochs, "rounds": rounds},
                        prior={"classes": classes, **NORMALISE, "hflip": False})
    for rnd in range(1, rounds + 1):
        states, sizes = [], []
        for client in clients:
            recorder.send(rnd, "server", client, model.state_dict())  # the broadcast
            local = copy.deepcopy(model)
            local_train(local, loaders[client], local_epochs)
            states.append(local.state_dict())
            sizes.append(len(loaders[client].dataset))
            recorder.send(rnd, client, "server", states[-1])  # the upload
            recorder.send(rnd, client, "server", {"num_samples": sizes[-1]}, kind="scalars")
        model.load_state_dict(average(states, sizes))
        print(f"round {rnd}: averaged {len(states)} clients")
    for client in clients:  # the deployed model goes out once more, for the clients to evaluate
        recorder.send(rounds, "server", client, model.state_dict(), message_type="evaluate")
    recorder.release(model.state_dict())  # the model the deployment releases: the one the audit judges
    recorder.close()  # the run has ended: the ledger's sha256 goes into the manifest (tamper evidence)


def write_digits(root: Path, seed: int) -> Path:
    """fedaudit's built-in digits as the deployment's folders: each source domain a client (its train split as
    members, the rest as holdout), the last domain unseen."""
    from PIL import Image

    from fedaudit.data import load_dataset, lodo_split

    dataset = load_dataset("digits", 32, seed=0)
    split = lodo_split(dataset, dataset.domains[-1], seed=seed)

    def save(images: torch.Tensor, labels: torch.Tensor, folder: Path) -> None:
        for i, (x, y) in enumerate(zip(images, labels)):
            path = folder / dataset.classes[int(y)] / f"{i:05d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(x.permute(1, 2, 0).numpy()).save(path)

    for c in split.sources:
        save(c.train_x, c.train_y, root / "members" / c.domain)
        save(torch.cat([c.val_x, c.holdout_x]), torch.cat([c.val_y, c.holdout_y]), root / "holdout" / c.domain)
    save(split.target_x, split.target_y, root / "unseen" / split.target)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="recording directory (created; must not hold a run)")
    parser.add_argument("--data", type=Path, help="the clients' records (default: built-in digits, written into the "
                                                  "recording as <out>/auditor-records)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    data = args.data
    try:
        check_fresh(args.out)  # before any data is written into it
        if data is None:
            data = args.out / "auditor-records"
            write_digits(data, args.seed)
        fedavg(data, args.out, args.rounds, args.local_epochs, args.seed)
    except FedauditError as exc:  # e.g. --out already holds a recorded run
        parser.exit(2, f"error: {exc}\n")
    records = "" if args.data is None else f" --records {args.data}"
    print(f"recording written to {args.out}; audit it with: fedaudit audit {args.out} --model "
          f"examples.pytorch_fedavg.net:Net{records}")


if __name__ == "__main__":
    main()
