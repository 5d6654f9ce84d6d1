// Checkpoints: the whole training state in one HDF5 file whose /params map 1:1 onto a PyTorch
// state_dict, written atomically (temporary file, fsync, rename, then `latest`).
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "ddpv/nn/model.hpp"

namespace ddpv {

inline constexpr int64_t kCheckpointFormatVersion = 1;

// Everything besides the arenas that a resume needs, plus what a reader wants to know.
struct CheckpointMeta {
  std::string model;          // zoo name
  int64_t height = 0, width = 0, channels = 0, num_classes = 0;
  int64_t epoch = 0;          // epochs completed
  int64_t epoch_step = 0;     // batches of epoch `epoch` already consumed (0 at an epoch end)
  int64_t step = 0;           // optimizer steps since the start of training
  uint64_t seed = 0;
  int64_t world_size = 1;
  int64_t global_batch = 0;
  std::array<uint64_t, 4> rng_state{};  // the trainer's Rng (synthetic data, future use)
  std::string options;        // the options of the run that wrote it, one "key = value" per line
  std::string data;           // the --data path ("synthetic" when none)
};

// Layout (docs/checkpoint-format.md):
//   /params/<name>     float32, PyTorch shapes (layer1.0.conv1.weight: (16, 16, 3, 3))
//   /buffers/<name>    float32 running_mean, running_var; int64 num_batches_tracked per BN
//   /optimizer/<name>  float32 momentum buffers, named like the parameters
//   attributes on / : format = "ddpvision-checkpoint", format_version, and CheckpointMeta.
// Writes `path` through `path + ".tmp"`: written, flushed, fsync'ed, renamed, and the directory
// fsync'ed, so a crash leaves either the old file or the new one, never a torn one. Refuses
// (throws, writes nothing) when any parameter is NaN or Inf.
void save_checkpoint(const std::string& path, Model& model, const CheckpointMeta& meta);

// Reads the metadata only (to build the right model before loading).
CheckpointMeta read_checkpoint_meta(const std::string& path);
// Loads parameters, buffers, momentum and batches_tracked into `model`; checks that the model
// name, input shape and every tensor's name and shape match, naming the first mismatch.
CheckpointMeta load_checkpoint(const std::string& path, Model& model);

// Checkpoint directory helpers. Files are named ckpt-e<epoch>-s<step>.h5; `latest` is a small
// text file holding the newest complete file name, replaced atomically after it is written.
std::string checkpoint_file_name(int64_t epoch, int64_t step);
void update_latest(const std::string& dir, const std::string& file_name);
// The path `latest` names, or "" when the directory has none. Throws when `latest` names a
// file that does not exist.
std::string find_latest(const std::string& dir);
// Removes all but the newest `keep` checkpoints of the directory (keep >= 1; 0 keeps all).
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace ddpv
