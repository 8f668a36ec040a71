"""FedAvg on fedaudit's built-in ``digits`` as an NVFlare job (its recipe API, on its simulator), recorded for
``fedaudit audit`` by a component on the server: the site script (``client.py``) is plain NVFlare.

One site per source domain (clean, colour, rotated; ``textured`` is the unseen target), each in its own process,
training the deployment's own small CNN (``examples/pytorch_fedavg/net.py``) with NVFlare's ``FedAvgRecipe``. ``fedaudit.interop.nvflare.add_recorder`` records every
model the server sends, every result a site returns and the final aggregate (the released model), and seals the
recording when the job ends.

    python examples/nvflare_digits/job.py --out runs/nvflare-digits [--rounds 5] [--sites clean,colour,rotated]
    fedaudit audit runs/nvflare-digits --model examples.pytorch_fedavg.net:Net

(run both from the repository root: the sites and ``--model`` import the model from there). Runs offline on CPU;
NVFlare's simulator workspace goes to a temporary folder.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from fedaudit.errors import FedauditError
from fedaudit.interop.recording_writer import check_fresh

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
MODEL = "examples.pytorch_fedavg.net:Net"
ARCHITECTURE = {"model": MODEL, "num_classes": 10, "image_size": 32}
SITES = ("clean", "colour", "rotated")


def run_job(out: Path, rounds: int, local_epochs: int, seed: int, sites: list[str], workspace: Path) -> None:
    import torch
    from nvflare.app_opt.pt.recipes.fedavg import FedAvgRecipe
    from nvflare.recipe import SimEnv

    from fedaudit.interop.nvflare import add_recorder

    # the server and the sites run in processes NVFlare starts: they import the model from the repository root
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    sys.path[:0] = [str(REPO), str(HERE)]
    from client import RECIPE  # the sites' public recipe, declared in the recording
    from examples.pytorch_fedavg.net import Net

    torch.manual_seed(seed)
    recipe = FedAvgRecipe(name="fedaudit-digits", model=Net(num_classes=10), min_clients=len(sites),
                          num_rounds=rounds, train_script=str(HERE / "client.py"),
                          train_args=f"--local-epochs {local_epochs} --seed {seed}")
    add_recorder(recipe, out, architecture=ARCHITECTURE,
                 data={"dataset": "digits", "target_domain": "textured", "seed": seed},
                 recipe={**RECIPE, "local_epochs": local_epochs, "rounds": rounds})
    recipe.execute(SimEnv(clients=sites, workspace_root=str(workspace)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="recording directory (created; must not hold a run)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sites", default=",".join(SITES), help="comma-separated source domains, one site each")
    args = parser.parse_args()
    out = args.out.expanduser().resolve()
    sites = [s for s in args.sites.split(",") if s]
    try:
        check_fresh(out)  # refused here, in one line, before NVFlare starts
        unknown = sorted(set(sites) - set(SITES))
        if unknown:
            raise FedauditError(f"--sites {unknown[0]!r} is not a source domain of digits; choose from {', '.join(SITES)}")
        with tempfile.TemporaryDirectory(prefix="nvflare-sim-") as workspace:
            run_job(out, args.rounds, args.local_epochs, args.seed, sites, Path(workspace))
    except FedauditError as exc:
        parser.exit(2, f"error: {exc}\n")
    if not (out / "manifest.json").is_file() or "ledger_sha256" not in (out / "manifest.json").read_text():
        parser.exit(2, f"error: the NVFlare job ended without a sealed recording in {out}; see NVFlare's log above\n")
    print(f"recording written to {out}; audit it with: fedaudit audit {out} --model {MODEL}")


if __name__ == "__main__":
    main()
