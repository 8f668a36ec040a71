"""Models: encoders (cnn, resnet18, resnet50), heads, and the norm-layer factory."""

from fedaudit.models.classifier import ARCHITECTURES, HEADS, Classifier, bn_layers, build_model
from fedaudit.models.norms import NORM_LAYERS, make_norm
from fedaudit.models.pretrained import load_pretrained

__all__ = ["Classifier", "build_model", "make_norm", "NORM_LAYERS", "ARCHITECTURES", "HEADS", "load_pretrained", "bn_layers"]
