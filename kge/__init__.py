"""Knowledge-graph data layer: loading, ComplEx training (the 1-N ComplEx-N3 loop of :mod:`kge.complex_n3`;
pykeen's model, evaluator and optional loops) and calibrated sparse relation matrices."""
from .artifact import Artifact
from kgreason.errors import UserError

__all__ = ["Artifact", "UserError"]
