// ABI glue of the `compress` plugin: five lossy reducers in one library.
#include "fp16_reducer.hpp"
#include "randomk_reducer.hpp"
#include "signsgd_reducer.hpp"
#include "topk_reducer.hpp"

namespace {

namespace c = distopt::plugins::compress;

#define DOPT_MOMENTUM_OPTION                                                                 \
  {                                                                                          \
    DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "momentum", DOPT_OPTION_DOUBLE, "0", 0, 0.999999, \
        nullptr,                                                                             \
        "DGC momentum correction (Lin et al. 2018): accumulate a local velocity "            \
        "u = momentum u + g instead of the gradient; the optimizer must then run without "   \
        "momentum "                                                                          \
        "(optimizer.momentum: 0)"                                                            \
  }

constexpr dopt_option_spec kSignOptions[] = {
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "error_feedback", DOPT_OPTION_BOOL, "false", 0, -1,
     nullptr,
     "EF-SignSGD (Karimireddy et al. 2019): keep e = p - mean|p| sign(p) per parameter, add it "
     "next step"},
    DOPT_MOMENTUM_OPTION,
};

#define DOPT_SPARSE_OPTIONS                                                                       \
  {DOPT_OPTION_SPEC_STRUCT_SIZE,                                                                  \
   nullptr,                                                                                       \
   "ratio",                                                                                       \
   DOPT_OPTION_DOUBLE,                                                                            \
   "0.01",                                                                                        \
   0,                                                                                             \
   1,                                                                                             \
   nullptr,                                                                                       \
   "fraction of each tensor's elements sent per step, in (0, 1]: k = min(numel, max(min_k, "      \
   "ceil(ratio x numel)))"},                                                                      \
      {DOPT_OPTION_SPEC_STRUCT_SIZE,                                                              \
       nullptr,                                                                                   \
       "min_k",                                                                                   \
       DOPT_OPTION_INT,                                                                           \
       "256",                                                                                     \
       1,                                                                                         \
       4.0e9,                                                                                     \
       nullptr,                                                                                   \
       "at least this many elements of each tensor are sent per step (all of a smaller one), so " \
       "biases and small layers are not starved"},                                                \
      {DOPT_OPTION_SPEC_STRUCT_SIZE,                                                              \
       nullptr,                                                                                   \
       "error_feedback",                                                                          \
       DOPT_OPTION_BOOL,                                                                          \
       "true",                                                                                    \
       0,                                                                                         \
       -1,                                                                                        \
       nullptr,                                                                                   \
       "keep what was not sent (per parameter element) and add it to the next step's gradient"},  \
      DOPT_MOMENTUM_OPTION, {                                                                     \
    DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "momentum_masking", DOPT_OPTION_BOOL, "true", 0, -1,   \
        nullptr, "DGC momentum factor masking: zero the velocity of the elements sent"            \
  }

constexpr dopt_option_spec kTopkOptions[] = {DOPT_SPARSE_OPTIONS};
constexpr dopt_option_spec kRandomkOptions[] = {
    DOPT_SPARSE_OPTIONS,
    {DOPT_OPTION_SPEC_STRUCT_SIZE, nullptr, "seed", DOPT_OPTION_INT, "0", 0, 9.0e15, nullptr,
     "seed of the index draws (same on every rank: all ranks pick the same indices)"},
};

}  // namespace

DOPT_PLUGIN(
    "compress", "1.0.0",
    DOPT_COMPONENT(c::Fp16Reducer, "fp16", "1.0.0",
                   "cast each bucket to IEEE half, allreduce, cast back (DDP fp16_compress_hook)",
                   nullptr),
    DOPT_COMPONENT(c::Bf16Reducer, "bf16", "1.0.0",
                   "cast each bucket to bfloat16, allreduce, cast back (DDP bf16_compress_hook)",
                   nullptr),
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
