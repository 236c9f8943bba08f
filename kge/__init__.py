"""Knowledge-graph data layer: loading, ComplEx training (pykeen) and calibrated sparse relation matrices."""
from .artifact import Artifact
from .errors import UserError

__all__ = ["Artifact", "UserError"]
