"""Models: encoders (cnn, resnet18, resnet50), heads, the norm-layer factory, MixStyle, and a user's own model
(``--model PKG.MODULE:CALLABLE``, :mod:`fedaudit.models.factory`)."""

from fedaudit.models.classifier import ARCHITECTURES, HEADS, Classifier, bn_layers, build_model, head_layer
from fedaudit.models.factory import OWN_NORM, ModelFactory, is_factory
from fedaudit.models.mixstyle import MixStyle
from fedaudit.models.norms import NORM_LAYERS, make_norm
from fedaudit.models.pretrained import load_pretrained
# Imported for its side effect too: it registers NORM_LAYERS["xan"], so `--norm xan` always works.
from fedaudit.models.xan import XAN, keep_xan_in_early_stages, xan_bn_side_keys, xan_layers

__all__ = ["Classifier", "build_model", "make_norm", "NORM_LAYERS", "ARCHITECTURES", "HEADS", "load_pretrained", "bn_layers",
           "head_layer", "is_factory", "ModelFactory", "OWN_NORM",
           "XAN", "xan_layers", "xan_bn_side_keys", "keep_xan_in_early_stages", "MixStyle"]
