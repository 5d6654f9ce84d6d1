// Learning-rate schedules against their closed forms, and option validation.
#include <sched.h>

#include <cmath>
#include <limits>

#include "ddpv/train/options.hpp"
#include "ddpv/train/schedule.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

TEST(LrSchedule, WarmupRisesLinearlyToTheBase) {
  LrSchedule s(LrShape::kConstant, 0.4, 100, 10);
  for (int64_t t = 0; t < 10; ++t) EXPECT_DOUBLE_EQ(s.at(t), 0.4 * (t + 1) / 10.0) << t;
  for (int64_t t = 10; t < 100; ++t) EXPECT_DOUBLE_EQ(s.at(t), 0.4) << t;
}

TEST(LrSchedule, StepDividesByTenAtHalfAndThreeQuarters) {
  LrSchedule s(LrShape::kStep, 1.0, 200, 0);
  EXPECT_DOUBLE_EQ(s.at(0), 1.0);
  EXPECT_DOUBLE_EQ(s.at(99), 1.0);
  EXPECT_DOUBLE_EQ(s.at(100), 0.1);
  EXPECT_DOUBLE_EQ(s.at(149), 0.1);
  EXPECT_NEAR(s.at(150), 0.01, 1e-15);
  EXPECT_NEAR(s.at(199), 0.01, 1e-15);
}

TEST(LrSchedule, CosineFollowsHalfACosineAfterWarmup) {
  const double base = 0.2;
  LrSchedule s(LrShape::kCosine, base, 110, 10);
  EXPECT_DOUBLE_EQ(s.at(9), base);  // the last warmup step reaches the base
  for (int64_t t = 10; t < 110; ++t) {
    const double progress = (t - 10) / 100.0;
    EXPECT_NEAR(s.at(t), base * 0.5 * (1 + std::cos(M_PI * progress)), 1e-12) << t;
  }
  EXPECT_NEAR(s.at(60), base / 2, 1e-12);
}

TEST(Options, ValidationNamesTheOption) {
  TrainOptions o;
  o.synthetic = true;
  EXPECT_NO_THROW(validate_options(o, false));
  auto message = [](TrainOptions bad) {
    try {
      validate_options(bad, false);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TrainOptions a = o;
  a.batch_size = 0;
  EXPECT_NE(message(a).find("--batch-size"), std::string::npos);
  TrainOptions b = o;
  b.nesterov = true;
  b.momentum = 0;
  EXPECT_NE(message(b).find("--nesterov"), std::string::npos);
  TrainOptions c = o;
  c.precision = Precision::kBF16;  // both devices take bf16; neither fp16
  EXPECT_NO_THROW(validate_options(c, false));
  EXPECT_NO_THROW(validate_options(c, true));
  c.precision = Precision::kF16;
  EXPECT_NE(message(c).find("--precision fp16"), std::string::npos);
  TrainOptions d = o;
  d.data = "x.h5";
  EXPECT_NE(message(d).find("exclude each other"), std::string::npos);
  TrainOptions e = o;
  e.resume = "auto";
  EXPECT_NE(message(e).find("--checkpoint-dir"), std::string::npos);
}

// inf and nan parse as numbers; no double option accepts them, whatever its range check.
TEST(Options, NonFiniteNumbersAndMoreThreadsThanTheAffinityMaskAreRefused) {
  TrainOptions o;
  o.synthetic = true;
  auto message = [](const TrainOptions& bad) {
    try {
      validate_options(bad, false);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double TrainOptions::*field :
       {&TrainOptions::lr, &TrainOptions::momentum, &TrainOptions::weight_decay,
        &TrainOptions::warmup_epochs, &TrainOptions::bucket_mb, &TrainOptions::comm_timeout,
        &TrainOptions::cache_mb}) {
    for (double v : {inf, nan, -inf}) {
      TrainOptions bad = o;
      bad.*field = v;
      EXPECT_NE(message(bad).find("must be a finite number"), std::string::npos) << message(bad);
    }
  }
  TrainOptions lr = o;
  lr.lr = inf;
  EXPECT_EQ(message(lr), "--lr must be a finite number, got inf");

  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int cpus = CPU_COUNT(&set);
  TrainOptions t = o;
  t.threads = cpus;
  EXPECT_NO_THROW(validate_options(t, false));
  t.threads = cpus + 1;
  const std::string m = message(t);
  EXPECT_NE(m.find("--threads " + std::to_string(cpus + 1) + " is more than the " +
                   std::to_string(cpus) + " CPUs this rank may run on"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("affinity mask"), std::string::npos) << m;
}

// Note [Injected busy time]: one finite value >= 0 per rank, separated like --batch-split's.
TEST(Options, BusyPerImageTakesOneFiniteValuePerRank) {
  EXPECT_TRUE(parse_busy_per_image("").empty());
  EXPECT_EQ(parse_busy_per_image("0.03/0.01"), (std::vector<double>{0.03, 0.01}));
  EXPECT_EQ(parse_busy_per_image("0,0,0,2e-2"), (std::vector<double>{0, 0, 0, 0.02}));
  for (const char* bad : {"0.03/", "/0.01", "0.03//0.01", "-0.01", "inf", "nan", "0.01x", "x"}) {
    try {
      parse_busy_per_image(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("--test-busy-per-image ") + bad +
                                           ": give one finite number of seconds >= 0 per rank, "
                                           "as in 0.03/0.01");
    }
  }
  TrainOptions o;
  o.synthetic = true;
  o.test_busy_per_image = "0.01/0.02";
  EXPECT_NO_THROW(validate_options(o, false));
  // A GPU's rank times are not pooled, so there is nothing for it to feed there.
  try {
    validate_options(o, true);
    ADD_FAILURE() << "accepted on a GPU";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--test-busy-per-image needs the CPU backend", 0), 0u)
        << e.what();
  }
}

// The config rendering stored in checkpoints uses the command line's keys.
TEST(Options, ConfigRenderingUsesOptionNames) {
  TrainOptions o;
  o.model = "resnet20";
  o.augment = false;
  const std::string cfg = options_to_config(o);
  EXPECT_NE(cfg.find("model = resnet20\n"), std::string::npos);
  EXPECT_NE(cfg.find("no-augment = true\n"), std::string::npos);
  EXPECT_NE(cfg.find("batch-size = 64\n"), std::string::npos);
}

}  // namespace
}  // namespace ddpv
