// Every logical tensor of saved state whole in one place (Runtime::
// consolidate, consolidate_checkpoint).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>

#include "state/state_source.hpp"

namespace distopt::checkpoint {

/// Key -> whole tensor (CPU, the saved dtype) for every key of `src`:
/// sharded entries joined, rank-local ones once per saved rank as
/// "KEY@rank<r>". Throws CheckpointError for a piece `src` lacks.
std::map<std::string, at::Tensor> assemble(const state::StateSource& src);

}  // namespace distopt::checkpoint
