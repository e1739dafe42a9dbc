// sdk::check_algorithm_args (sdk/optim/algorithm_args.hpp): the argument
// checks every in-tree algorithm's constructor starts with.
#include "distopt/sdk/optim/algorithm_args.hpp"

#include <doctest/doctest.h>

#include <string>

namespace {

using namespace distopt;

// The message and status check_algorithm_args throws for `args` ("" when it
// accepts them).
std::string refusal(const dopt_algorithm_args& args,
                    sdk::AlgorithmNeeds needs = sdk::kNeedsNothing) {
  try {
    sdk::check_algorithm_args(args, "algo", needs);
    return "";
  } catch (const sdk::Error& e) {
    CHECK(e.status() == DOPT_ERR_INVALID_ARGUMENT);
    return e.what();
  }
}

// Valid arguments of one rank out of two: two groups, one trainable
// parameter in group 1 and a frozen one with no group, one bucket, no comm
// or reducer.
struct Args {
  dopt_create_args common{};
  DLTensor tensor{};
  dopt_param params[2]{};
  dopt_param_group groups[2]{};
  dopt_bucket bucket{};
  dopt_algorithm_args args{};
  Args() {
    common.rank = 1;
    common.world_size = 2;
    params[0].name = "w";
    params[0].data = params[0].grad = &tensor;
    params[0].group = 1;
    params[0].requires_grad = 1;
    params[1].name = "frozen";
    params[1].data = &tensor;
    params[1].group = -1;  // never read: frozen
    args.common = &common;
    args.params = params;
    args.num_params = 2;
    args.groups = groups;
    args.num_groups = 2;
    args.buckets = &bucket;
    args.num_buckets = 1;
  }
};

// Non-null stand-ins: the check reads no vtable entry.
dopt_comm_ref some_comm() {
  static int vt, comm;
  return {reinterpret_cast<const dopt_communicator_v1*>(&vt), reinterpret_cast<dopt_comm*>(&comm)};
}
dopt_reducer_ref some_reducer() {
  static int vt, red;
  return {reinterpret_cast<const dopt_reducer_v1*>(&vt), reinterpret_cast<dopt_reducer*>(&red)};
}

}  // namespace

TEST_CASE("check_algorithm_args: valid arguments give back the common args") {
  Args a;
  CHECK(&sdk::check_algorithm_args(a.args, "algo") == &a.common);
  a.args.comm = some_comm();
  a.args.reducer = some_reducer();
  CHECK(refusal(a.args, sdk::kNeedsComm | sdk::kNeedsReducer) == "");
  a.args.num_params = a.args.num_groups = a.args.num_buckets = 0;  // empty arrays may be null
  a.args.params = nullptr;
  a.args.groups = nullptr;
  a.args.buckets = nullptr;
  CHECK(refusal(a.args) == "");
}

TEST_CASE("check_algorithm_args: common args, world size and rank") {
  Args a;
  a.args.common = nullptr;
  CHECK(refusal(a.args) == "algo: dopt_algorithm_args.common is null");
  a.args.common = &a.common;
  a.common.world_size = 0;
  a.common.rank = 0;
  CHECK(refusal(a.args) == "algo: world_size 0 < 1");
  a.common.world_size = 2;
  a.common.rank = 2;
  CHECK(refusal(a.args) == "algo: rank 2 is outside [0, 2)");
  a.common.rank = -1;
  CHECK(refusal(a.args) == "algo: rank -1 is outside [0, 2)");
}

TEST_CASE("check_algorithm_args: arrays their counts promise, and group indices") {
  Args a;
  a.args.params = nullptr;
  CHECK(refusal(a.args) == "algo: params is null, num_params 2");
  a.args.params = a.params;
  a.args.groups = nullptr;
  CHECK(refusal(a.args) == "algo: groups is null, num_groups 2");
  a.args.groups = a.groups;
  a.args.buckets = nullptr;
  CHECK(refusal(a.args) == "algo: buckets is null, num_buckets 1");
  a.args.buckets = &a.bucket;
  a.params[0].group = 2;
  CHECK(refusal(a.args) == "algo: parameter w has group 2 of 2");
  a.params[0].group = -1;
  CHECK(refusal(a.args) == "algo: parameter w has group -1 of 2");
}

TEST_CASE("check_algorithm_args: the communicator and reducer an algorithm needs") {
  Args a;
  CHECK(refusal(a.args, sdk::kNeedsReducer) ==
        "algo: needs a reducer (dopt_algorithm_args.reducer is not set)");
  CHECK(refusal(a.args, sdk::kNeedsComm) ==
        "algo: needs a communicator (dopt_algorithm_args.comm is not set)");
  CHECK(refusal(a.args, sdk::kNeedsCommWhenDistributed) ==
        "algo: needs a communicator at world_size 2 (dopt_algorithm_args.comm is not set)");
  a.args.comm = {some_comm().vt, nullptr};  // a vtable without an instance is not a communicator
  CHECK(refusal(a.args, sdk::kNeedsComm) != "");
  a.args.reducer = {nullptr, some_reducer().reducer};
  CHECK(refusal(a.args, sdk::kNeedsReducer) != "");
  // One rank talks to nobody: no communicator needed.
  a.common.world_size = 1;
  a.common.rank = 0;
  CHECK(refusal(a.args, sdk::kNeedsCommWhenDistributed) == "");
  CHECK(refusal(a.args, sdk::kNeedsComm) != "");
}
