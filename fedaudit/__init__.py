"""fedaudit: audit federated domain generalization methods for privacy.

Train a FedDG method in a faithful simulation, record every tensor it sends,
attack those tensors, and put accuracy, communication and leakage side by side.
"""

from pathlib import Path as _Path

__version__ = "0.1.0"

# The plug-in rooms live at the top level (methods/, attacks/, reports/) and
# install as fedaudit.methods etc. via setuptools' package-dir. From a bare
# source checkout (PYTHONPATH=.), let the same names resolve by also
# searching the checkout root for fedaudit's subpackages.
_root = _Path(__file__).resolve().parent.parent
if (_root / "methods" / "__init__.py").is_file() and str(_root) not in __path__:
    __path__.append(str(_root))


def evaluate(*args, **kwargs):
    """See :func:`fedaudit.api.evaluate` (imported lazily: ``import fedaudit`` stays cheap)."""
    from fedaudit.api import evaluate as _evaluate

    return _evaluate(*args, **kwargs)


__all__ = ["evaluate", "__version__"]
