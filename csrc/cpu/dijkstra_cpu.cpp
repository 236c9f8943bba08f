// CPU kernel of kgreason::dijkstra (schema and argument contract: csrc/dijkstra.cpp).
//
// Two strategies, both exact (identical float32 distances, see below):
//  * Batched label-correcting sweeps ("heap" 1 = auto, the default for plain
//    all-targets searches of >= 8 sources, or 3 = always): 16 sources per batch,
//    one 64-byte row of 16 float32 distances per entity (one cache line), and
//    Gauss-Seidel "pull" sweeps over the entities whose in-neighbours changed:
//    row[t] = min(row[t], row[v] + w(v, t)) over t's in-edges, two AVX2 add+min
//    per in-edge for 16 sources at once, no heap and no unpredictable branch in
//    the inner loop. Why it wins: per source, Dijkstra scans every edge once
//    through a branch that mispredicts ~1 time in 8 plus a heap push/pop per
//    improvement (FB15k-237: 423k edges, 1.8 ms per source on one core); the
//    sweeps converge in ~8 passes touching ~6.5 edges per edge and batch, i.e.
//    ~0.4 edge-row updates per edge and source at ~1 ns each (0.4 ms per source).
//    Why it is exact: distances are float32 sums left-folded along a path, and
//    fl(a + w) is monotone in a and >= a for w >= 0; under those two properties
//    both Dijkstra and a converged Bellman-Ford fixpoint equal the minimum over
//    all walks of the folded sum, bit for bit (benchmarks/results/paths.md checks
//    it on FB15k-237; the tests on random graphs with ties and zero costs).
//    Sweeps need no heap, so they cannot stop early: targets, A* heuristics and
//    hop bounds use Dijkstra (auto), and so do calls with < 8 sources (a sweep
//    batch costs about as much as 3-6 Dijkstra searches whatever its lane count).
//  * Dijkstra / A*: one independent search per source.
// Work items (sweep batches, single-source searches) are spread over threads with
// at::parallel_for; each thread pulls them from a shared atomic counter so that
// cheap (early-exit) and expensive ones balance out.
//
// Design choices of the Dijkstra searches:
//  * Parallel edges are collapsed once per call to the cheapest edge (lowest
//    relation id on ties), so a search never scans an edge that cannot win;
//    FB15k-237 has 544k directed edges but only 423k distinct (head, tail) pairs.
//    The collapsed adjacency packs (tail, weight) per edge for locality; the
//    relation id is read only when a label improves.
//  * Priority queue, lazy deletion (only improved labels are pushed; stale
//    entries are skipped when popped), three choices (`heap` argument):
//    0 = radix heap (default for plain Dijkstra: keys are monotone, see
//    RadixHeap), 2 = textbook binary heap, 4 = 4-ary heap (used for A*, whose
//    keys need not be monotone: an 8-byte (float key, uint32 state) entry puts
//    the 4 children of a node in 32 contiguous bytes, and the tree is half as
//    deep as a binary one). benchmarks/test_paths_bench.py measures all three.
//  * A*: the key is g + h(v). Entries are re-opened when their g improves, so an
//    admissible but inconsistent heuristic still gives exact target distances.
//  * Hop-bounded search: the state is (v, k) = v reached with exactly k edges.
//    A state is dominated (skipped) when a state (v, k') with k' <= k and no larger
//    cost is already settled; `best[k][v]` keeps the cheapest settled cost over
//    hop counts <= k. Each node is settled at most H+1 times.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

namespace kgreason {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct HeapEntry {
  float key;
  uint32_t state;
};

inline bool entry_less(const HeapEntry& a, const HeapEntry& b) {
  return a.key < b.key || (a.key == b.key && a.state < b.state);
}

// Min-heap with D children per node.
template <int D>
class DaryHeap {
 public:
  void clear() { v_.clear(); }
  bool empty() const { return v_.empty(); }

  void push(float key, uint32_t state) {
    HeapEntry e{key, state};
    size_t i = v_.size();
    v_.push_back(e);
    while (i > 0) {
      size_t p = (i - 1) / D;
      if (!entry_less(e, v_[p])) break;
      v_[i] = v_[p];
      i = p;
    }
    v_[i] = e;
  }

  HeapEntry pop() {
    HeapEntry top = v_[0];
    HeapEntry last = v_.back();
    v_.pop_back();
    const size_t n = v_.size();
    if (n > 0) {
      size_t i = 0;
      while (true) {
        size_t c = D * i + 1;
        if (c >= n) break;
        size_t best = c;
        const size_t end = std::min(c + D, n);
        for (size_t j = c + 1; j < end; ++j)
          if (entry_less(v_[j], v_[best])) best = j;
        if (!entry_less(v_[best], last)) break;
        v_[i] = v_[best];
        i = best;
      }
      v_[i] = last;
    }
    return top;
  }

