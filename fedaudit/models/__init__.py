"""Models: encoders (cnn, resnet18, resnet50), heads, the norm-layer factory, MixStyle."""

from fedaudit.models.classifier import ARCHITECTURES, HEADS, Classifier, bn_layers, build_model
from fedaudit.models.mixstyle import MixStyle
from fedaudit.models.norms import NORM_LAYERS, make_norm
from fedaudit.models.pretrained import load_pretrained
# Imported for its side effect too: it registers NORM_LAYERS["xan"], so `--norm xan` always works.
from fedaudit.models.xan import XAN, keep_xan_in_early_stages, xan_bn_side_keys, xan_layers

__all__ = ["Classifier", "build_model", "make_norm", "NORM_LAYERS", "ARCHITECTURES", "HEADS", "load_pretrained", "bn_layers",
           "XAN", "xan_layers", "xan_bn_side_keys", "keep_xan_in_early_stages", "MixStyle"]
