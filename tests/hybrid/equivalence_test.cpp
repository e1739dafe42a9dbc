// `hybrid` against one process running the plain libtorch optimizer on the
// averaged gradient: offload_fraction 0, 0.3, 0.5, 1 x overlap on / off,
// SGD (momentum) and Adam, 1, 2 and 4 real ranks on loopback, 10 steps with
// two parameter groups and a set_lr halfway. Equal to 1e-6; overlap on and
// off bitwise equal; every rank equal. Forked children do the torch work.
#include <string>
#include <vector>

#include "hybrid_helpers.hpp"
#include "result_files.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kSteps = 10;
const double kFractions[] = {0, 0.3, 0.5, 1};

std::string config(double fraction, bool overlap) {
  std::ostringstream a;
  a << "{name: hybrid, options: {offload_fraction: " << fraction
    << ", overlap_cpu_optimizer_d2h_h2d: " << (overlap ? "true" : "false") << "}}";
  return a.str();
}

void check_world(const std::string& optimizer, int world) {
  CAPTURE(optimizer);
  CAPTURE(world);
  const std::string dir = make_temp_dir("distopt_hybrid_eq");
  auto ref = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    write_doubles(dir + "/init.bin", reference_run(optimizer, {}));
    write_doubles(dir + "/ref.bin", reference_run(optimizer, std::vector<int>(kSteps, world)));
    return 0;
  });
  REQUIRE(ref[0] == 0);
  std::vector<std::string> jobs;
  for (double f : kFractions)
    for (bool overlap : {true, false})
      jobs.push_back(hybrid_job(world, random_port(), config(f, overlap), optimizer));
  const auto outcomes = run_jobs(jobs, world, kSteps, dir);
  const auto reference = read_doubles(dir + "/ref.bin");
  CHECK(max_abs_diff(reference, read_doubles(dir + "/init.bin")) > 1e-3);  // training moved it
  for (size_t j = 0; j < jobs.size(); ++j) {
    const double fraction = kFractions[j / 2];
    const bool overlap = j % 2 == 0;
    CAPTURE(fraction);
    CAPTURE(overlap);
    check_ranks_equal_reference(outcomes[j].params, reference);
    if (!overlap)  // the same work in the same order: bitwise the overlapped result
      CHECK(max_abs_diff(outcomes[j - 1].params[0], outcomes[j].params[0]) == 0);
  }
  distopt::test::remove_tree(dir);
}

}  // namespace

TEST_CASE("hybrid SGD(momentum) equals libtorch on the averaged gradient, 1, 2 and 4 ranks") {
  for (int world : {1, 2, 4}) check_world("sgd", world);
}

TEST_CASE("hybrid Adam equals libtorch on the averaged gradient, 1, 2 and 4 ranks") {
  for (int world : {1, 2, 4}) check_world("adam", world);
}