 private:
  std::vector<HeapEntry> v_;
};

// Monotone priority queue (radix heap, Ahuja et al. 1990) keyed by the bit
// pattern of a non-negative float, which orders like the float itself. Valid
// for Dijkstra without a heuristic: a pushed key g(v) + w >= the last popped
// key, because weights are non-negative (float addition of a non-negative
// number never decreases). Push is O(1); an entry moves down at most 32 buckets
// in its lifetime, so pops are amortised O(32) cheap sequential moves instead of
// a sift-down with unpredictable branches.
class RadixHeap {
 public:
  void clear() {
    for (auto& b : buckets_) b.clear();
    size_ = 0;
    last_ = 0;
  }
  bool empty() const { return size_ == 0; }

  void push(float key, uint32_t state) {
    uint32_t k = bits(key);
    if (k < last_) k = last_;  // cannot happen for monotone keys; keeps the structure valid
    buckets_[index(k)].push_back(Item{k, state});
    ++size_;
  }

  HeapEntry pop() {
    if (buckets_[0].empty()) {
      size_t i = 1;
      while (buckets_[i].empty()) ++i;
      auto& b = buckets_[i];
      uint32_t mn = b[0].key;
      for (const Item& it : b) mn = std::min(mn, it.key);
      last_ = mn;
      for (const Item& it : b) buckets_[index(it.key)].push_back(it);
      b.clear();
    }
    const Item it = buckets_[0].back();
    buckets_[0].pop_back();
    --size_;
    float f;
    std::memcpy(&f, &it.key, sizeof f);
    return HeapEntry{f, it.state};
  }

 private:
  struct Item {
    uint32_t key;
    uint32_t state;
  };
  static uint32_t bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  }
  size_t index(uint32_t k) const { return k == last_ ? 0 : 32 - __builtin_clz(k ^ last_); }

  std::array<std::vector<Item>, 33> buckets_;
  size_t size_ = 0;
  uint32_t last_ = 0;
};

struct PackedEdge {
  int32_t tail;
  float weight;
};

// A compressed adjacency: entity v's edges are edges[indptr[v] .. indptr[v + 1]), rel[i] edge i's relation.
template <class Edge>
struct Csr {
  std::vector<int64_t> indptr;
  std::vector<Edge> edges;
  std::vector<int32_t> rel;
};

using Adjacency = Csr<PackedEdge>;

// Collapse runs of equal tails to the cheapest edge and drop unusable (inf) edges.
Adjacency collapse(const int64_t* indptr, const int32_t* tails, const int32_t* rels, const float* costs,
                   int64_t n) {
  Adjacency adj;
  adj.indptr.assign(n + 1, 0);
  auto scan = [&](int64_t u, auto&& emit) {
    int64_t e = indptr[u];
    const int64_t end = indptr[u + 1];
    while (e < end) {
      const int32_t t = tails[e];
      float w = costs[rels[e]];
      int32_t r = rels[e];
      int64_t f = e + 1;
      for (; f < end && tails[f] == t; ++f) {
        const float wf = costs[rels[f]];
        if (wf < w || (wf == w && rels[f] < r)) {
          w = wf;
          r = rels[f];
        }
      }
      if (w < kInf) emit(t, w, r);
      e = f;
    }
  };
  at::parallel_for(0, n, 2048, [&](int64_t b, int64_t en) {
    for (int64_t u = b; u < en; ++u) {
      int64_t c = 0;
      scan(u, [&](int32_t, float, int32_t) { ++c; });
      adj.indptr[u + 1] = c;
    }
  });
  for (int64_t u = 0; u < n; ++u) adj.indptr[u + 1] += adj.indptr[u];
  adj.edges.resize(adj.indptr[n]);
  adj.rel.resize(adj.indptr[n]);
  at::parallel_for(0, n, 2048, [&](int64_t b, int64_t en) {
    for (int64_t u = b; u < en; ++u) {
      int64_t pos = adj.indptr[u];
      scan(u, [&](int32_t t, float w, int32_t r) {
        adj.edges[pos] = PackedEdge{t, w};
        adj.rel[pos] = r;
        ++pos;
      });
    }
  });
  return adj;
}

