// ABI glue of the `compress` plugin: five lossy reducers in one library.
#include "fp16_reducer.hpp"
#include "randomk_reducer.hpp"
#include "signsgd_reducer.hpp"
#include "topk_reducer.hpp"

namespace {

namespace c = distopt::plugins::compress;
namespace sdk = distopt::sdk;

// Which implementation runs (compress_common.hpp): every reducer has it.
constexpr sdk::OptionDecl kKernels =
    sdk::option_string("kernels", "auto",
                       "auto: CPU kernels for host buckets (bf16: libtorch, faster there), "
                       "libtorch ops on the bucket's device for any other (CUDA); cpu: CPU "
                       "kernels only (device buckets refused); generic: libtorch ops on any "
                       "device (same results)")
        .choices("auto|cpu|generic");

constexpr dopt_option_spec kHalfOptions[] = {kKernels};

// DGC momentum correction: a velocity decay factor, [0, 1).
constexpr sdk::OptionDecl kMomentum =
    sdk::option_double("momentum", "0",
                       "DGC momentum correction (Lin et al. 2018): accumulate a local velocity "
                       "u = momentum u + g instead of the gradient; the optimizer must then run "
                       "without momentum (optimizer.momentum: 0)")
        .range_open_max(0, 1);

constexpr dopt_option_spec kSignOptions[] = {
    sdk::option_bool("error_feedback", "false",
                     "EF-SignSGD (Karimireddy et al. 2019): keep e = p - mean|p| sign(p) per "
                     "parameter, add it next step"),
    kMomentum,
    kKernels,
};

// The sparsifiers' common options (topk, randomk).
constexpr sdk::OptionDecl kRatio =
    sdk::option_double("ratio", "0.01",
                       "fraction of each tensor's elements sent per step: k = min(numel, "
                       "max(min_k, ceil(ratio x numel)))")
        .range_open_min(0, 1);
constexpr sdk::OptionDecl kMinK =
    sdk::option_int("min_k", "256",
                    "at least this many elements of each tensor are sent per step (all of a "
                    "smaller one), so biases and small layers are not starved")
        .range(1, 4.0e9);
constexpr sdk::OptionDecl kErrorFeedback = sdk::option_bool(
    "error_feedback", "true",
    "keep what was not sent (per parameter element) and add it to the next step's gradient");
constexpr sdk::OptionDecl kMomentumMasking =
    sdk::option_bool("momentum_masking", "true",
                     "DGC momentum factor masking: zero the velocity of the elements sent");

constexpr dopt_option_spec kTopkOptions[] = {kRatio,           kMinK,   kErrorFeedback, kMomentum,
                                             kMomentumMasking, kKernels};
constexpr dopt_option_spec kRandomkOptions[] = {
    kRatio,
    kMinK,
    kErrorFeedback,
    kMomentum,
    kMomentumMasking,
    sdk::option_int("seed", "0",
                    "seed of the index draws (same on every rank: all ranks pick the same indices)")
        .range(0, 9.0e15),
    kKernels,
};

}  // namespace

DOPT_PLUGIN(
    "compress", "1.0.0",
    DOPT_COMPONENT(c::Fp16Reducer, "fp16", "1.0.0",
                   "cast each bucket to IEEE half, allreduce, cast back (DDP fp16_compress_hook)",
                   kHalfOptions),
    DOPT_COMPONENT(c::Bf16Reducer, "bf16", "1.0.0",
                   "cast each bucket to bfloat16, allreduce, cast back (DDP bf16_compress_hook)",
                   kHalfOptions),
    DOPT_COMPONENT(
        c::SignSgdReducer, "signsgd", "1.0.0",
        "1-bit signs + per-tensor mean |g|, majority vote over ranks (Bernstein et al. 2018/19)",
        kSignOptions),
    DOPT_COMPONENT(
        c::TopkReducer, "topk", "1.0.0",
        "top-k |g| per tensor, allgather (index, value), average; error feedback (mlbench)",
        kTopkOptions),
    DOPT_COMPONENT(
        c::RandomkReducer, "randomk", "1.0.0",
        "k shared random indices per tensor, allreduce the values; error feedback (mlbench)",
        kRandomkOptions))
