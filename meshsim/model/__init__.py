"""The reference model: pure Python (no torch), the specification meshsim checks torch against."""

from .expect import Err, Quirk, is_error, to_json, torch_side
from .predict import INJECTED, SKIPPED, Prediction, predict

__all__ = ["Err", "Quirk", "Prediction", "predict", "is_error", "to_json", "torch_side", "SKIPPED", "INJECTED"]
