// Views and conversions of mma.sync m16n8 accumulator fragments, shared by forward and backward.
#pragma once
#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace omni {

using namespace cute;

// ((2, 2), MMA_M, MMA_N) accumulator layout -> ((2, MMA_M), (2, MMA_N)) = (rows, cols) of this thread.
// Mode 0 of an m16n8 accumulator is (column pair, row + 8).
template <class Layout>
__forceinline__ __device__ auto rowcol_layout(Layout layout) {
  static_assert(decltype(rank(layout))::value == 3, "expected an (MMA, MMA_M, MMA_N) layout");
  static_assert(decltype(size<0>(layout))::value == 4, "expected an m16n8 accumulator");
  auto l = logical_divide(layout, Shape<_2>{});
  return make_layout(make_layout(get<0, 1>(l), get<1>(l)), make_layout(get<0, 0>(l), get<2>(l)));
}

// The same registers viewed as (row, col): works for accumulators and for identity (coordinate) tensors.
template <class Tensor>
__forceinline__ __device__ auto rowcol(Tensor&& t) {
  return make_tensor(t.data(), rowcol_layout(t.layout()));
}

// ((2, 2), MMA_M, MMA_N) accumulator -> ((2, 2, 2), MMA_M, MMA_N / 2): the A operand of an m16n8k16 MMA
// (two neighbouring n8 tiles make one k16 slice), so P = softmax(S) feeds P.V without touching smem.
template <class Layout>
__forceinline__ __device__ auto acc_as_a_operand_layout(Layout layout) {
  static_assert(decltype(size<2>(layout))::value % 2 == 0, "MMA_N must be even");
  auto l = logical_divide(layout, Shape<Underscore, Underscore, _2>{});
  return make_layout(make_layout(get<0>(l), get<2, 0>(l)), get<1>(l), get<2, 1>(l));
}

// Converts a compact register fragment to another element type (float -> half / bf16 in pairs).
template <typename To, class Engine, class Layout>
__forceinline__ __device__ auto convert_fragment(const Tensor<Engine, Layout>& src) {
  using From = typename Engine::value_type;
  constexpr int kNum = decltype(size(src))::value;
  auto dst = make_tensor<To>(src.layout());
  cutlass::NumericArrayConverter<To, From, kNum> convert;
  *reinterpret_cast<cutlass::Array<To, kNum>*>(dst.data()) =
      convert(*reinterpret_cast<const cutlass::Array<From, kNum>*>(src.data()));
  return dst;
}

}  // namespace omni
