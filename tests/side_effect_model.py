"""Importing this module writes a file (FEDAUDIT_TEST_MARKER): the proof that something imported it (tests only)."""

import os
from pathlib import Path

Path(os.environ.get("FEDAUDIT_TEST_MARKER", Path(__file__).with_name("side_effect.imported"))).write_text("imported\n")


def build(num_classes: int = 10):
    from tests.user_models import PlainCNN

    return PlainCNN(num_classes)