struct Problem {
  const Adjacency* adj;
  int64_t n;
  int64_t hops;  // -1 unbounded
  const int64_t* sources;
  const int64_t* targets;  // nullptr: none
  int64_t num_targets;     // per source
  bool targets_shared;
  const float* heuristic;  // nullptr: none
  bool heuristic_shared;
  float* dist;       // (S, N)
  int32_t* pred_e;   // (S, [H+1,] N) or nullptr
  int32_t* pred_r;
  int32_t* hop_out;  // (S, N) or nullptr
};

// Per-thread scratch, reused across the sources a thread handles.
template <class Heap>
struct Workspace {
  Heap heap;
  std::vector<uint8_t> target_mark;  // N, 1 = unsettled target of the current source
  std::vector<float> g;              // (H+1)*N, hop-bounded only
  std::vector<float> best;           // (H+1)*N, hop-bounded only
  std::vector<uint8_t> touched_flag; // N, hop-bounded only
  std::vector<int32_t> touched;

  Workspace(const Problem& p) : target_mark(p.targets ? p.n : 0, 0) {
    if (p.hops >= 0) {
      g.assign((p.hops + 1) * p.n, kInf);
      best.assign((p.hops + 1) * p.n, kInf);
      touched_flag.assign(p.n, 0);
    }
  }
};

// Marks the targets of source s; returns how many distinct ones there are.
int64_t mark_targets(const Problem& p, int64_t s, std::vector<uint8_t>& mark) {
  if (!p.targets) return 0;
  const int64_t* t = p.targets + (p.targets_shared ? 0 : s * p.num_targets);
  int64_t count = 0;
  for (int64_t i = 0; i < p.num_targets; ++i) {
    if (t[i] < 0) continue;
    if (!mark[t[i]]) {
      mark[t[i]] = 1;
      ++count;
    }
  }
  return count;
}

void unmark_targets(const Problem& p, int64_t s, std::vector<uint8_t>& mark) {
  if (!p.targets) return;
  const int64_t* t = p.targets + (p.targets_shared ? 0 : s * p.num_targets);
  for (int64_t i = 0; i < p.num_targets; ++i)
    if (t[i] >= 0) mark[t[i]] = 0;
}

template <class Heap>
void search_unbounded(const Problem& p, int64_t s, Workspace<Heap>& ws) {
  const int64_t n = p.n;
  const Adjacency& adj = *p.adj;
  float* dist = p.dist + s * n;
  int32_t* pe = p.pred_e ? p.pred_e + s * n : nullptr;
  int32_t* pr = p.pred_r ? p.pred_r + s * n : nullptr;
  const float* h = p.heuristic ? p.heuristic + (p.heuristic_shared ? 0 : s * n) : nullptr;
  int64_t remaining = mark_targets(p, s, ws.target_mark);
  const bool has_targets = remaining > 0;
  auto& heap = ws.heap;
  heap.clear();

  const int64_t src = p.sources[s];
  dist[src] = 0.f;
  const float hs = h ? h[src] : 0.f;
  if (hs < kInf) heap.push(hs, static_cast<uint32_t>(src));
  while (!heap.empty()) {
    const HeapEntry e = heap.pop();
    const int64_t v = e.state;
    const float gv = dist[v];
    if (e.key > gv + (h ? h[v] : 0.f)) continue;  // stale: v improved after this push
    if (has_targets && ws.target_mark[v]) {
      ws.target_mark[v] = 0;
      if (--remaining == 0) break;
    }
    for (int64_t i = adj.indptr[v], end = adj.indptr[v + 1]; i < end; ++i) {
      const PackedEdge ed = adj.edges[i];
      const float ng = gv + ed.weight;
      if (ng < dist[ed.tail]) {
        dist[ed.tail] = ng;
        if (pe) {
          pe[ed.tail] = static_cast<int32_t>(v);
          pr[ed.tail] = adj.rel[i];
        }
        const float key = h ? ng + h[ed.tail] : ng;
        if (key < kInf) heap.push(key, static_cast<uint32_t>(ed.tail));
      }
    }
  }
  unmark_targets(p, s, ws.target_mark);
}

