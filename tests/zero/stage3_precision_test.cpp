// zero stage 3 under mixed precision (bf16 model, fp32 master shards;
// algorithm.h ABI 1.8) across real processes on loopback (tcp + mean +
// zero): the masters follow mixed precision done by hand in one process
// (FSDP's MixedPrecision with fp32 reduction and ShardedGradScaler), an
// inf on one rank discards the step on every rank, a switch to allreduce and
// back keeps the masters, and checkpoints carry the fp32 masters into
// another world size and algorithm. Pattern of stage3_test.cpp: forked
// children do all torch work and write results to files. A sharding
// algorithm without discard_step (ABI 1.7) is refused under mixed precision.
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "distopt/distributed_optimizer.hpp"
#include "distopt/error.hpp"
#include "distopt/runtime.hpp"
#include "distopt/sharded_unit.hpp"
#include "multiproc.hpp"
#include "optim/snapshot.hpp"  // what a checkpoint or an elastic commit holds (core/src)
#include "rank_runtime.hpp"
#include "result_files.hpp"
#include "seed.hpp"
#include "test_net.hpp"
#include "torch_doctest.hpp"

namespace {

using namespace distopt::test;  // tests/common helpers

constexpr int kIn = 20, kClasses = 10;
constexpr int64_t kGlobal = 24;  // global batch: 2, 3 and 1 ranks split it evenly
constexpr uint64_t kInitSeed = 42, kDataSeed = 1234;
constexpr double kInitScale = 1024;

// Three units of uneven sizes and a parameter in no unit (whole on every
// rank, its master kept by the host).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", distopt::ShardedUnit(torch::nn::Linear(kIn, 32)));
    fc2 = register_module("fc2", distopt::ShardedUnit(torch::nn::Linear(32, 24)));
    head = register_module("head", distopt::ShardedUnit(torch::nn::Linear(24, kClasses)));
    scale = register_parameter("scale", at::ones({kClasses}));
  }
  at::Tensor forward(const at::Tensor& x) { return head(at::relu(fc2(at::relu(fc1(x))))) * scale; }
  distopt::ShardedUnit fc1{nullptr}, fc2{nullptr}, head{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(Net);

std::pair<at::Tensor, at::Tensor> data(int steps) {
  distopt::test::seed_cpu(kDataSeed);
  return {at::randn({kGlobal * steps, kIn}), at::randint(0, kClasses, {kGlobal * steps})};
}

at::Tensor loss_of(Net& net, const at::Tensor& x, const at::Tensor& y) {
  return at::nll_loss(
      at::log_softmax(net->forward(x.to(net->scale.scalar_type())).to(at::kFloat), 1), y);
}

std::string job_yaml(int world, const std::string& algorithm) {
  std::ostringstream y;
  y << plugins_and_world_yaml(world, random_port()) << "communicator: {name: tcp}\n"
    << "reducer: {name: mean}\nalgorithm: " << algorithm << "\n"
    << "optimizer: {name: adam, lr: 0.01}\n"
    << "precision: {dtype: bf16, init_scale: " << kInitScale << ", growth_interval: 100}\n";
  return y.str();
}
const std::string kStage3 = "{name: zero, options: {stage: 3}}";

// Mixed precision by hand in one process for `world` ranks: each rank's
// bf16 gradients of its loss x scale, upcast and divided by the scale,
// averaged in fp32; Adam on fp32 masters that start as the bf16 weights;
// the model is the masters rounded to bf16 after each step. Step `skip`
// has no update, and the scale halves after it. With `micro` > 1 each
// rank's batch is that many micro-batches (loss / micro each) whose bf16
// gradients accumulate before the upcast. Returns the masters.
std::vector<double> reference(int world, int steps, int skip, int micro = 1) {
  const std::string dir = make_temp_dir("distopt_zero3_bf16_ref");
  auto codes = fork_ranks(1, [&](int) {
    torch::set_num_threads(1);
    auto [xs, ys] = data(steps);
    distopt::test::seed_cpu(kInitSeed);
    Net model;
    model->to(at::kBFloat16);
    Net masters;
    auto mp = masters->parameters(), lp = model->parameters();
    {
      at::NoGradGuard ng;
      for (size_t i = 0; i < mp.size(); ++i) mp[i].copy_(lp[i]);
    }
    torch::optim::Adam adam(mp, torch::optim::AdamOptions(0.01));
    const int64_t batch = kGlobal / world;
    for (int step = 0; step < steps; ++step) {
      const double scale = skip >= 0 && step > skip ? kInitScale / 2 : kInitScale;
      std::vector<at::Tensor> sum(mp.size());
      for (int rank = 0; rank < world; ++rank) {
        for (auto& p : lp) p.mutable_grad() = at::Tensor();
        const int64_t part = batch / micro;
        for (int k = 0; k < micro; ++k) {
          const int64_t o = step * kGlobal + rank * batch + k * part;
          (loss_of(model, xs.narrow(0, o, part), ys.narrow(0, o, part)) / micro * scale).backward();
        }
        for (size_t i = 0; i < lp.size(); ++i) {
          at::Tensor g = lp[i].grad().to(at::kFloat) / scale;
          sum[i] = rank == 0 ? g : sum[i] + g;
        }
      }
      if (step == skip) continue;
      for (size_t i = 0; i < mp.size(); ++i) mp[i].mutable_grad() = sum[i] / world;
      adam.step();
      at::NoGradGuard ng;
      for (size_t i = 0; i < mp.size(); ++i) lp[i].copy_(mp[i]);
    }
    write_doubles(dir + "/ref.bin", flat_params(masters));
    return 0;
  });
  REQUIRE(codes[0] == 0);
  auto out = read_doubles(dir + "/ref.bin");
  distopt::test::remove_tree(dir);
  return out;
}

// The consolidated masters and model of `net` (rank 0), in parameter order.
std::pair<std::vector<double>, std::vector<double>> consolidated(distopt::Runtime& rt, Net& net,
                                                                 distopt::DistributedOptimizer& opt,
                                                                 int rank) {
  auto all = rt.consolidate(*net, opt, 0);
  std::vector<double> masters, model;
  if (rank != 0) return {masters, model};
  for (const auto& np : net->named_parameters()) {
    const std::vector<std::pair<std::string, std::vector<double>*>> kinds{{"master/", &masters},
                                                                          {"model/", &model}};
    for (const auto& [prefix, out] : kinds) {
      auto it = all.find(prefix + np.key());
      if (it == all.end()) continue;  // no masters without mixed precision
      at::Tensor t = it->second.to(at::kDouble).contiguous().view(-1);
      out->insert(out->end(), t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
    }
  }
  return {masters, model};
}

// max |model - bf16(masters)|.
double model_vs_masters(const std::vector<double>& model, const std::vector<double>& masters) {
  if (model.size() != masters.size()) return 1e9;
  at::Tensor m = at::tensor(masters, at::kDouble).to(at::kFloat).to(at::kBFloat16).to(at::kDouble);
  return (at::tensor(model, at::kDouble) - m).abs().max().item<double>();
}

}  // namespace

TEST_CASE(
    "zero stage 3 in bf16, Adam, 2 ranks: the fp32 master shards follow mixed precision done "
    "by hand; an inf on one rank discards the step on both; a switch to allreduce and back "
    "keeps the masters") {
  constexpr int kWorld = 2, kSteps = 9, kInfStep = 3, kSwitchAt = 5, kBackAt = 7;
  const std::string dir = make_temp_dir("distopt_zero3_bf16");
  const std::vector<double> ref = reference(kWorld, kSteps, kInfStep);
  const std::string job = job_yaml(kWorld, kStage3);
  auto codes = fork_ranks(
      kWorld,
      [&](int rank) {
        torch::set_num_threads(1);
        auto [xs, ys] = data(kSteps);
        distopt::test::seed_cpu(kInitSeed + 7 * rank);  // rank 0's parameters are broadcast
        Net net;
        net->to(at::kBFloat16);
        // The unit's bf16 memory as built: once sharded, nothing but this
        // handle may keep it (a detached alias would hold every unit whole).
        at::Storage built;
        for (const auto& np : net->named_parameters())
          if (np.key() == "fc2.weight") built = np.value().storage();
        auto rt = rank_runtime(job, rank, kWorld, "zero3_bf16.yaml");
        auto opt = rt.make_optimizer(*net);
        const double grads_at_start = static_cast<double>(opt.sharding_memory().unit_grads);
        const double built_holders = static_cast<double>(built.use_count());
        const distopt::ComponentConfig mean{"mean", {}, {}, {}, nullptr};
        // Per step: loss scale after it, skipped steps, how far it moved the
        // model, unit bytes gathered between steps, head.weight's numel.
        std::vector<double> probes;
        std::vector<double> masters_at_switch;
        bool carried = true;
        double peak_unit_grads = 0;  // over the sharded steps
        for (int step = 0; step < kSteps; ++step) {
          if (step == kSwitchAt || step == kBackAt) {
            const auto before = consolidated(rt, net, opt, rank).first;
            if (step == kSwitchAt)
              opt.switch_to({"allreduce", {}, {}, {}, nullptr}, mean);
            else
              opt.switch_to({"zero", YAML::Load("{stage: 3}"), {}, {}, nullptr}, mean);
            carried = carried && consolidated(rt, net, opt, rank).first == before;
          }
          std::vector<double> before;
          {
            auto whole = opt.gather_params();
            before = flat_params(net);
          }
          opt.zero_grad();
          const int64_t o = step * kGlobal + rank * (kGlobal / kWorld);
          auto loss =
              loss_of(net, xs.narrow(0, o, kGlobal / kWorld), ys.narrow(0, o, kGlobal / kWorld));
          if (rank == 1 && step == kInfStep) loss = loss * std::numeric_limits<float>::infinity();
          opt.scale_loss(loss).backward();
          opt.step();
          std::vector<double> after;
          {
            auto whole = opt.gather_params();
            after = flat_params(net);
          }
          probes.push_back(opt.loss_scale());
          probes.push_back(static_cast<double>(opt.skipped_steps()));
          probes.push_back(max_abs_diff(before, after));
          const auto mem = opt.sharding_memory();
          if (step < kSwitchAt ||
              step >= kBackAt + 1)  // the step after a switch back starts sharded
            peak_unit_grads = std::max(peak_unit_grads, static_cast<double>(mem.peak_unit_grads));
          // No unit's full parameters, nor its bf16 or fp32 full gradients.
          probes.push_back(static_cast<double>(mem.gathered + mem.unit_grads));
          probes.push_back(static_cast<double>(net->head->parameters()[0].numel()));
        }
        probes.push_back(carried ? 1 : 0);
        probes.push_back(opt.shards_parameters() ? 1 : 0);
        probes.push_back(grads_at_start);
        probes.push_back(peak_unit_grads);
        probes.push_back(built_holders);
        auto [masters, model] = consolidated(rt, net, opt, rank);
        write_doubles(dir + "/probes" + std::to_string(rank) + ".bin", probes);
        if (rank == 0) {
          write_doubles(dir + "/masters.bin", masters);
          write_doubles(dir + "/model.bin", model);
        }
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(180));
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    const auto p = read_doubles(dir + "/probes" + std::to_string(r) + ".bin");
    REQUIRE(p.size() == 5 * kSteps + 5);
    for (int step = 0; step < kSteps; ++step) {
      CAPTURE(step);
      const double* s = &p[static_cast<size_t>(5 * step)];
      CHECK(s[0] == (step < kInfStep ? kInitScale : kInitScale / 2));
      CHECK(s[1] == (step < kInfStep ? 0 : 1));
      if (step == kInfStep)
        CHECK(s[2] == 0.0);  // discarded on both ranks (rank 0's gradients were finite)
      else
        CHECK(s[2] > 0.0);
      const bool sharded = step < kSwitchAt || step >= kBackAt;
      CHECK(s[3] == 0);  // no unit's full parameters or gradients between steps
      CHECK(s[4] == (sharded ? 0 : 24 * kClasses));
    }
    CHECK(p[5 * kSteps] == 1);      // the switches kept the fp32 masters bit for bit
    CHECK(p[5 * kSteps + 1] == 1);  // sharded again at the end
    CHECK(p[5 * kSteps + 2] == 0);  // nor after make_optimizer
    // During backward one unit's gradients at a time (finish_buckets, ABI
    // 1.9): its bf16 bucket and its fp32 copy, fc2's the largest (32 x 24 +
    // 24 elements: 4752 bytes), each within a pool block's slack.
    CHECK(p[5 * kSteps + 3] > 0);
    CHECK(p[5 * kSteps + 3] <= (32 * 24 + 24) * (2 + 4) + 2 * (2 * 64 + 256));
    CHECK(p[5 * kSteps + 4] == 1);  // fc2's bf16 memory as built is held by the test alone
  }
  const auto masters = read_doubles(dir + "/masters.bin");
  const auto model = read_doubles(dir + "/model.bin");
  REQUIRE(masters.size() == ref.size());
  const double d = max_abs_diff(masters, ref);
  MESSAGE("max |masters - reference| = " << d);
  // The same fp32 operations in the same order; masters refreshed from the
  // bf16 model, or the unscale skipped, are off by bf16's rounding (1e-3).
  CHECK(d <= 1e-6);
  CHECK(model_vs_masters(model, masters) == 0.0);  // the model is bf16(masters)
  CHECK(max_abs_diff(model, masters) > 0.0);       // and the masters keep what bf16 drops
  distopt::test::remove_tree(dir);
}

TEST_CASE(
    "zero stage 3 in bf16, Adam, 3 ranks, 2 micro-batches under no_sync: the masters follow "
    "mixed precision by hand with the bf16 gradients accumulated") {
  constexpr int kWorld = 3, kSteps = 4, kMicro = 2;
  const std::string dir = make_temp_dir("distopt_zero3_bf16_micro");
  const std::vector<double> ref = reference(kWorld, kSteps, -1, kMicro);
  const std::string job = job_yaml(kWorld, kStage3);
  auto codes = fork_ranks(
      kWorld,
      [&](int rank) {
        torch::set_num_threads(1);
        auto [xs, ys] = data(kSteps);
        distopt::test::seed_cpu(kInitSeed);
        Net net;
        net->to(at::kBFloat16);
        auto rt = rank_runtime(job, rank, kWorld, "zero3_bf16_micro.yaml");
        auto opt = rt.make_optimizer(*net);
        const int64_t batch = kGlobal / kWorld, part = batch / kMicro;
        for (int step = 0; step < kSteps; ++step) {
          opt.zero_grad();
          for (int k = 0; k < kMicro; ++k) {
            const int64_t o = step * kGlobal + rank * batch + k * part;
            auto loss = loss_of(net, xs.narrow(0, o, part), ys.narrow(0, o, part)) / kMicro;
            if (k + 1 < kMicro) {
              auto guard = opt.no_sync();
              opt.scale_loss(loss).backward();
            } else {
              opt.scale_loss(loss).backward();
            }
          }
          opt.step();
        }
        auto [masters, model] = consolidated(rt, net, opt, rank);
        if (rank == 0) write_doubles(dir + "/masters.bin", masters);
        write_doubles(dir + "/skipped" + std::to_string(rank) + ".bin",
                      {static_cast<double>(opt.skipped_steps())});
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(180));
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    CHECK(read_doubles(dir + "/skipped" + std::to_string(r) + ".bin") == std::vector<double>{0});
  }
  const auto masters = read_doubles(dir + "/masters.bin");
  REQUIRE(masters.size() == ref.size());
  const double d = max_abs_diff(masters, ref);
  MESSAGE("3 ranks, 2 micro-batches: max |masters - reference| = " << d);
  // 3 ranks: the reduce-scatter may add the ranks' fp32 gradients in
  // another order than the reference (a few fp32 ulps, far below bf16's
  // 4e-3 relative rounding that an accumulation in the wrong place adds).
  CHECK(d <= 2e-5);
  distopt::test::remove_tree(dir);
}

namespace {

// One rank of a checkpoint run (`job`, `world`): optionally load `from`,
// write the consolidated masters and model as loaded, run `steps` steps
// from global step `first`, and with `save` save a checkpoint; writes the
// loss scale and the consolidated masters at the end.
int checkpoint_rank(const std::string& job, int rank, int world, bool bf16, int first, int steps,
                    const std::string& from, const std::string& save, const std::string& out) {
  torch::set_num_threads(1);
  auto [xs, ys] = data(12);
  distopt::test::seed_cpu(kInitSeed);
  Net net;
  if (bf16) net->to(at::kBFloat16);
  auto rt = rank_runtime(job, rank, world, "zero3_bf16_ckpt.yaml");
  auto opt = rt.make_optimizer(*net);
  if (!from.empty()) rt.load_checkpoint(from, *net, opt);
  auto loaded = consolidated(rt, net, opt, rank);
  const int64_t batch = kGlobal / world;
  for (int step = first; step < first + steps; ++step) {
    opt.zero_grad();
    const int64_t o = step * kGlobal + rank * batch;
    opt.scale_loss(loss_of(net, xs.narrow(0, o, batch), ys.narrow(0, o, batch))).backward();
    opt.step();
  }
  if (!save.empty()) rt.save_checkpoint(save, *net, opt);
  auto end = consolidated(rt, net, opt, rank);
  if (rank == 0) {
    write_doubles(out + ".loaded_masters", loaded.first);
    write_doubles(out + ".loaded_model", loaded.second);
    write_doubles(out + ".masters", end.first);
    write_doubles(out + ".model", end.second);
    write_doubles(out + ".scale", {opt.loss_scale(), static_cast<double>(opt.skipped_steps())});
  }
  rt.barrier();
  return 0;
}

}  // namespace

TEST_CASE(
    "zero stage 3 in bf16: a checkpoint at 2 ranks restores its fp32 masters at 3 ranks (stage "
    "3) and 1 rank (allreduce); an fp32 checkpoint gives exact masters") {
  const std::string dir = make_temp_dir("distopt_zero3_bf16_ckpt");
  auto run = [&](int world, const std::string& job, bool bf16, int first, int steps,
                 const std::string& from, const std::string& save, const std::string& out) {
    auto codes = fork_ranks(
        world,
        [&](int rank) {
          return checkpoint_rank(job, rank, world, bf16, first, steps, from, save, dir + "/" + out);
        },
        std::chrono::seconds(180));
    for (int r = 0; r < world; ++r) REQUIRE(codes[r] == 0);
  };
  run(2, job_yaml(2, kStage3), true, 0, 4, "", dir + "/ckpt", "saved");
  const auto saved_masters = read_doubles(dir + "/saved.masters");
  const auto saved_model = read_doubles(dir + "/saved.model");
  REQUIRE(!saved_masters.empty());
  CHECK(max_abs_diff(saved_masters, saved_model) > 0.0);  // the masters are not the bf16 model
  for (const auto& [world, algorithm] :
       std::vector<std::pair<int, std::string>>{{3, kStage3}, {1, "{name: allreduce}"}}) {
    CAPTURE(world);
    const std::string out = "at" + std::to_string(world);
    run(world, job_yaml(world, algorithm), true, 4, 3, dir + "/ckpt", "", out);
    CHECK(read_doubles(dir + "/" + out + ".loaded_masters") == saved_masters);  // bit for bit
    CHECK(read_doubles(dir + "/" + out + ".loaded_model") == saved_model);
    CHECK(read_doubles(dir + "/" + out + ".scale") == std::vector<double>{kInitScale, 0});
    CHECK(max_abs_diff(read_doubles(dir + "/" + out + ".masters"), saved_masters) > 0.0);
  }
  // An fp32 run's checkpoint into bf16 stage 3: the masters are the fp32
  // values themselves, the model their bf16 rounding.
  std::string fp32_job = job_yaml(2, kStage3);
  fp32_job = fp32_job.substr(0, fp32_job.find("precision:"));
  run(2, fp32_job, false, 0, 2, "", dir + "/ckpt32", "fp32");
  run(2, job_yaml(2, kStage3), true, 2, 1, dir + "/ckpt32", "", "from32");
  const auto fp32_model = read_doubles(dir + "/fp32.model");
  CHECK(read_doubles(dir + "/from32.loaded_masters") == fp32_model);
  CHECK(model_vs_masters(read_doubles(dir + "/from32.loaded_model"), fp32_model) == 0.0);
  distopt::test::remove_tree(dir);
}

TEST_CASE(
    "zero stage 3 in bf16, 3 ranks: a checkpoint or elastic commit holds 1/W of the units' "
    "parameters and fp32 masters per rank, no rank the whole model") {
  constexpr int kWorld = 3;
  const std::string dir = make_temp_dir("distopt_zero3_bf16_snapshot");
  const std::string job = job_yaml(kWorld, kStage3);
  auto codes = fork_ranks(
      kWorld,
      [&](int rank) {
        torch::set_num_threads(1);
        distopt::test::seed_cpu(kInitSeed);
        Net net;
        net->to(at::kBFloat16);
        auto rt = rank_runtime(job, rank, kWorld, "zero3_bf16_snapshot.yaml");
        auto opt = rt.make_optimizer(*net);
        // Per kind (model pieces of units, master pieces of units, `scale`
        // in no unit): elements this rank's commit holds.
        std::vector<double> held(3, 0);
        const auto s = distopt::optim::snapshot(*net, opt, rank, /*keep_replicas=*/true);
        for (const auto& e : s.entries()) {
          const bool scale = e.key.find("scale") != std::string::npos;
          if (e.key.rfind("model/", 0) == 0)
            held[scale ? 2 : 0] += static_cast<double>(e.data.numel());
          else if (e.key.rfind("master/", 0) == 0 && !scale)
            held[1] += static_cast<double>(e.data.numel());
        }
        held.push_back(static_cast<double>(opt.sharding_memory().gathered));
        write_doubles(dir + "/held" + std::to_string(rank) + ".bin", held);
        rt.barrier();
        return 0;
      },
      std::chrono::seconds(120));
  const double units = (kIn * 32 + 32) + (32 * 24 + 24) + (24 * kClasses + kClasses);
  std::vector<double> sum(2, 0);
  for (int r = 0; r < kWorld; ++r) {
    CAPTURE(r);
    REQUIRE(codes[r] == 0);
    const auto h = read_doubles(dir + "/held" + std::to_string(r) + ".bin");
    REQUIRE(h.size() == 4);
    for (int k = 0; k < 2; ++k) {
      CAPTURE(k);
      sum[k] += h[k];
      CHECK(h[k] > 0);
      CHECK(h[k] <= units / kWorld + 3 * 16);  // its third, up to each unit's alignment
    }
    CHECK(h[2] == kClasses);  // the parameter in no unit: whole on every rank
    CHECK(h[3] == 0);         // and no unit left gathered
  }
  CHECK(sum[0] == units);  // every element of every unit once
  CHECK(sum[1] == units);
  distopt::test::remove_tree(dir);
}

TEST_CASE(
    "an algorithm that shards parameters but has no discard_step (ABI 1.7) is refused under "
    "mixed precision, naming the file, the key and the plugin") {
  const std::string dir = distopt::test::env_path("DISTOPT_NO_DISCARD_PLUGIN_DIR");
  REQUIRE_MESSAGE(!dir.empty(), "DISTOPT_NO_DISCARD_PLUGIN_DIR is not set (run through ctest)");
  auto codes = fork_ranks(1, [&](int) {
    std::string job = job_yaml(1, "{name: no_discard}");
    const std::string paths = "plugins: {paths: [";
    job.insert(job.find(paths) + paths.size(), "'" + dir + "', ");
    Net net;
    net->to(at::kBFloat16);
    try {
      auto rt = rank_runtime(job, 0, 1, "zero3_no_discard.yaml");
      auto opt = rt.make_optimizer(*net);
      std::fprintf(stderr, "not refused\n");
      return 1;
    } catch (const distopt::ConfigError& e) {
      const std::string what = e.what();
      for (const char* part :
           {"zero3_no_discard.yaml: precision: ", "discard_step", "libdistopt_no_discard"})
        if (what.find(part) == std::string::npos) {
          std::fprintf(stderr, "no '%s' in: %s\n", part, e.what());
          return 2;
        }
    }
    return 0;
  });
  CHECK(codes[0] == 0);
}
