"""Write BetaE's 1p test queries of a KG as engine JSON Lines: every (anchor, relation) of a test edge.

    python benchmarks/betae_1p_queries.py --kg ../shared/data/betae/FB15k-237-betae --out fb237_1p_official.jsonl
    python -m engine.evaluate --artifact artifacts/FB15k-237 --queries fb237_1p_official.jsonl

BetaE builds its 1p test set from the test edges: one query per ``(h, r)`` of a
test edge (both directions), easy answers = tails on train + valid, hard
answers = the test tails that are not easy, queries without hard answers
dropped.  On FB15k-237 this gives exactly BetaE's published count, 22,812
queries.  Our sampler (``engine.sample``) draws anchors uniformly instead,
which favours rare entities, so its 1p MRR is not comparable with published
1p numbers (QTO's 49.0); this file is.
"""
from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from kgreason.errors import UserError, cli_main


@cli_main
def main(argv=None) -> int:
    from engine.lang.query import Anchor, Projection, to_sexpr
    from kge.graph import load_kg
    from kgreason.cli import ArgumentParser
    from kgreason.files import check_output_file, open_output
    from kgreason.text import json_line  # KG names in the expressions: controls, bidi, U+2028/9 escaped

    p = ArgumentParser(prog="python benchmarks/betae_1p_queries.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--kg", required=True, help="a KG with train/valid/test splits (a BetaE folder or dataset name)")
    p.add_argument("--out", required=True, help="the queries file to write (JSON lines)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    args = p.parse_args(argv)
    check_output_file(args.out, what="--out", inputs=[("--kg", args.kg)])  # before the KG is read
    if Path(args.out).exists() and not args.overwrite:
        raise UserError(f"--out {args.out}: already exists; pass --overwrite to replace it")
    kg = load_kg(args.kg)
    easy: dict[tuple[int, int], set[int]] = defaultdict(set)
    for h, r, t in np.concatenate([kg.train, kg.valid]).tolist():
        easy[(h, r)].add(t)
    hard: dict[tuple[int, int], set[int]] = defaultdict(set)
    for h, r, t in kg.test.tolist():
        if t not in easy[(h, r)]:
            hard[(h, r)].add(t)
    n = 0
    with open_output(args.out, what="--out") as f:
        for (h, r), ts in hard.items():
            node = Projection(relation=kg.relations[r], arg=Anchor(entity=kg.entities[h]))
            f.write(json_line({"structure": "1p", "expr": to_sexpr(node), "easy": sorted(easy[(h, r)]),
                               "hard": sorted(ts)}) + "\n")
            n += 1
    print(f"wrote {n:,} 1p queries to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
