"""The simulated federation: the round loop, the method contract, the wire and what an observer assembles
from it, local training and its recipes, aggregation, and DP-SGD with the auditor's gradient canaries."""