template <class Heap>
void search_hop_bounded(const Problem& p, int64_t s, Workspace<Heap>& ws) {
  const int64_t n = p.n;
  const int64_t H = p.hops;
  const Adjacency& adj = *p.adj;
  float* dist = p.dist + s * n;
  int32_t* hop_out = p.hop_out + s * n;
  int32_t* pe = p.pred_e ? p.pred_e + s * (H + 1) * n : nullptr;
  int32_t* pr = p.pred_r ? p.pred_r + s * (H + 1) * n : nullptr;
  const float* h = p.heuristic ? p.heuristic + (p.heuristic_shared ? 0 : s * n) : nullptr;
  int64_t remaining = mark_targets(p, s, ws.target_mark);
  const bool has_targets = remaining > 0;
  float* g = ws.g.data();
  float* best = ws.best.data();
  auto touch = [&](int64_t v) {
    if (!ws.touched_flag[v]) {
      ws.touched_flag[v] = 1;
      ws.touched.push_back(static_cast<int32_t>(v));
    }
  };
  auto& heap = ws.heap;
  heap.clear();

  const int64_t src = p.sources[s];
  g[src] = 0.f;
  touch(src);
  const float hs = h ? h[src] : 0.f;
  if (hs < kInf) heap.push(hs, static_cast<uint32_t>(src));
  while (!heap.empty()) {
    const HeapEntry e = heap.pop();
    const int64_t st = e.state;
    const int64_t v = st % n;
    const int64_t k = st / n;
    const float gs = g[st];
    const float hv = h ? h[v] : 0.f;
    if (e.key > gs + hv) continue;  // stale
    if (best[st] <= gs) continue;   // dominated by a settled (v, k' <= k)
    for (int64_t kk = k; kk <= H; ++kk) {
      float& b = best[kk * n + v];
      if (gs < b) b = gs;
    }
    // Equal costs: report the fewest hops (the radix heap pops ties in any order).
    if (gs < dist[v] || (gs == dist[v] && k < hop_out[v])) {
      dist[v] = gs;
      hop_out[v] = static_cast<int32_t>(k);
    }
    if (has_targets && ws.target_mark[v]) {
      ws.target_mark[v] = 0;
      if (--remaining == 0) break;
    }
    if (k == H) continue;
    const int64_t base = (k + 1) * n;
    for (int64_t i = adj.indptr[v], end = adj.indptr[v + 1]; i < end; ++i) {
      const PackedEdge ed = adj.edges[i];
      const float ng = gs + ed.weight;
      const int64_t s2 = base + ed.tail;
      if (ng < g[s2] && ng < best[s2]) {
        touch(ed.tail);
        g[s2] = ng;
        if (pe) {
          pe[s2] = static_cast<int32_t>(v);
          pr[s2] = adj.rel[i];
        }
        const float key = h ? ng + h[ed.tail] : ng;
        if (key < kInf) heap.push(key, static_cast<uint32_t>(s2));
      }
    }
  }
  for (int32_t v : ws.touched) {
    for (int64_t kk = 0; kk <= H; ++kk) {
      g[kk * n + v] = kInf;
      best[kk * n + v] = kInf;
    }
    ws.touched_flag[v] = 0;
  }
  ws.touched.clear();
  unmark_targets(p, s, ws.target_mark);
}

// ---------------------------------------------------------------- batched sweeps

constexpr int kLanes = 16;  // sources per sweep batch: 16 float32 = one 64-byte cache line per entity
typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));

// The 16 tentative distances of one entity, one cache line: a pull reads whole
// lines (8 lanes = half a line wasted half of every random read and ran ~2x
// slower per source on FB15k-237; 32 lanes = two lines, 1.9 MiB per batch,
// spilled out of L2 and gained nothing).
struct alignas(64) LaneRow {
  F8 v[2];
};

struct InEdge {
  int32_t head;
  float weight;
};

// In-edges of every entity (the collapsed adjacency transposed), sorted by head:
// the sweeps pull along them.
using InAdjacency = Csr<InEdge>;

InAdjacency transpose(const Adjacency& adj, int64_t n) {
  InAdjacency in;
  in.indptr.assign(n + 1, 0);
  const int64_t m = adj.indptr[n];
  for (int64_t i = 0; i < m; ++i) ++in.indptr[adj.edges[i].tail + 1];
  for (int64_t v = 0; v < n; ++v) in.indptr[v + 1] += in.indptr[v];
  in.edges.resize(m);
  in.rel.resize(m);
  std::vector<int64_t> pos(in.indptr.begin(), in.indptr.end() - 1);
  for (int64_t u = 0; u < n; ++u)
    for (int64_t i = adj.indptr[u]; i < adj.indptr[u + 1]; ++i) {
      const int64_t j = pos[adj.edges[i].tail]++;
      in.edges[j] = InEdge{static_cast<int32_t>(u), adj.edges[i].weight};
      in.rel[j] = adj.rel[i];
    }
  return in;
}

