// Note [Resume checks]: which differences between a checkpoint's run and the new options are
// named, in the words the refusal uses; format 1 checkpoints through their options text.
#include "ddpv/train/options.hpp"
#include "support/test_support.hpp"
#include "train/resume_check.hpp"

namespace ddpv {
namespace {

CheckpointMeta checkpoint_of(const RunPlan& p) {
  CheckpointMeta m;
  m.world_size = p.world_size;
  m.global_batch = p.global_batch();
  m.batch_size = p.batch_size;
  m.accum_steps = p.accum_steps;
  m.lr = p.lr;
  m.lr_schedule = choice_name(p.lr_schedule);
  m.warmup_epochs = p.warmup_epochs;
  m.schedule_steps = p.schedule_steps;
  return m;
}

RunPlan plan() {
  RunPlan p;
  p.world_size = 2;
  p.batch_size = 16;
  p.accum_steps = 1;
  p.lr = 0.05;
  p.lr_schedule = LrShape::kCosine;
  p.warmup_epochs = 0.5;
  p.schedule_steps = 26;
  p.steps_per_epoch = 13;
  return p;
}

using Diffs = std::vector<std::string>;

TEST(ResumeCheck, SameRunOrSameGlobalBatchPasses) {
  const CheckpointMeta m = checkpoint_of(plan());
  EXPECT_EQ(resume_differences(m, plan()), Diffs{});
  RunPlan four = plan();  // 4 x 8 is the same global batch as 2 x 16
  four.world_size = 4;
  four.batch_size = 8;
  EXPECT_EQ(resume_differences(m, four), Diffs{});
  RunPlan one = plan();
  one.world_size = 1;
  one.batch_size = 32;
  EXPECT_EQ(resume_differences(m, one), Diffs{});
}

TEST(ResumeCheck, EachDifferenceIsNamedOldToNew) {
  const CheckpointMeta m = checkpoint_of(plan());
  RunPlan p = plan();
  p.batch_size = 32;
  EXPECT_EQ(
      resume_differences(m, p),
      Diffs{"global batch 32 -> 64 (2 ranks x --batch-size 16 -> 2 ranks x --batch-size 32)"});
  p = plan();
  p.batch_size = 8;
  p.accum_steps = 2;  // the same global batch, but other steps: named
  EXPECT_EQ(resume_differences(m, p), Diffs{"--accum-steps 1 -> 2"});
  p = plan();
  p.lr = 0.1;
  p.lr_schedule = LrShape::kStep;
  p.warmup_epochs = 1;
  p.schedule_steps = 39;
  EXPECT_EQ(resume_differences(m, p),
            (Diffs{"--lr 0.05 -> 0.1", "--lr-schedule cosine -> step", "--warmup-epochs 0.5 -> 1",
                   "schedule length 26 -> 39 steps (--epochs, --max-steps)"}));
  p = plan();
  p.lr = 0.05 * (1 + 1e-9);  // a float64 attribute compares exactly
  EXPECT_EQ(resume_differences(m, p).size(), 1u);
}

TEST(ResumeCheck, ConstantScheduleLengthDoesNotMatter) {
  RunPlan a = plan();
  a.lr_schedule = LrShape::kConstant;
  a.warmup_epochs = 0;
  RunPlan b = a;
  b.schedule_steps = 100;
  EXPECT_EQ(resume_differences(checkpoint_of(a), b), Diffs{});
}

// A format 1 checkpoint has no run attributes; its options text (6 significant digits) holds
// the same values.
TEST(ResumeCheck, FormatOneComparesItsOptions) {
  TrainOptions o;
  o.batch_size = 16;
  o.lr = 0.05;
  o.lr_schedule = LrShape::kCosine;
  o.warmup_epochs = 0.5;
  o.epochs = 2;
  CheckpointMeta m;
  m.world_size = 2;
  m.global_batch = 32;
  m.options = options_to_config(o);
  EXPECT_EQ(resume_differences(m, plan()), Diffs{});
  RunPlan p = plan();
  p.lr = 0.1;
  p.schedule_steps = 39;
  EXPECT_EQ(resume_differences(m, p),
            (Diffs{"--lr 0.05 -> 0.1", "schedule length 26 -> 39 steps (--epochs, --max-steps)"}));
  p = plan();
  p.batch_size = 32;  // other global batch: the old schedule length is unknown, not compared
  p.schedule_steps = 13;
  p.steps_per_epoch = 7;
  EXPECT_EQ(
      resume_differences(m, p),
      Diffs{"global batch 32 -> 64 (2 ranks x --batch-size 16 -> 2 ranks x --batch-size 32)"});
}

}  // namespace
}  // namespace ddpv
