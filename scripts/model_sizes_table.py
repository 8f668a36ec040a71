"""Sizes to sanity-check the ledger: parameters and state bytes of fedaudit's built-in architectures.

    python scripts/model_sizes_table.py                                # writes docs/results/model_sizes.md

Builds each model with :func:`fedaudit.models.build_model` (7 classes, float32, on CPU) at an image size on each
side of the 64-px stem switch and counts its parameters, their bytes and the whole state_dict's bytes (BN
buffers and int64 ``num_batches_tracked`` included) — what a ``full_model`` message carries.
"""

from __future__ import annotations

from fedaudit.models import build_model

import results_page  # scripts/ is on sys.path when run as python scripts/model_sizes_table.py

CASES = (("cnn", 32, "32 or 64 px"), ("resnet18", 32, "≤ 64 px (CIFAR stem)"), ("resnet18", 224, "> 64 px (ImageNet stem)"),
         ("resnet50", 32, "≤ 64 px (CIFAR stem)"), ("resnet50", 224, "> 64 px (ImageNet stem)"))
CLASSES = 7


def main() -> None:
    lines = ["| model | image size | parameters | parameter bytes | state bytes |", "|---|---|---|---|---|"]
    for arch, size, label in CASES:
        model = build_model(arch, CLASSES, size)
        params = sum(p.numel() for p in model.parameters())
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        state_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        lines.append(f"| {arch} | {label} | {params:,} | {param_bytes:,} | {state_bytes:,} |")
    results_page.write("model_sizes", "Sizes of the built-in architectures", "\n".join(lines),
                       f"`build_model(arch, {CLASSES}, image_size)` on CPU, float32; the state is the whole state_dict. "
                       "Deterministic: these depend on the architecture only, not on the machine.", reads_runs=False)


if __name__ == "__main__":
    main()
