// Host helpers that turn run-time sizes and flags into template arguments.
#pragma once
#include <type_traits>

namespace omni {

// Calls f(std::integral_constant<bool, cond>{}).
template <typename F>
int dispatch_bool(bool cond, F&& f) {
  return cond ? f(std::true_type{}) : f(std::false_type{});
}

// Calls f(std::integral_constant<int, size>{}) for a mask block size of 64 or 128 (checked by the caller).
template <typename F>
int dispatch_block(int size, F&& f) {
  return size == 64 ? f(std::integral_constant<int, 64>{}) : f(std::integral_constant<int, 128>{});
}

}  // namespace omni
