"""``python -m fedaudit.cli``: the same command as ``fedaudit``."""

from fedaudit.cli import main

main()