struct SweepWorkspace {
  std::vector<LaneRow> rows;   // N
  std::vector<uint8_t> dirty;  // N, 1 = an in-neighbour changed since the entity's last pull
  std::vector<uint8_t> flat;   // N, predecessor pass only
  std::vector<int32_t> queue;  // predecessor pass only
  explicit SweepWorkspace(int64_t n) : rows(n), dirty(n, 0) {}
};

inline float lane(const LaneRow& r, int j) { return r.v[j >> 3][j & 7]; }
inline void set_lane(LaneRow& r, int j, float x) { r.v[j >> 3][j & 7] = x; }

// Predecessors of one sweep batch from its converged distances. For entity t and
// source j: among the in-edges (v, w) that attain the distance (fl(d(v) + w) ==
// d(t), "tight"), the one with the smallest d(v), the lowest head id (then the
// collapsed edge's relation) on ties; following such predecessors strictly
// decreases d, so they form a tree. Entities whose tight in-edges all come from
// entities at the same distance ("flat": zero-cost edges, or a cost below half an
// ulp of d) are then linked breadth-first from the already linked ones along
// tight equal-distance edges, which again cannot close a cycle.
void sweep_predecessors(const Problem& p, const InAdjacency& in, int64_t first, int lanes, SweepWorkspace& ws) {
  const int64_t n = p.n;
  const Adjacency& adj = *p.adj;
  const LaneRow* rows = ws.rows.data();
  int64_t num_flat[kLanes] = {0};
  for (int64_t t = 0; t < n; ++t) {
    const LaneRow dt = rows[t];
    F8 best[2] = {dt.v[0], dt.v[1]};
    I8 edge[2] = {I8{} - 1, I8{} - 1};
    for (int64_t i = in.indptr[t], end = in.indptr[t + 1]; i < end; ++i) {
      const LaneRow& dv = rows[in.edges[i].head];
      const int32_t idx = static_cast<int32_t>(i);
      for (int q = 0; q < 2; ++q) {
        const F8 c = dv.v[q] + in.edges[i].weight;
        const I8 take = (c == dt.v[q]) & (dv.v[q] < best[q]);
        best[q] = take ? dv.v[q] : best[q];
        edge[q] = take ? I8{} + idx : edge[q];
      }
    }
    for (int j = 0; j < lanes; ++j) {
      const int32_t e = edge[j >> 3][j & 7];
      if (e >= 0) {
        p.pred_e[(first + j) * n + t] = in.edges[e].head;
        p.pred_r[(first + j) * n + t] = in.rel[e];
      } else if (lane(dt, j) != kInf && t != p.sources[first + j]) {
        ++num_flat[j];
      }
    }
  }
  // Flat entities, per source (rare: most graphs have none).
  for (int j = 0; j < lanes; ++j) {
    if (num_flat[j] == 0) continue;
    const int64_t s = first + j;
    const int64_t src = p.sources[s];
    int32_t* pe = p.pred_e + s * n;
    int32_t* pr = p.pred_r + s * n;
    ws.flat.assign(n, 0);
    ws.queue.clear();
    for (int64_t t = 0; t < n; ++t) {
      if (lane(rows[t], j) == kInf) continue;
      if (t == src || pe[t] >= 0)
        ws.queue.push_back(static_cast<int32_t>(t));
      else
        ws.flat[t] = 1;
    }
    int64_t& left = num_flat[j];
    for (size_t h = 0; h < ws.queue.size() && left > 0; ++h) {
      const int32_t u = ws.queue[h];
      const float du = lane(rows[u], j);
      for (int64_t i = adj.indptr[u], end = adj.indptr[u + 1]; i < end; ++i) {
        const int32_t t = adj.edges[i].tail;
        if (ws.flat[t] && du + adj.edges[i].weight == lane(rows[t], j)) {
          ws.flat[t] = 0;
          --left;
          pe[t] = u;
          pr[t] = adj.rel[i];
          ws.queue.push_back(t);
        }
      }
    }
    TORCH_CHECK(left == 0, "dijkstra: internal error: ", left, " entities without a predecessor");
  }
}

