"""Examples of recording a federation for `fedaudit audit` (a package, so `--model examples.pytorch_fedavg.net:Net`
imports from the repository root; Opacus installs a top-level `examples` package this one must shadow)."""
