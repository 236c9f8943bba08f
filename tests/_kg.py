"""A tiny artifact folder from named forward triples, for tests that need a KG of a given shape.

``relations`` lists every relation followed by its inverse (``X``, ``X^-1``: ids 2k and 2k + 1, the
artifact convention); ``forward`` holds ``(head name, relation id, tail name)`` triples of the even ids.
Every triple and its inverse is observed, value 1.0; nothing missing.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np
import scipy.sparse as sp


def save_named_kg(path: str | os.PathLike, entities: Sequence[str], relations: Sequence[str],
                  forward: Sequence[tuple[str, int, str]], *, source: str) -> Path:
    from kge.artifact import Artifact

    e = {name: i for i, name in enumerate(entities)}
    obs = np.array([[e[h], r, e[t]] for h, r, t in forward] + [[e[t], r + 1, e[h]] for h, r, t in forward])
    n = len(entities)
    m = sp.csr_matrix((np.ones(len(obs), np.float32), (obs[:, 1] * n + obs[:, 0], obs[:, 2])),
                      shape=(len(relations) * n, n))
    Artifact(entities=list(entities), relations=list(relations), matrices=m, observed=obs,
             missing=np.zeros((0, 3), np.int64), meta={"source": source}).save(path)
    return Path(path)
