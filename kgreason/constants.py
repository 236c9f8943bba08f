"""Conventions shared by every layer, each defined once (stdlib only: the CLIs read them before torch loads).

- :data:`INVERSE_SUFFIX`: how an artifact names the inverse of relation ``X`` (``X^-1``; ``relations.tsv``
  of :mod:`kge.artifact`), which the engine, the path retrievers and the LLM prompts all parse.
- :data:`QTO_NEG_SCALE`: ``s`` in QTO's negated projection ``1 - min(1, s * M)``, the default of
  :func:`ops.project`, :class:`engine.exec.executor.Executor` and the ``--neg-scale`` flag of
  ``engine.answer`` and ``engine.evaluate``.
"""
from __future__ import annotations

__all__ = ["INVERSE_SUFFIX", "QTO_NEG_SCALE"]

#: The artifact's inverse-relation naming: relation ``X`` has the inverse ``X^-1``.
INVERSE_SUFFIX = "^-1"
#: QTO's negation scale (Bai et al. 2023): a calibrated value ``v`` negates to ``1 - min(1, 3 v)``.
QTO_NEG_SCALE = 3.0