// Shortest distances from sources [first, first + lanes) (lanes <= 16), one lane each.
// Returns false, having written nothing, when the sweeps exceed their work budget:
// Gauss-Seidel needs one sweep per "descent" of a shortest path against the
// entity order, so a long chain numbered backwards would take O(N) sweeps of an
// O(N) dirty scan each; the caller then runs Dijkstra for these sources. The
// budget, 16 * (E + N) pulled edges and scanned entities whatever the lane count
// (a batch's work barely depends on it), costs about what 4 Dijkstra searches do
// (~4x the cost per edge), so a fallback at most doubles a batch's time; FB15k-237
// uses ~6 E per batch of 8 or 16 sources.
bool sweep_batch(const Problem& p, const InAdjacency& in, int64_t first, int lanes, SweepWorkspace& ws) {
  const int64_t n = p.n;
  LaneRow* __restrict rows = ws.rows.data();
  uint8_t* __restrict dirty = ws.dirty.data();  // restrict: the byte stores must not force reloads
  const int64_t* __restrict out_ptr = p.adj->indptr.data();
  const PackedEdge* __restrict out_edges = p.adj->edges.data();
  const int64_t* __restrict in_ptr = in.indptr.data();
  const InEdge* __restrict in_edges = in.edges.data();

  F8 inf;
  for (int j = 0; j < 8; ++j) inf[j] = kInf;
  for (int64_t v = 0; v < n; ++v) rows[v].v[0] = rows[v].v[1] = inf;
  // Entities to pull: marked when an in-neighbour changes (the out-neighbours of
  // a changed entity), cleared when pulled; an entity later in the order is
  // pulled in the same sweep (Gauss-Seidel: ~8 sweeps on FB15k-237 instead of
  // ~13 = the deepest shortest-path tree + 1 with Jacobi sweeps).
  auto mark = [&](int64_t v) {
    for (int64_t i = out_ptr[v], end = out_ptr[v + 1]; i < end; ++i) dirty[out_edges[i].tail] = 1;
  };
  for (int j = 0; j < lanes; ++j) set_lane(rows[p.sources[first + j]], j, 0.f);
  for (int j = 0; j < lanes; ++j) mark(p.sources[first + j]);
  const int64_t budget = kLanes * (in_ptr[n] + n);
  int64_t work = 0;
  for (bool changed = true; changed;) {
    changed = false;
    work += n;
    if (work > budget) {
      std::memset(dirty, 0, n);
      return false;
    }
    for (int64_t t = 0; t < n; ++t) {
      if (!dirty[t]) continue;
      dirty[t] = 0;
      work += in_ptr[t + 1] - in_ptr[t];
      const F8 old0 = rows[t].v[0], old1 = rows[t].v[1];
      F8 a0 = old0, a1 = old1;
      for (int64_t i = in_ptr[t], end = in_ptr[t + 1]; i < end; ++i) {
        const LaneRow& dv = rows[in_edges[i].head];
        const float w = in_edges[i].weight;
        const F8 c0 = dv.v[0] + w, c1 = dv.v[1] + w;
        a0 = c0 < a0 ? c0 : a0;
        a1 = c1 < a1 ? c1 : a1;
      }
      const I8 diff = (a0 != old0) | (a1 != old1);
      bool any = false;
      for (int j = 0; j < 8; ++j) any |= diff[j] != 0;
      if (any) {
        rows[t].v[0] = a0;
        rows[t].v[1] = a1;
        mark(t);
        changed = true;
      }
    }
  }
  for (int j = 0; j < lanes; ++j) {
    float* dist = p.dist + (first + j) * n;
    for (int64_t v = 0; v < n; ++v) dist[v] = lane(rows[v], j);
  }
  if (p.pred_e) sweep_predecessors(p, in, first, lanes, ws);
  return true;
}

