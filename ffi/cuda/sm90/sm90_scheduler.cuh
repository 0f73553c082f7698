// Work scheduling of the persistent SM90 kernels: the work units (whole tiles, or split-K ranges of
// a tile's K) that each cluster takes in turn, and the tile raster.
#pragma once

#include <cuda_runtime.h>

#include "cuda/sm90/sm90_config.cuh"

namespace jga {
namespace sm90 {

// Tiles: linear tile id -> (l, m-tile, n-tile), grouped raster of G m-tiles.
struct TileCoord {
  int l, mt, nt;
};
// Work unit u < whole_tiles: tile u, all of K. Then v = u - whole_tiles: split v / split_tiles of
// tile whole_tiles + v % split_tiles. Every reducer (split S-1) has a larger index than the units
// it waits for, and each CTA runs its units in increasing order, so the lowest unfinished unit never
// waits: no deadlock, however the units land on the CTAs.
struct WorkUnit {
  int tile, split, splits, slab_lo, slab_hi;  // splits: 1 for a whole tile
};
// Kernels without split-K (kSplitK false; the host launches them when splits == 1) decode a unit as
// the whole tile, at compile time: their loops run over all K slabs with no run-time range (one
// cost the large shapes 2.5-4%, measured side by side, through a different instruction schedule of
// the consumer loop).
template <bool kSplitK>
__device__ __forceinline__ WorkUnit DecodeUnit(const KParams& p, int u) {
  WorkUnit w;
  if (!kSplitK || u < p.whole_tiles) {  // folded at compile time without split-K
    w.tile = u;
    w.split = 0;
    w.splits = 1;
    w.slab_lo = 0;
    w.slab_hi = p.num_kslabs;
    return w;
  }
  // Splits 0..S-2 take split_slabs each, the reducer the rest: more than its share, which it works
  // through while the others store their partials (it would otherwise wait for them idle).
  const int v = u - p.whole_tiles;
  w.split = v / p.split_tiles;
  w.tile = p.whole_tiles + (v - w.split * p.split_tiles);
  w.splits = p.splits;
  w.slab_lo = w.split * p.split_slabs;
  w.slab_hi = w.split == p.splits - 1 ? p.num_kslabs : w.slab_lo + p.split_slabs;
  return w;
}
// G: m-tiles per group (Smem::kRasterMTiles).
template <int G = 8>
__device__ __forceinline__ TileCoord DecodeTile(const KParams& p, int tile) {
  TileCoord tc;
  tc.l = tile / p.tiles_per_batch;
  const int rem = tile - tc.l * p.tiles_per_batch;
  const int group_span = G * p.tiles_n;
  const int grp = rem / group_span;
  const int first_m = grp * G;
  const int gsize = min(G, p.tiles_m - first_m);
  const int r = rem - grp * group_span;
  tc.mt = first_m + r % gsize;
  tc.nt = r / gsize;
  return tc;
}

}  // namespace sm90
}  // namespace jga
