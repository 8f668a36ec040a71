"""What verifying a recording whole costs beside the audit it protects (issue 37: under 10%).

Records the plain-PyTorch example (examples/pytorch_fedavg, a hand-written FedAvg loop over three digits
clients), then, in one process, times ``verify_recording`` (every message file hashed, opened and held to its
ledger rows; the ledger against its seal) and the ``fedaudit audit`` that follows on the same recording, and
prints the ratio verify/audit. Run from the repository root:

    python benchmarks/recording_verification.py                 # 3 rounds, mia-loss and deepinversion
    python benchmarks/recording_verification.py --rounds 5 --attack auto
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from fedaudit.api import audit_recording
from fedaudit.interop.recording_reader import read_recording
from fedaudit.interop.recording_verify import verify_recording

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attack", default="mia-loss,deepinversion")
    parser.add_argument("--repeats", type=int, default=5, help="verifications timed (the median is reported)")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))  # the example is a package of the repository, not of fedaudit
    from examples.pytorch_fedavg.run import fedavg, write_digits

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = write_digits(root / "data", seed=0)
        fedavg(data, root / "rec", args.rounds, 1, 0)
        rec = read_recording(root / "rec")
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            v = verify_recording(rec)
            times.append(time.perf_counter() - t0)
        verify_s = statistics.median(times)
        t0 = time.perf_counter()
        audit_recording(root / "rec", attack=args.attack, model="examples.pytorch_fedavg.net:Net",
                        out=str(root / "runs"), device="cpu", inversion_iters=50, records=data)
        audit_s = time.perf_counter() - t0
    print(f"recording: {v['messages']} message files, {v['bytes'] / 1e6:.1f} MB, {v['rows']} ledger rows, "
          f"{v['rounds']} rounds, {v['clients']} clients ({v['status']})")
    print(f"verify {verify_s:.3f} s (median of {args.repeats}) · audit {audit_s:.1f} s (--attack {args.attack}) · "
          f"ratio verify/audit {verify_s / audit_s:.3f} on {torch.get_num_threads()} thread(s)")


if __name__ == "__main__":
    main()
