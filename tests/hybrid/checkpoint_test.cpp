// `hybrid` checkpoints and model-only weight loads, on real ranks (Adam):
// - saved at offload_fraction 0.3 on 2 ranks after 5 of 10 steps, it
//   resumes bitwise on 2 ranks; loads at fraction 0.7, on 1 and 4 ranks, and
//   into `allreduce` and `fused` (and checkpoints of those load into
//   hybrid), each continuing to 1e-6 of one libtorch process on the averaged
//   gradient (steps 0-4 over 2 ranks' batches, 5-9 over the new world's);
// - shard: true at fraction 0.5, saved on 2 ranks: resumes bitwise, loads on
//   3 ranks, unsharded, into `zero` and `allreduce`, and their checkpoints
//   load into it (on 2 and 3 ranks), all to 1e-6 of libtorch;
// - Megatron-LM PR 5071 / Megatron-Bridge issue 4082: model weights loaded
//   alone after 3 steps through the embedding API (copy_ into the
//   parameters; torch::load of a torch::save'd model, which re-points them;
//   set_data with new tensors): the next step starts from the loaded weights
//   (equal to plain libtorch copying the same values into its model, its
//   optimizer state kept), also sharded, and with refresh_masters: false it
//   does not (the bug, reproduced).
#include <ATen/core/grad_mode.h>
#include <torch/serialize.h>

#include <string>
#include <vector>

#include "hybrid_helpers.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kSteps = 10, kSaveAt = 5;

struct Phase {
  int world = 2;
  std::string algorithm;
  std::string load;       // checkpoint to load before `from` ("" = none)
  int from = 0;           // first step
  std::string save;       // checkpoint to save after step save_at - 1 ("" = none)
  int save_at = kSaveAt;  //
  int to = kSteps;
};

std::string hybrid(double fraction) {
  return "{name: hybrid, options: {offload_fraction: " + std::to_string(fraction) + "}}";
}

// Runs the phase; returns rank 0's parameters after step to - 1 (all ranks equal: checked).
std::vector<double> run(const Phase& ph, const std::string& dir) {
  const std::string job = hybrid_job(ph.world, random_port(), ph.algorithm, "adam");
  auto codes = fork_ranks(
      ph.world,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(42);
        Mlp3 net;
        auto rt = rank_runtime(job, rank, ph.world, "hybrid.yaml");
        auto opt = make_hybrid_optimizer(rt, net);
        if (!ph.load.empty()) rt.load_checkpoint(ph.load, *net, opt);
        int s = ph.from;
        if (!ph.save.empty()) {
          train_steps(net, opt, rank, s, ph.save_at);
          rt.save_checkpoint(ph.save, *net, opt);
          s = ph.save_at;
        }
        train_steps(net, opt, rank, s, ph.to);
        write_doubles(rank_file(dir, "out", rank), flat_params(net));
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(120));
  for (int r = 0; r < ph.world; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
  }
  const auto p0 = read_doubles(rank_file(dir, "out", 0));
  for (int r = 1; r < ph.world; ++r)
    CHECK(max_abs_diff(read_doubles(rank_file(dir, "out", r)), p0) == 0);
  return p0;
}

// libtorch in one process: steps [0, kSaveAt) over 2 ranks, the rest over `world`.
std::vector<double> reference(const std::string& dir, int world) {
  std::vector<int> worlds(kSteps, world);
  for (int s = 0; s < kSaveAt; ++s) worlds[s] = 2;
  auto codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    write_doubles(dir + "/ref.bin", reference_run("adam", worlds));
    return 0;
  });
  REQUIRE(codes[0] == 0);
  return read_doubles(dir + "/ref.bin");
}

}  // namespace

