// numpy's Zipf sampler (Devroye's rejection method) for the C++ lookup benchmarks, so their ids
// follow the same distribution as benchmarks/lookup_floor.py's (rng.zipf).
#ifndef TTF_BENCHMARKS_ZIPF_SAMPLER_H_
#define TTF_BENCHMARKS_ZIPF_SAMPLER_H_

#include <cmath>
#include <cstdint>
#include <random>

inline int64_t Zipf(std::mt19937_64& rng, double a) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  const double am1 = a - 1.0, b = std::pow(2.0, am1);
  for (;;) {
    const double x = std::floor(std::pow(1.0 - u(rng), -1.0 / am1));
    const double v = u(rng);
    if (x > 9.0e18 || x < 1.0) continue;
    const double t = std::pow(1.0 + 1.0 / x, am1);
    if (v * x * (t - 1.0) / (b - 1.0) <= t / b) return static_cast<int64_t>(x);
  }
}

#endif  // TTF_BENCHMARKS_ZIPF_SAMPLER_H_
