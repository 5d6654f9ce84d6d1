// Checkpoints: the whole training state in one HDF5 file whose /params map 1:1 onto a PyTorch
// state_dict, behind a text header holding checksums of every byte, written atomically
// (temporary file, fsync, rename, then `latest`) and verified before anything is parsed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ddpv/core/error.hpp"
#include "ddpv/nn/model.hpp"

namespace ddpv {

// 1: plain HDF5. 2: a checksummed header in the HDF5 user block and a crc32c attribute on every
// tensor, plus the run's batch and schedule attributes (docs/checkpoint-format.md).
inline constexpr int64_t kCheckpointFormatVersion = 2;

// Thrown when a checkpoint's bytes are not the ones written: truncated, a checksum fails, not
// HDF5, unreadable. Its message names the file and the damage ("tensor /params/fc1.weight fails
// its checksum"). `--resume auto` skips such a file for an older one; any other ddpv::Error
// (another model, a newer format) is the user's to fix and stops the run.
class CheckpointDamaged : public Error {
 public:
  using Error::Error;
};

// Everything besides the arenas that a resume needs, plus what a reader wants to know.
struct CheckpointMeta {
  std::string model;  // zoo name
  int64_t height = 0, width = 0, channels = 0, num_classes = 0;
  int64_t epoch = 0;       // epochs completed
  int64_t epoch_step = 0;  // batches of epoch `epoch` already consumed (0 at an epoch end)
  int64_t step = 0;        // optimizer steps since the start of training
  uint64_t seed = 0;
  int64_t world_size = 1;
  int64_t global_batch = 0;             // world_size x batch_size x accum_steps
  std::array<uint64_t, 4> rng_state{};  // the trainer's Rng (synthetic data, future use)
  std::string options;  // the options of the run that wrote it, one "key = value" per line
  std::string data;     // the --data path ("synthetic" when none)
  // What the run continues with (Note [Resume checks]); 0 or "" in a format 1 file.
  int64_t batch_size = 0;  // per rank
  int64_t accum_steps = 0;
  double lr = 0;
  std::string lr_schedule;
  double warmup_epochs = 0;
  int64_t schedule_steps = 0;  // the learning-rate schedule's total length in steps
  // Set by the readers: "" when every byte was verified against a checksum, else why not
  // ("it has no checksums (format_version 1)"), for the caller to warn about.
  std::string unverified;
};

// Layout (docs/checkpoint-format.md):
//   user block         text header: format line, file length, CRC32C of the HDF5 payload,
//                      one line per tensor (CRC32C, offset, bytes, name), the header's CRC32C
//   /params/<name>     float32, PyTorch shapes (layer1.0.conv1.weight: (16, 16, 3, 3))
//   /buffers/<name>    float32 running_mean, running_var; int64 num_batches_tracked per BN
//   /optimizer/<name>  float32 momentum buffers, named like the parameters
//   every tensor       contiguous, attribute crc32c (uint32)
//   attributes on / :  format = "ddpvision-checkpoint", format_version, and CheckpointMeta.
// Builds the file in memory, writes it to `path + ".tmp"`, fsyncs, renames and fsyncs the
// directory, so a crash leaves either the old file or the new one, never a torn one. Refuses
// (throws, writes nothing) when any parameter is NaN or Inf.
void save_checkpoint(const std::string& path, Model& model, const CheckpointMeta& meta);

// Reads and verifies the whole file and returns its metadata (to build the right model before
// loading, or to check a file). Throws CheckpointDamaged for damage.
CheckpointMeta read_checkpoint_meta(const std::string& path);
// Reads the file once, verifies it (Note [Verify before parse]), then loads parameters,
// buffers, momentum and batches_tracked into `model`; checks that the model name, input shape
// and every tensor's name and shape match, naming the first mismatch. The model is unchanged
// when it throws.
CheckpointMeta load_checkpoint(const std::string& path, Model& model);

// The same two on a file's bytes in memory (`name` names it in messages): the checkpoint
// reader as a fuzz target or for tools. verify_checkpoint_bytes checks everything a load
// checks except the model: the header, or without one every tensor's crc32c attribute.
CheckpointMeta verify_checkpoint_bytes(const uint8_t* data, size_t size, const std::string& name);
CheckpointMeta load_checkpoint_bytes(const uint8_t* data, size_t size, const std::string& name,
                                     Model& model);

// ---- the checkpoint directory (checkpoint_dir.cpp) -------------------------------------------

// Files are named ckpt-e<epoch>-s<step>.h5; `latest` is a small text file holding the newest
// complete file name, replaced atomically after it is written.
std::string checkpoint_file_name(int64_t epoch, int64_t step);
void update_latest(const std::string& dir, const std::string& file_name);
// The path `latest` names, or "" when the directory has none. Throws when `latest` is empty or
// names a file that does not exist.
std::string find_latest(const std::string& dir);
// The ckpt-e*-s*.h5 files of `dir` (names), newest (epoch, step) first.
std::vector<std::string> list_checkpoints(const std::string& dir);

// Note [Walk back]: the files `--resume auto` tries, in order: the one `latest` names, then
// every ckpt-e*-s*.h5 older than it, newest first; every ckpt-e*-s*.h5 newest first when
// `latest` is missing, empty or dangling (then *why says so, else it is cleared).
std::vector<std::string> resume_candidates(const std::string& dir, std::string* why);

// Removes the `ckpt-*.h5.tmp` and `latest.tmp` a crashed writer left; returns their names.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

// What a check of a checkpoint file found, and the file's size and modification time then (a
// rewritten file changes them, so the verdict is kept only while they stay).
struct FileCheck {
  uintmax_t size = 0;
  int64_t mtime_ns = 0;
  std::string damage;  // "" when it verified
};
using VerifiedFiles = std::map<std::string, FileCheck>;  // by path

// Reads `path` (from the disk, not the page cache, where the kernel allows) and verifies it as
// read_checkpoint_meta does, unless `cache` holds a verdict for its current size and mtime;
// records the verdict. True when it verifies; else *why holds the error message. *cached says
// whether the verdict came from the cache.
bool check_checkpoint_file(const std::string& path, VerifiedFiles* cache, std::string* why,
                           bool* cached = nullptr);
// The same, throwing CheckpointDamaged with that message when it does not verify.
void verify_checkpoint_file(const std::string& path, VerifiedFiles* cache);
// Records in `cache` that `path`, as it is now, verified (it was just loaded).
void note_verified(const std::string& path, VerifiedFiles* cache);

// Note [Pruning]: keeps the newest `keep` checkpoints that verify (keep >= 1; 0 keeps all),
// the file `latest` names, and every file newer than the oldest one kept (a damaged one among
// them stays as evidence until it ages out); removes the rest. Files are checked through
// `cache` (check_checkpoint_file), so a run reads each file at most once; a damaged one is
// named in a warning the first time.
void prune_checkpoints(const std::string& dir, int keep, VerifiedFiles* cache = nullptr);

}  // namespace ddpv