// Sweep batches over sources [0, swept), Dijkstra (with Heap) over [swept, S).
template <class Heap>
void run_all(const Problem& p, int64_t num_sources, int64_t swept, const InAdjacency* in) {
  std::vector<std::pair<int64_t, int>> batches;  // (first source, lanes)
  if (swept > 0) {
    // As few batches as 16 lanes allow, but at least one per thread while each
    // keeps >= 8 lanes (a batch's cost grows slowly with its lane count);
    // lanes spread evenly so that no batch is a small remainder.
    int64_t count = (swept + kLanes - 1) / kLanes;
    count = std::max<int64_t>(count, std::min<int64_t>(at::get_num_threads(), swept / 8));
    for (int64_t b = 0, first = 0; b < count; ++b) {
      const int lanes = static_cast<int>(swept / count + (b < swept % count ? 1 : 0));
      batches.emplace_back(first, lanes);
      first += lanes;
    }
  }
  const int64_t num_batches = static_cast<int64_t>(batches.size());
  const int64_t jobs = num_batches + (num_sources - swept);
  std::atomic<int64_t> next{0};
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), jobs));
  at::parallel_for(0, workers, 1, [&](int64_t b, int64_t e) {
    for (int64_t w = b; w < e; ++w) {
      std::unique_ptr<SweepWorkspace> sws;
      std::unique_ptr<Workspace<Heap>> ws;
      for (int64_t j = next.fetch_add(1); j < jobs; j = next.fetch_add(1)) {
        if (j < num_batches) {
          if (!sws) sws = std::make_unique<SweepWorkspace>(p.n);
          if (sweep_batch(p, *in, batches[j].first, batches[j].second, *sws)) continue;
          if (!ws) ws = std::make_unique<Workspace<Heap>>(p);  // over budget: Dijkstra (unbounded here)
          for (int64_t s = batches[j].first; s < batches[j].first + batches[j].second; ++s)
            search_unbounded<Heap>(p, s, *ws);
          continue;
        }
        const int64_t s = swept + (j - num_batches);
        if (!ws) ws = std::make_unique<Workspace<Heap>>(p);
        if (p.hops >= 0)
          search_hop_bounded<Heap>(p, s, *ws);
        else
          search_unbounded<Heap>(p, s, *ws);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> dijkstra_cpu(
    const at::Tensor& indptr_in, const at::Tensor& tails_in, const at::Tensor& rels_in,
    const at::Tensor& costs_in, const at::Tensor& sources_in, const at::Tensor& targets_in,
    const at::Tensor& heuristic_in, int64_t max_hops, bool return_predecessors, int64_t heap) {
  TORCH_CHECK(indptr_in.dim() == 1 && indptr_in.numel() >= 1, "dijkstra: indptr must be 1-D (N+1,)");
  TORCH_CHECK(tails_in.dim() == 1 && rels_in.dim() == 1 && tails_in.numel() == rels_in.numel(),
              "dijkstra: tails and rels must be 1-D of equal length");
  TORCH_CHECK(costs_in.dim() == 1, "dijkstra: relation_costs must be 1-D (R,)");
  TORCH_CHECK(sources_in.dim() == 1, "dijkstra: sources must be 1-D (S,)");
  TORCH_CHECK(heap >= 0 && heap <= 4, "dijkstra: heap must be 0 (radix), 1 (auto), 2 (binary), 3 (sweep) or 4 (4-ary), got ",
              heap);
  TORCH_CHECK(max_hops >= -1, "dijkstra: max_hops must be >= 0 or -1 (unbounded), got ", max_hops);

  const at::Tensor indptr = indptr_in.to(at::kLong).contiguous();
  const at::Tensor tails = tails_in.to(at::kInt).contiguous();
  const at::Tensor rels = rels_in.to(at::kInt).contiguous();
  const at::Tensor costs = costs_in.to(at::kFloat).contiguous();
  const at::Tensor sources = sources_in.to(at::kLong).contiguous();
  const int64_t n = indptr.numel() - 1;
  const int64_t num_edges = tails.numel();
  const int64_t num_rel = costs.numel();
  const int64_t num_sources = sources.numel();
  const int64_t layers = max_hops >= 0 ? max_hops + 1 : 1;
  TORCH_CHECK(layers * n < (int64_t(1) << 32), "dijkstra: (max_hops+1) * N must be < 2^32");

  const int64_t* ip = indptr.data_ptr<int64_t>();
  TORCH_CHECK(ip[0] == 0 && ip[n] == num_edges, "dijkstra: indptr must start at 0 and end at E=", num_edges);
  for (int64_t u = 0; u < n; ++u) TORCH_CHECK(ip[u] <= ip[u + 1], "dijkstra: indptr must be non-decreasing");
  {
    const int32_t* t = tails.data_ptr<int32_t>();
    const int32_t* r = rels.data_ptr<int32_t>();
    for (int64_t e = 0; e < num_edges; ++e) {
      TORCH_CHECK(t[e] >= 0 && t[e] < n, "dijkstra: tail ", t[e], " of edge ", e, " out of range [0, ", n, ")");
      TORCH_CHECK(r[e] >= 0 && r[e] < num_rel, "dijkstra: relation ", r[e], " of edge ", e, " out of range [0, ",
                  num_rel, ")");
    }
    const float* c = costs.data_ptr<float>();
    for (int64_t i = 0; i < num_rel; ++i)
      TORCH_CHECK(c[i] >= 0.f, "dijkstra: cost of relation ", i, " is ", c[i], " (must be non-negative, not NaN)");
    const int64_t* sp = sources.data_ptr<int64_t>();
    for (int64_t i = 0; i < num_sources; ++i)
      TORCH_CHECK(sp[i] >= 0 && sp[i] < n, "dijkstra: source ", sp[i], " out of range [0, ", n, ")");
  }

  at::Tensor targets;
  bool targets_shared = true;
  int64_t num_targets = 0;
  if (targets_in.numel() > 0) {
    targets = targets_in.to(at::kLong).contiguous();
    TORCH_CHECK(targets.dim() == 1 || (targets.dim() == 2 && targets.size(0) == num_sources),
                "dijkstra: targets must be (T,) or (S, T)");
    targets_shared = targets.dim() == 1;
    num_targets = targets.size(-1);
    const int64_t* tp = targets.data_ptr<int64_t>();
    for (int64_t i = 0; i < targets.numel(); ++i)
      TORCH_CHECK(tp[i] >= -1 && tp[i] < n, "dijkstra: target ", tp[i], " out of range [0, ", n, ") (-1 = padding)");
  }
  at::Tensor heuristic;
  bool heuristic_shared = true;
  if (heuristic_in.numel() > 0) {
    heuristic = heuristic_in.to(at::kFloat).contiguous();
    TORCH_CHECK((heuristic.dim() == 1 && heuristic.size(0) == n) ||
                    (heuristic.dim() == 2 && heuristic.size(0) == num_sources && heuristic.size(1) == n),
                "dijkstra: heuristic must be (N,) or (S, N)");
    heuristic_shared = heuristic.dim() == 1;
    const float* hp = heuristic.data_ptr<float>();
    for (int64_t i = 0; i < heuristic.numel(); ++i)
      TORCH_CHECK(hp[i] >= 0.f, "dijkstra: heuristic entry ", i, " is ", hp[i], " (must be non-negative, not NaN)");
  }

  const Adjacency adj = collapse(ip, tails.data_ptr<int32_t>(), rels.data_ptr<int32_t>(), costs.data_ptr<float>(), n);

  auto fopt = at::TensorOptions().dtype(at::kFloat);
  auto iopt = at::TensorOptions().dtype(at::kInt);
  at::Tensor dist = at::full({num_sources, n}, kInf, fopt);
  at::Tensor pred_e = at::empty({0}, iopt), pred_r = at::empty({0}, iopt), hops = at::empty({0}, iopt);
  if (return_predecessors) {
    std::vector<int64_t> shape = max_hops >= 0 ? std::vector<int64_t>{num_sources, layers, n}
                                               : std::vector<int64_t>{num_sources, n};
    pred_e = at::full(shape, -1, iopt);
    pred_r = at::full(shape, -1, iopt);
  }
  if (max_hops >= 0) hops = at::full({num_sources, n}, -1, iopt);

  Problem p;
  p.adj = &adj;
  p.n = n;
  p.hops = max_hops;
  p.sources = sources.data_ptr<int64_t>();
  p.targets = num_targets > 0 ? targets.data_ptr<int64_t>() : nullptr;
  p.num_targets = num_targets;
  p.targets_shared = targets_shared;
  p.heuristic = heuristic.defined() ? heuristic.data_ptr<float>() : nullptr;
  p.heuristic_shared = heuristic_shared;
  p.dist = dist.data_ptr<float>();
  p.pred_e = return_predecessors ? pred_e.data_ptr<int32_t>() : nullptr;
  p.pred_r = return_predecessors ? pred_r.data_ptr<int32_t>() : nullptr;
  p.hop_out = max_hops >= 0 ? hops.data_ptr<int32_t>() : nullptr;

  if (num_sources > 0 && n > 0) {
    // Sweeps: "sweep" (3) for every unbounded search; "auto" (1) only where Dijkstra
    // cannot stop early (no targets, no heuristic) and a batch gets >= 8 sources.
    int64_t swept = 0;
    if (max_hops < 0 && (heap == 3 || (heap == 1 && !p.targets && !p.heuristic && num_sources >= 8)))
      swept = num_sources;
    InAdjacency in;
    if (swept > 0) in = transpose(adj, n);
    // The radix heap needs monotone keys: not guaranteed with a heuristic (A* keys
    // g + h are monotone only for consistent h), so A* always uses the 4-ary heap.
    if ((heap == 0 || heap == 1 || heap == 3) && !p.heuristic)
      run_all<RadixHeap>(p, num_sources, swept, &in);
    else if (heap == 2)
      run_all<DaryHeap<2>>(p, num_sources, swept, &in);
    else
      run_all<DaryHeap<4>>(p, num_sources, swept, &in);
  }
  return {dist, pred_e, pred_r, hops};
}

}  // namespace

TORCH_LIBRARY_IMPL(kgreason, CPU, m) { m.impl("dijkstra", &dijkstra_cpu); }

}  // namespace kgreason
