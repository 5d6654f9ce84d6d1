// The trainer's checkpoints: writing (verified after the rename, then `latest`, then pruning)
// and resuming (walking back past damaged files, refusing a run that would change).
#include <filesystem>

#include "ddpv/core/log.hpp"
#include "ddpv/dist/stall_watch.hpp"
#include "train/durable_file.hpp"
#include "train/resume_check.hpp"
#include "train/trainer_impl.hpp"

namespace ddpv {
namespace {

// A resume refused because the options differ: exit 2, as other usage errors.
class OptionsDiffer : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "is damaged: ..." of "checkpoint PATH is damaged: ...", for a list of files.
std::string reason_of(const std::string& message, const std::string& path) {
  const std::string prefix = "checkpoint " + path + " ";
  return message.rfind(prefix, 0) == 0 ? message.substr(prefix.size()) : message;
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string s;
  for (const std::string& p : parts) s += (s.empty() ? "" : sep) + p;
  return s;
}

}  // namespace

CheckpointMeta Trainer::Impl::run_meta() const {
  CheckpointMeta meta;
  meta.model = o.model;
  meta.height = data.shape.height;
  meta.width = data.shape.width;
  meta.channels = data.shape.channels;
  meta.num_classes = data.shape.num_classes;
  meta.epoch = pos.epoch;
  meta.epoch_step = pos.epoch_step;
  meta.step = pos.step;
  meta.seed = o.seed;
  meta.world_size = world.size();
  meta.global_batch = global_batch();
  meta.options = options_to_config(o);
  meta.data = o.synthetic ? "synthetic" : o.data;
  meta.batch_size = o.batch_size;
  meta.accum_steps = o.accum_steps;
  meta.lr = o.lr;
  meta.lr_schedule = choice_name(o.lr_schedule);
  meta.warmup_epochs = o.warmup_epochs;
  meta.schedule_steps = schedule->total_steps();
  return meta;
}

std::string Trainer::Impl::save(const char* why) {
  world.stall_watch()->set_phase(Phase::kCheckpoint);
  average_buffers(*model, *comm);
  // Every rank holds the same parameters, so all reach the same verdict without a collective.
  if (!backend->all_finite(model->param_count(), model->param_data())) {
    throw_diverged("the parameters hold NaN or Inf");
  }
  std::string path;
  if (world.is_root()) {
    namespace fs = std::filesystem;
    fs::create_directories(o.checkpoint_dir);
    const std::string name = checkpoint_file_name(pos.epoch, pos.step);
    path = (fs::path(o.checkpoint_dir) / name).string();
    save_checkpoint(path, *model, run_meta());
    // Note [Pruning]: nothing older is touched before the new file reads back whole from the
    // disk; a file that does not is removed, and `latest` keeps naming the previous one.
    try {
      verify_checkpoint_file(path, &verified_files);
    } catch (const CheckpointDamaged& e) {
      durable::remove_quietly(path);
      DDPV_FAIL(e.message(),
                " right after it was written, so it was removed and `latest` still "
                "names the previous checkpoint; check the disk of ",
                o.checkpoint_dir);
    }
    update_latest(o.checkpoint_dir, name);
    prune_checkpoints(o.checkpoint_dir, o.keep_checkpoints, &verified_files);
    DDPV_INFO("checkpoint (", why, "): ", path);
    metrics.write(JsonRecord()
                      .add("event", "checkpoint")
                      .add("path", path)
                      .add("step", pos.step)
                      .add("epoch", pos.epoch)
                      .add("reason", why));
  }
  world.barrier();  // nobody runs ahead (or exits) before the checkpoint is complete
  last_checkpoint = path;
  last_checkpoint_step = pos.step;
  return path;
}

// Note [Resume verdict]: only rank 0 reads checkpoints; when it refuses to resume, every rank
// must stop at the same point with one message, not rank 0 alone (the others would wait in
// the parameter broadcast forever). So rank 0's verdict, ok or the message, is broadcast and
// every rank throws StartRefused with it.
void Trainer::Impl::resume() {
  if (world.is_root() && !o.checkpoint_dir.empty()) {
    const std::vector<std::string> stale = remove_stale_temporaries(o.checkpoint_dir);
    if (!stale.empty())
      DDPV_INFO("removed ", stale.size(), " temporary file(s) a stopped run left in ",
                o.checkpoint_dir, ": ", join(stale, ", "));
  }
  if (o.resume.empty()) return;
  int64_t verdict[2] = {0, 0};  // exit code, message length
  std::string message;
  if (world.is_root()) {
    try {
      resume_on_root();
    } catch (const OptionsDiffer& e) {
      verdict[0] = 2;
      message = e.what();
    } catch (const Error& e) {
      verdict[0] = 1;
      message = e.message();
    } catch (const std::exception& e) {
      verdict[0] = 1;
      message = e.what();
    }
    verdict[1] = static_cast<int64_t>(message.size());
  }
  world.broadcast_bytes(verdict, sizeof verdict, 0);
  if (verdict[0] == 0) return;
  message.resize(static_cast<size_t>(verdict[1]));
  world.broadcast_bytes(message.data(), message.size(), 0);
  throw StartRefused(message, static_cast<int>(verdict[0]));
}

void Trainer::Impl::resume_on_root() {
  std::string path;
  CheckpointMeta meta;
  if (o.resume == "auto") {
    std::string why;
    const std::vector<std::string> candidates = resume_candidates(o.checkpoint_dir, &why);
    if (candidates.empty()) {
      DDPV_CHECK(!o.eval_only, "--eval-only --resume auto: no checkpoint in ", o.checkpoint_dir,
                 why.empty() ? "" : " (" + why + ")", " to evaluate; pass --resume FILE");
      if (why.empty())
        DDPV_INFO("--resume auto: no checkpoint in ", o.checkpoint_dir, " yet, starting fresh");
      else
        DDPV_WARN("--resume auto: ", why, " and no checkpoint file is left; starting fresh");
      return;
    }
    if (!why.empty())
      DDPV_WARN("--resume auto: ", why, "; trying the checkpoint files, newest first");
    // Note [Walk back]: damage sends us to the next older file; anything else (another model,
    // a newer format) is the user's to fix, and an older file would not fix it.
    std::vector<std::string> skipped;
    for (const std::string& c : candidates) {
      try {
        meta = load_checkpoint(c, *model);
        path = c;
        break;
      } catch (const CheckpointDamaged& e) {
        DDPV_WARN("--resume auto: skipping ", c, ", which ", reason_of(e.message(), c));
        skipped.push_back(std::filesystem::path(c).filename().string() + " " +
                          reason_of(e.message(), c));
      }
    }
    if (path.empty())
      DDPV_FAIL("--resume auto: none of the ", candidates.size(), " checkpoints in ",
                o.checkpoint_dir, " verifies (", join(skipped, "; "), "); to start fresh, move ",
                o.checkpoint_dir, " aside");
    if (!skipped.empty())
      DDPV_WARN("--resume auto: resuming from ", path, ", the newest checkpoint that verifies ",
                "(skipped ", skipped.size(), " newer)");
  } else {
    path = o.resume;
    try {
      meta = load_checkpoint(path, *model);
    } catch (const CheckpointDamaged& e) {
      DDPV_FAIL(e.message(), "; pass an older checkpoint, or --resume auto with --checkpoint-dir ",
                "to take the newest one that verifies");
    }
  }
  if (meta.unverified.empty()) {
    note_verified(path, &verified_files);
  } else {
    DDPV_WARN("checkpoint ", path, " loaded unverified: ", meta.unverified);
  }

  RunPlan now;
  now.world_size = world.size();
  now.batch_size = o.batch_size;
  now.accum_steps = o.accum_steps;
  now.lr = o.lr;
  now.lr_schedule = o.lr_schedule;
  now.warmup_epochs = o.warmup_epochs;
  now.schedule_steps = schedule->total_steps();
  now.steps_per_epoch = pos.steps_per_epoch;
  const std::vector<std::string> changed = resume_differences(meta, now);
  if (!changed.empty() && !o.resume_changed && !o.eval_only)
    throw OptionsDiffer("--resume " + path + ": the run would change: " + join(changed, ", ") +
                        "; pass the options of the checkpoint's run, or add --resume-changed to "
                        "continue with the new ones");
  if (!changed.empty() && !o.eval_only)
    DDPV_WARN("--resume-changed: continuing ", path, " with ", join(changed, ", "));

  pos.epoch = meta.epoch;
  pos.epoch_step = meta.epoch_step;
  pos.step = meta.step;
  const std::string before = batch_text(meta.world_size, meta.batch_size, meta.accum_steps);
  if (o.eval_only) {
    // evaluation only: the position and batch are the checkpoint's to report, nothing more
  } else if (meta.global_batch == global_batch() && meta.world_size != world.size()) {
    DDPV_INFO("resuming a run of ", before, " on ",
              batch_text(world.size(), o.batch_size, o.accum_steps), ": the same global batch of ",
              global_batch(), ", so it continues at the same sample");
  } else if (meta.global_batch != global_batch() && pos.epoch_step > 0) {
    DDPV_WARN("resuming mid-epoch with a global batch of ", global_batch(),
              " where the checkpoint ", "had ", meta.global_batch, ": the position inside epoch ",
              pos.epoch + 1,
              " is counted in the new batches, so some samples of it are seen twice or not at all");
  }
  DDPV_INFO("resumed from ", path, " at epoch ", pos.epoch, " step ", pos.step);
}

}  // namespace ddpv
