"""Knowledge-graph data layer: loading, ComplEx training (pykeen) and calibrated sparse relation matrices."""
from .artifact import Artifact
from kgreason.errors import UserError

__all__ = ["Artifact", "UserError"]
