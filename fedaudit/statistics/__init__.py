"""Pure statistics of the audit, no I/O: ROC, KS, Holm and TPR at low FPR for membership scores,
confidence intervals, and the one-run DP audit's bounds."""
