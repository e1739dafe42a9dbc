// LrSchedule against libtorch's StepLR and PyTorch's documented closed forms
// and examples; the YAML keys optimizer.lr_schedule / grad_clip and their
// errors. In process (no ranks).
#include "distopt/lr_schedule.hpp"

#include <torch/optim/schedulers/step_lr.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <string>

#include "distopt/config.hpp"
#include "distopt/error.hpp"
#include "torch_doctest.hpp"

namespace {

using distopt::LrSchedule;
using distopt::LrScheduleKind;

constexpr double kPi = 3.14159265358979323846;

std::string config_error(const std::string& yaml) {
  try {
    distopt::parse_job_config(yaml, "sched.yaml");
  } catch (const distopt::ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// libtorch's LRScheduler::step() computes the new lr from the count before
// incrementing it, so its StepLR decays one call later than PyTorch's (whose
// constructor takes an initial step: lr = 0.05 for epochs 0..29 with
// step_size 30, as documented). One call first aligns the two; then they
// agree at every step.
TEST_CASE("step equals libtorch's StepLR at every step") {
  for (const auto& [size, gamma] : {std::pair<int64_t, double>{3, 0.5}, {1, 0.9}, {7, 0.1}}) {
    CAPTURE(size);
    at::Tensor w = at::zeros({2}, at::requires_grad());
    torch::optim::SGD sgd({w}, torch::optim::SGDOptions(0.05));
    torch::optim::StepLR ref(sgd, static_cast<unsigned>(size), gamma);
    ref.step();  // PyTorch's initial step
    LrSchedule s;
    s.kind = LrScheduleKind::step;
    s.step_size = size;
    s.gamma = gamma;
    for (int64_t k = 0; k < 40; ++k) {
      CAPTURE(k);
      const double want = sgd.param_groups()[0].options().get_lr();
      // StepLR multiplies the lr in place (one rounding per decay), the
      // closed form takes a power: equal to a few ulps.
      CHECK(std::abs(0.05 * s.factor(k) - want) <= 1e-15 + 1e-13 * want);
      ref.step();
    }
  }
}

TEST_CASE("multi_step, cosine, linear, one_cycle: PyTorch's documented values") {
  LrSchedule st;  // StepLR docs: step_size 30, gamma 0.1, lr 0.05
  st.kind = LrScheduleKind::step;
  st.step_size = 30;
  CHECK(0.05 * st.factor(29) == doctest::Approx(0.05).epsilon(1e-14));
  CHECK(0.05 * st.factor(30) == doctest::Approx(0.005).epsilon(1e-14));
  CHECK(0.05 * st.factor(60) == doctest::Approx(0.0005).epsilon(1e-14));

  LrSchedule m;  // MultiStepLR docs: milestones [30, 80], gamma 0.1, lr 0.05
  m.kind = LrScheduleKind::multi_step;
  m.milestones = {30, 80};
  m.gamma = 0.1;
  CHECK(0.05 * m.factor(0) == doctest::Approx(0.05).epsilon(1e-14));
  CHECK(0.05 * m.factor(29) == doctest::Approx(0.05).epsilon(1e-14));
  CHECK(0.05 * m.factor(30) == doctest::Approx(0.005).epsilon(1e-14));
  CHECK(0.05 * m.factor(79) == doctest::Approx(0.005).epsilon(1e-14));
  CHECK(0.05 * m.factor(80) == doctest::Approx(0.0005).epsilon(1e-14));

  LrSchedule c;  // CosineAnnealingLR closed form, T_max 10
  c.kind = LrScheduleKind::cosine;
  c.total_steps = 10;
  CHECK(c.factor(0) == 1.0);
  CHECK(c.factor(2) == doctest::Approx(0.9045084971874737).epsilon(1e-14));
  CHECK(c.factor(5) == doctest::Approx(0.5).epsilon(1e-14));
  CHECK(c.factor(10) == doctest::Approx(0.0));
  CHECK(c.factor(13) == doctest::Approx(0.0));  // held at eta_min, not rising again
  c.min_lr_factor = 0.1;                        // eta_min = 0.1 x base
  CHECK(c.factor(5) == doctest::Approx(0.55).epsilon(1e-14));
  CHECK(c.factor(10) == doctest::Approx(0.1).epsilon(1e-14));

  // LinearLR docs: start_factor 0.5, total_iters 4, lr 0.05 -> 0.025,
  // 0.03125, 0.0375, 0.04375, 0.05: a linear warm-up from 0.5.
  LrSchedule w;
  w.kind = LrScheduleKind::linear;
  w.warmup_steps = 4;
  w.warmup_start_factor = 0.5;
  w.total_steps = 14;
  w.end_factor = 0;
  const double docs[] = {0.025, 0.03125, 0.0375, 0.04375, 0.05};
  for (int k = 0; k < 5; ++k) CHECK(0.05 * w.factor(k) == doctest::Approx(docs[k]).epsilon(1e-14));
  // ...then LinearLR(start 1, end 0, total_iters 10) from step 4
  CHECK(w.factor(9) == doctest::Approx(0.5).epsilon(1e-14));
  CHECK(w.factor(14) == doctest::Approx(0.0));
  CHECK(w.factor(20) == doctest::Approx(0.0));

  LrSchedule cw;  // cosine with warm-up from 0 (get_cosine_schedule_with_warmup)
  cw.kind = LrScheduleKind::cosine;
  cw.warmup_steps = 4;
  cw.total_steps = 14;
  CHECK(cw.factor(0) == 0.0);
  CHECK(cw.factor(2) == doctest::Approx(0.5).epsilon(1e-14));
  CHECK(cw.factor(4) == doctest::Approx(1.0).epsilon(1e-14));
  CHECK(cw.factor(9) == doctest::Approx(0.5).epsilon(1e-14));

  // OneCycleLR(max_lr 1, total_steps 10): pct_start 0.3 -> phase end 2,
  // initial 1/25 = 0.04, min 0.04 / 1e4 = 4e-6.
  LrSchedule o;
  o.kind = LrScheduleKind::one_cycle;
  o.total_steps = 10;
  CHECK(o.factor(0) == doctest::Approx(0.04).epsilon(1e-14));
  CHECK(o.factor(1) == doctest::Approx(0.52).epsilon(1e-14));
  CHECK(o.factor(2) == doctest::Approx(1.0).epsilon(1e-14));
  CHECK(o.factor(3) == doctest::Approx(4e-6 + (1 - 4e-6) / 2 * (std::cos(kPi / 7) + 1)));
  CHECK(o.factor(3) == doctest::Approx(0.9504846320134737).epsilon(1e-12));
  CHECK(o.factor(9) == doctest::Approx(4e-6).epsilon(1e-12));
  o.anneal_cos = false;
  CHECK(o.factor(1) == doctest::Approx(0.52).epsilon(1e-14));
  CHECK(o.factor(5) == doctest::Approx(1 + (4e-6 - 1) * 3.0 / 7.0).epsilon(1e-14));

  LrSchedule k;  // constant
  CHECK(k.factor(0) == 1.0);
  CHECK(k.factor(1000) == 1.0);
}

TEST_CASE("optimizer.lr_schedule and grad_clip parse; bad values name file:line and key") {
  const std::string head = "optimizer:\n  name: sgd\n  lr: 0.1\n";
  auto cfg = distopt::parse_job_config(head +
                                           "  grad_clip: 0.5\n"
                                           "  lr_schedule: {kind: cosine, warmup_steps: 3, "
                                           "total_steps: 30, min_lr_factor: 0.01}\n",
                                       "sched.yaml");
  REQUIRE(cfg.lr_schedule);
  CHECK(cfg.lr_schedule->kind == LrScheduleKind::cosine);
  CHECK(cfg.lr_schedule->warmup_steps == 3);
  CHECK(cfg.lr_schedule->total_steps == 30);
  CHECK(cfg.lr_schedule->min_lr_factor == 0.01);
  CHECK(cfg.grad_clip == 0.5);
  CHECK(!cfg.optimizer_options["lr_schedule"].IsDefined());  // not the inner optimizer's
  CHECK(!cfg.optimizer_options["grad_clip"].IsDefined());

  // total_steps may be left to distopt train
  auto open = distopt::parse_job_config(head + "  lr_schedule: cosine\n", "sched.yaml");
  REQUIRE(open.lr_schedule);
  CHECK(open.lr_schedule->total_steps == -1);
  CHECK_THROWS_AS(open.lr_schedule->validate(), distopt::ConfigError);

  std::string m = config_error(head + "  lr_schedule: {kind: multi_step, milestones: [5, 3]}\n");
  CHECK(m.find("sched.yaml:4:") != std::string::npos);
  CHECK(m.find("optimizer.lr_schedule.milestones: expected increasing positive integers") !=
        std::string::npos);
  m = config_error(head + "  lr_schedule: {kind: cosin}\n");
  CHECK(m.find("unknown schedule 'cosin'") != std::string::npos);
  CHECK(m.find("did you mean 'cosine'") != std::string::npos);
  m = config_error(head + "  lr_schedule: {kind: step, warmup_step: 3}\n");
  CHECK(m.find("did you mean 'warmup_steps'") != std::string::npos);
  m = config_error(head + "  lr_schedule: {kind: step, gamma: 0}\n");
  CHECK(m.find("optimizer.lr_schedule.gamma") != std::string::npos);
  m = config_error(head + "  lr_schedule: {kind: cosine, total_steps: 5, warmup_steps: 5}\n");
  CHECK(m.find("optimizer.lr_schedule.total_steps: must be greater than warmup_steps") !=
        std::string::npos);
  m = config_error(head + "  lr_schedule: {kind: one_cycle, warmup_steps: 5}\n");
  CHECK(m.find("unknown key 'warmup_steps' in optimizer.lr_schedule (kind one_cycle)") !=
        std::string::npos);
  m = config_error(head + "  grad_clip: -1\n");
  CHECK(m.find("sched.yaml:4:") != std::string::npos);
  CHECK(m.find("optimizer.grad_clip: value -1 is out of range [0, inf)") != std::string::npos);
  m = config_error(head + "  lr_schedul: cosine\n");
  CHECK(m.find("did you mean 'lr_schedule'") != std::string::npos);
}
