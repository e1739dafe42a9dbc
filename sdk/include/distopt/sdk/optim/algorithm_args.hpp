// The argument checks every algorithm's constructor starts with: the
// dopt_algorithm_args the host hands to create() (algorithm.h) must carry
// the common args, a rank within a world of at least one rank, the arrays
// their counts promise, and the communicator and reducer the algorithm
// uses. One helper, so every algorithm refuses the same bad input with the
// same message. Header-only, torch-free; pure, thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "distopt/algorithm.h"
#include "distopt/sdk/base/host.hpp"

namespace distopt::sdk {

/// What an algorithm needs of dopt_algorithm_args beyond the common args;
/// flags, or-ed together.
enum AlgorithmNeeds : uint32_t {
  kNeedsNothing = 0,
  kNeedsReducer = 1u << 0,  ///< args.reducer set (vt and instance)
  kNeedsComm = 1u << 1,     ///< args.comm set (vt and instance), at any world size
  /// args.comm set when world_size > 1 (one rank talks to nobody).
  kNeedsCommWhenDistributed = 1u << 2,
};

inline AlgorithmNeeds operator|(AlgorithmNeeds a, AlgorithmNeeds b) {
  return static_cast<AlgorithmNeeds>(static_cast<uint32_t>(a) | static_cast<uint32_t>(b));
}

/// Checks `args` for the algorithm named `algorithm` and returns
/// *args.common, so that a constructor can check before its members read
/// the arguments (`rank_(sdk::check_algorithm_args(args, "zero").rank)`,
/// with rank_ declared before any member built from args). Throws
/// sdk::Error(DOPT_ERR_INVALID_ARGUMENT) whose message starts with
/// "<algorithm>: " and names the field, when: args.common is null;
/// world_size < 1; rank is outside [0, world_size); params, groups or
/// buckets is null while its count is not 0; a trainable parameter's group
/// is outside [0, num_groups); or what `needs` asks for is missing.
inline const dopt_create_args& check_algorithm_args(const dopt_algorithm_args& args,
                                                    const std::string& algorithm,
                                                    AlgorithmNeeds needs = kNeedsNothing) {
  const auto bad = [&](const std::string& what) {
    return Error(DOPT_ERR_INVALID_ARGUMENT, algorithm + ": " + what);
  };
  if (!args.common) throw bad("dopt_algorithm_args.common is null");
  const dopt_create_args& c = *args.common;
  if (c.world_size < 1) throw bad("world_size " + std::to_string(c.world_size) + " < 1");
  if (c.rank < 0 || c.rank >= c.world_size)
    throw bad("rank " + std::to_string(c.rank) + " is outside [0, " + std::to_string(c.world_size) +
              ")");
  if (args.num_params > 0 && !args.params)
    throw bad("params is null, num_params " + std::to_string(args.num_params));
  if (args.num_groups > 0 && !args.groups)
    throw bad("groups is null, num_groups " + std::to_string(args.num_groups));
  if (args.num_buckets > 0 && !args.buckets)
    throw bad("buckets is null, num_buckets " + std::to_string(args.num_buckets));
  for (size_t i = 0; i < args.num_params; ++i) {
    const dopt_param& p = args.params[i];
    if (!p.requires_grad || !p.grad) continue;  // frozen: no group is read
    if (p.group < 0 || static_cast<size_t>(p.group) >= args.num_groups)
      throw bad(std::string("parameter ") + (p.name ? p.name : "?") + " has group " +
                std::to_string(p.group) + " of " + std::to_string(args.num_groups));
  }
  if ((needs & kNeedsReducer) && (!args.reducer.vt || !args.reducer.reducer))
    throw bad("needs a reducer (dopt_algorithm_args.reducer is not set)");
  const bool comm_set = args.comm.vt && args.comm.comm;
  if ((needs & kNeedsComm) && !comm_set)
    throw bad("needs a communicator (dopt_algorithm_args.comm is not set)");
  if ((needs & kNeedsCommWhenDistributed) && c.world_size > 1 && !comm_set)
    throw bad("needs a communicator at world_size " + std::to_string(c.world_size) +
              " (dopt_algorithm_args.comm is not set)");
  return c;
}

}  // namespace distopt::sdk
