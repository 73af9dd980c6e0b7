"""The reference model: pure Python (no torch), the specification meshsim checks torch against.

It emulates what DeviceMesh and DTensor do on one rank (mesh.py, dtensor.py, layout.py) and says where torch
differs from what is right (expect.py). It knows nothing of plans, operations or runs: meshsim.model.predict drives
it with each plan step's model part (meshsim.ops).
"""

from .expect import Err, Quirk, to_json, torch_side

__all__ = ["Err", "Quirk", "to_json", "torch_side"]