TEST_CASE("a hybrid checkpoint resumes bitwise and reshards across fractions, worlds, algorithms") {
  const std::string dir = make_temp_dir("distopt_hybrid_ckpt");
  const std::string ckpt = dir + "/hybrid03";
  Phase straight;
  straight.algorithm = hybrid(0.3);
  straight.save = ckpt;
  const auto uninterrupted = run(straight, dir);
  CHECK(max_abs_diff(uninterrupted, reference(dir, 2)) <= 1e-6);

  Phase resume;
  resume.algorithm = hybrid(0.3);
  resume.load = ckpt;
  resume.from = kSaveAt;
  CHECK(max_abs_diff(run(resume, dir), uninterrupted) == 0);

  for (const char* algorithm :
       {"{name: hybrid, options: {offload_fraction: 0.7}}", "{name: allreduce}", "{name: fused}"}) {
    CAPTURE(algorithm);
    Phase p = resume;
    p.algorithm = algorithm;
    CHECK(max_abs_diff(run(p, dir), uninterrupted) <= 1e-6);
  }
  for (int world : {1, 4}) {
    CAPTURE(world);
    Phase p = resume;
    p.world = world;
    CHECK(max_abs_diff(run(p, dir), reference(dir, world)) <= 1e-6);
  }
  // The reverse: allreduce's and fused's checkpoints continue in hybrid.
  for (const char* saved_with : {"{name: allreduce}", "{name: fused}"}) {
    CAPTURE(saved_with);
    Phase save;
    save.algorithm = saved_with;
    save.save = dir + "/other";
    save.to = kSaveAt;
    distopt::test::remove_tree(save.save);
    run(save, dir);
    for (double fraction : {0.3, 1.0}) {
      CAPTURE(fraction);
      Phase p = resume;
      p.algorithm = hybrid(fraction);
      p.load = save.save;
      CHECK(max_abs_diff(run(p, dir), uninterrupted) <= 1e-6);
    }
  }
  distopt::test::remove_tree(dir);
}

TEST_CASE("a sharded hybrid checkpoint loads into 3 ranks, zero, allreduce, and back") {
  const std::string dir = make_temp_dir("distopt_hybrid_shard_ckpt");
  const std::string sharded = "{name: hybrid, options: {shard: true, offload_fraction: 0.5}}";
  Phase straight;
  straight.algorithm = sharded;
  straight.save = dir + "/sharded";
  const auto uninterrupted = run(straight, dir);
  CHECK(max_abs_diff(uninterrupted, reference(dir, 2)) <= 1e-6);
  const auto ref3 = reference(dir, 3);

  Phase resume;
  resume.algorithm = sharded;
  resume.load = straight.save;
  resume.from = kSaveAt;
  CHECK(max_abs_diff(run(resume, dir), uninterrupted) == 0);
  for (std::string algorithm :
       {"{name: hybrid, options: {offload_fraction: 0.5}}", "{name: zero}", "{name: allreduce}"}) {
    CAPTURE(algorithm);
    Phase p = resume;
    p.algorithm = algorithm;
    CHECK(max_abs_diff(run(p, dir), uninterrupted) <= 1e-6);
  }
  for (std::string algorithm :
       {sharded, std::string("{name: zero, options: {partition: contiguous}}"),
        std::string("{name: allreduce}")}) {
    CAPTURE(algorithm);
    Phase p = resume;
    p.world = 3;
    p.algorithm = algorithm;
    CHECK(max_abs_diff(run(p, dir), ref3) <= 1e-6);
  }
  // The reverse: zero's (sharded itself) and allreduce's checkpoints continue
  // in sharded hybrid, on 2 and 3 ranks.
  for (std::string saved_with : {"{name: zero}", "{name: allreduce}"}) {
    CAPTURE(saved_with);
    Phase save;
    save.algorithm = saved_with;
    save.save = dir + "/other";
    save.to = kSaveAt;
    distopt::test::remove_tree(save.save);
    run(save, dir);
    for (int world : {2, 3}) {
      CAPTURE(world);
      Phase p = resume;
      p.world = world;
      p.load = save.save;
      CHECK(max_abs_diff(run(p, dir), world == 2 ? uninterrupted : ref3) <= 1e-6);
    }
  }
  distopt::test::remove_tree(dir);
}

