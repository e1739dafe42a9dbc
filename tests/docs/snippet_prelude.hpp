// What the docs' C++ snippets may take as given (tests/docs/extract_cpp_snippets.sh):
// the headers a libtorch program embedding distopt includes, and for
// `// snippet: fragment` blocks the names the docs use, as the parameters of
// the function each fragment becomes. Compiled, never run.
#pragma once

#include <torch/torch.h>

#include <distopt/distributed_optimizer.hpp>
#include <distopt/elastic.hpp>
#include <distopt/lr_schedule.hpp>
#include <distopt/runtime.hpp>
#include <functional>
#include <memory>
#include <vector>

namespace snippet_env {
/// One batch of a data loader: images [B, C, H, W] and class indices [B].
struct Batch {
  torch::Tensor data, target;
};
/// Any model with forward(images) -> log-probabilities.
struct Net : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x) { return torch::log_softmax(x.flatten(1), 1); }
};
using Loss = std::function<torch::Tensor(const Batch&)>;
}  // namespace snippet_env

// rt, opt, model, loader / my_shard (batches), loss(batch) / loss_of(batch),
// micro_batch_1 / micro_batch_2.
#define DOPT_SNIPPET_PARAMS                                                                   \
  [[maybe_unused]] distopt::Runtime &rt, [[maybe_unused]] distopt::DistributedOptimizer &opt, \
      [[maybe_unused]] std::shared_ptr<snippet_env::Net> model,                               \
      [[maybe_unused]] std::vector<snippet_env::Batch>&loader,                                \
      [[maybe_unused]] std::vector<snippet_env::Batch>&my_shard,                              \
      [[maybe_unused]] const snippet_env::Loss &loss,                                         \
      [[maybe_unused]] const snippet_env::Loss &loss_of,                                      \
      [[maybe_unused]] const snippet_env::Batch &micro_batch_1,                               \
      [[maybe_unused]] const snippet_env::Batch &micro_batch_2
