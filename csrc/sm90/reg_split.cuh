// The register split of a warp-specialised kernel (one producer warpgroup, consumer warpgroups) under setmaxnreg.
#pragma once

namespace omni::sm90 {

// A CTA of 128 * (1 + consumer_wgs) threads is launched with the registers of
// __launch_bounds__(threads, ctas_per_sm): 64K / (threads * ctas_per_sm) per thread, rounded down to 8.
// setmaxnreg.inc waits until the producer's setmaxnreg.dec has returned enough of them, so a split asking for
// more than the launch granted never starts (the kernel hangs).
constexpr bool reg_split_fits(int producer_regs, int consumer_regs, int consumer_wgs, int ctas_per_sm = 1) {
  const int threads = 128 * (1 + consumer_wgs);
  const int launch_regs = 65536 / (threads * ctas_per_sm) / 8 * 8;
  return producer_regs * 128 + consumer_regs * 128 * consumer_wgs <= launch_regs * threads;
}

}  // namespace omni::sm90
