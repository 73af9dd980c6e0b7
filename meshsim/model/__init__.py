"""The reference model: pure Python (no torch), the specification meshsim checks torch against."""

from .expect import Err, Quirk, to_json, torch_side
from .predict import Prediction, predict

__all__ = ["Err", "Quirk", "Prediction", "predict", "to_json", "torch_side"]
