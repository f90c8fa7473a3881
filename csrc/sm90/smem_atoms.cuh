// The swizzled shared-memory atoms of the sm_90a kernels' head-dim-wide tiles. TMA writes a [rows, head dim]
// tile as 8-row atoms whose rows are the widest swizzle span that divides the head dim: 64 elements (128 bytes)
// at head dims 64, 128 and 256, 32 elements (64 bytes) at 96. wgmma reads the tile K-major (head dim
// contiguous) through KMajorAtom, or transposed, MN-major, through MNMajorAtom over the same bytes.
#pragma once
#include <cute/tensor.hpp>

namespace omni::sm90 {

using namespace cute;

// Elements in one row of the atoms of a tile kCols wide.
template <int kCols>
constexpr int atom_cols() {
  static_assert(kCols % 32 == 0, "head dims are multiples of 32");
  return kCols % 64 == 0 ? 64 : 32;
}

template <typename Element, int kCols>
using KMajorAtom =
    conditional_t<atom_cols<kCols>() == 64, GMMA::Layout_K_SW128_Atom<Element>, GMMA::Layout_K_SW64_Atom<Element>>;
template <typename Element, int kCols>
using MNMajorAtom =
    conditional_t<atom_cols<kCols>() == 64, GMMA::Layout_MN_SW128_Atom<Element>, GMMA::Layout_MN_SW64_Atom<Element>>;

}  // namespace omni::sm90
