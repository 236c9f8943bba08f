// Schema of the batched shortest-path op (KARPA retrieval, issue 5).
// The CPU kernel lives in csrc/cpu/dijkstra_cpu.cpp; Python wrapper: ops/paths.py
// (ops.dijkstra, with the pure-Python reference backend ops/paths_reference.py and
// the fake kernel in ops/_fake.py); engine.paths builds the graph from triples.
#include <torch/library.h>

TORCH_LIBRARY_FRAGMENT(kgreason, m) {
  // Batched single-source shortest paths over a relation multigraph.
  //
  //   indptr (N+1,) int64, tails (E,) int32, rels (E,) int32: CSR adjacency,
  //       edges of a node sorted by (tail, relation) (parallel edges are
  //       collapsed to the cheapest one inside the kernel);
  //   relation_costs (R,) float32, non-negative (inf = edge unusable);
  //   sources (S,) int64;
  //   targets: (0,) none, (T,) shared by every source, or (S, T) per source,
  //       int64, -1 = padding; the search of a source stops once all its
  //       targets are settled;
  //   heuristic: (0,) none, (N,) shared or (S, N) per source, float32,
  //       admissible lower bound of the remaining cost to the targets (A*);
  //   max_hops: -1 unbounded, else shortest path among paths with <= max_hops edges;
  //   return_predecessors: fill the predecessor outputs;
  //   heap: search strategy. Dijkstra with a priority queue: 0 radix heap (A*
  //       falls back to 4), 2 binary heap, 4 4-ary heap; 3 batched label-correcting
  //       sweeps, 16 sources at a time, for every unbounded search (hop-bounded ones
  //       use the radix heap; targets and heuristic are then only upper bounds on the
  //       work: every distance is computed exactly); 1 auto: sweeps where Dijkstra
  //       could not stop early (unbounded, no targets, no heuristic, >= 8 sources),
  //       else as 0. Distances are identical whatever the strategy; predecessors may
  //       break ties between equal-cost paths differently (csrc/cpu/dijkstra_cpu.cpp).
  //
  // Returns (dist (S, N) float32 [inf unreachable],
  //          pred_entity, pred_relation int32: (S, N) unbounded, (S, H+1, N)
  //              hop-bounded (state (v, k) = v reached with k edges), -1 none;
  //              shape (0,) when return_predecessors is false,
  //          hops (S, N) int32: edges of the reported path, -1 unreachable;
  //              hop-bounded only, else shape (0,)).
  m.def(
      "dijkstra(Tensor indptr, Tensor tails, Tensor rels, Tensor relation_costs, Tensor sources, "
      "Tensor targets, Tensor heuristic, int max_hops, bool return_predecessors, int heap) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
}