namespace {

constexpr int kLoadAt = 3, kLoadSteps = 5;

// How the model weights are loaded alone before step kLoadAt.
enum class Load {
  copy_in,     // copy_ of an Mlp3 made from seed 7 into the parameters (same memory)
  torch_load,  // torch::load of the initial weights (saved before step 0) into the module:
               // set_ on each parameter, which moves it (the host re-points it)
  set_data,    // param.set_data(a new tensor holding the initial weights)
};

const char* load_name(Load l) {
  return l == Load::copy_in ? "copy_" : l == Load::torch_load ? "torch::load" : "set_data";
}

// The weights `how` loads ("by value" = always copy_ them into net's memory,
// what the libtorch reference does).
void load_weights(Mlp3& net, Load how, const std::string& file, bool by_value) {
  if (how == Load::torch_load && !by_value) {
    torch::load(net, file);
    return;
  }
  Mlp3 other{nullptr};
  if (how == Load::copy_in) {
    distopt::test::seed_cpu(7);
    other = Mlp3();
  } else {
    other = Mlp3();
    torch::load(other, file);
  }
  at::NoGradGuard ng;
  auto dst = net->parameters(), src = other->parameters();
  for (size_t i = 0; i < dst.size(); ++i) {
    if (how == Load::set_data && !by_value)
      dst[i].set_data(src[i].clone());
    else
      dst[i].copy_(src[i]);
  }
}

std::vector<double> run_with_load(const std::string& algorithm, Load how, const std::string& dir) {
  const std::string job = hybrid_job(2, random_port(), algorithm, "adam");
  auto codes = fork_ranks(2, [&](int rank) {
    torch::set_num_threads(1);
    distopt::test::seed_cpu(42);
    Mlp3 net;
    const std::string file = rank_file(dir, "initial", rank);
    torch::save(net, file);
    auto rt = rank_runtime(job, rank, 2, "hybrid.yaml");
    auto opt = make_hybrid_optimizer(rt, net);
    train_steps(net, opt, rank, 0, kLoadAt);
    const void* before = net->fc1->weight.data_ptr();
    load_weights(net, how, file, false);
    // torch::load and set_data move the parameters (the host re-points them).
    if ((how != Load::copy_in) != (net->fc1->weight.data_ptr() != before)) return 3;
    train_steps(net, opt, rank, kLoadAt, kLoadSteps);
    write_doubles(rank_file(dir, "out", rank), flat_params(net));
    rt.barrier();
    return 0;
  });
  REQUIRE(codes[0] == 0);
  REQUIRE(codes[1] == 0);
  return read_doubles(rank_file(dir, "out", 0));
}

}  // namespace

TEST_CASE("model weights loaded alone: the next hybrid step starts from them (Megatron PR 5071)") {
  const std::string dir = make_temp_dir("distopt_hybrid_load");
  for (Load how : {Load::copy_in, Load::torch_load, Load::set_data}) {
    const std::string mode = load_name(how);
    CAPTURE(mode);
    // Plain libtorch (Adam, 2 ranks' averaged gradient): loads by value
    // before step kLoadAt, its optimizer state kept; the same run loading
    // the way `how` does (torch::load, set_data) gives the same result.
    auto codes = fork_ranks(1, [&](int) {
      torch::set_num_threads(1);
      distopt::test::seed_cpu(42);
      Mlp3 initial;
      const std::string file = dir + "/ref_initial.pt";
      torch::save(initial, file);
      for (bool by_value : {true, false})
        write_doubles(dir + (by_value ? "/ref.bin" : "/ref_as_host.bin"),
                      reference_run("adam", std::vector<int>(kLoadSteps, 2), [&](int s, Mlp3& net) {
                        if (s == kLoadAt) load_weights(net, how, file, by_value);
                      }));
      write_doubles(dir + "/noload.bin", reference_run("adam", std::vector<int>(kLoadSteps, 2)));
      return 0;
    });
    REQUIRE(codes[0] == 0);
    const auto ref = read_doubles(dir + "/ref.bin");
    CHECK(max_abs_diff(ref, read_doubles(dir + "/ref_as_host.bin")) == 0);
    CHECK(max_abs_diff(ref, read_doubles(dir + "/noload.bin")) > 1e-2);  // the load matters
    for (const char* options :
         {"offload_fraction: 0.5", "offload_fraction: 0.5, shard: true", "offload_fraction: 1",
          "offload_fraction: 1, overlap_cpu_optimizer_d2h_h2d: false"}) {
      const std::string opts = options;
      CAPTURE(opts);
      CHECK(max_abs_diff(run_with_load("{name: hybrid, options: {" + opts + "}}", how, dir), ref) <=
            1e-6);
    }
    // Every other algorithm that updates the whole model replicated follows
    // the loaded weights too (zero owns flat shards; fused re-flattens).
    for (const char* algorithm :
         {"allreduce", "zero", "{name: fused, options: {check_flatten: true}}"}) {
      const std::string alg = algorithm;
      CAPTURE(alg);
      CHECK(max_abs_diff(run_with_load(alg, how, dir), ref) <= 1e-6);
    }
    // Without the refresh, the stale host copies overwrite the loaded model.
    CHECK(max_abs_diff(run_with_load(
                           "{name: hybrid, options: {offload_fraction: 1, refresh_masters: false}}",
                           how, dir),
                       ref) > 1e-2);
  }
  distopt::test::remove_tree(dir);
}
