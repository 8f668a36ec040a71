"""A plain-PyTorch FedAvg loop recorded for `fedaudit audit` (see run.py)."""
