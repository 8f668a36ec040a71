"""One NVFlare site, as NVFlare's Client API writes it: receive the global model, train the deployment's own model
(``examples/pytorch_fedavg/net.py``) on the site's records, send the weights back. Nothing here knows of fedaudit's
recording — the server records (``job.py``).

The site's records are its domain of fedaudit's built-in ``digits`` (the site's name: clean, colour or rotated),
split as ``fedaudit evaluate --dataset digits`` splits it, so the auditor's data matches what each site trained on.
"""

from __future__ import annotations

import argparse

import nvflare.client as flare
import torch
from nvflare.client import FLModel

from examples.pytorch_fedavg.net import Net
from fedaudit.data import load_dataset
from fedaudit.data.split import lodo_split
from fedaudit.simulation.training import Preprocess, cross_entropy_loss, index_batches, make_optimizer, train_steps

TARGET, IMAGE_SIZE = "textured", 32
RECIPE = {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "batch_size": 32, "augment": True}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    flare.init()
    site = flare.get_site_name()
    dataset = load_dataset("digits", IMAGE_SIZE, seed=0)
    data = {c.domain: c for c in lodo_split(dataset, TARGET, seed=args.seed).sources}[site]
    preprocess = Preprocess(dataset.mean, dataset.std, torch.device("cpu"), hflip=dataset.hflip)
    model = Net(num_classes=len(dataset.classes))
    while flare.is_running():
        received = flare.receive()
        model.load_state_dict({k: torch.as_tensor(v) for k, v in received.params.items()})
        generator = torch.Generator().manual_seed(args.seed * 1_000_003 + received.current_round * 101
                                                  + sum(map(ord, site)))
        opt = make_optimizer(model.parameters(), "sgd", RECIPE["lr"], RECIPE["momentum"], RECIPE["weight_decay"])
        batches = list(index_batches(len(data.train_y), RECIPE["batch_size"], generator, torch.device("cpu"),
                                     epochs=args.local_epochs))
        train_steps(model, opt, batches, data.train_x, data.train_y, preprocess, cross_entropy_loss, generator, "fp32")
        flare.send(FLModel(params=model.state_dict(), meta={"NUM_STEPS_CURRENT_ROUND": len(batches)}))


if __name__ == "__main__":
    main()
