// Checkpoint I/O: bit-exact round trip of a real model, PyTorch names read back through the
// plain HDF5 C API, NaN refusal, mismatch and corruption errors, `latest` and pruning.
#include <hdf5.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

#include "ddpv/nn/model.hpp"
#include "ddpv/train/checkpoint.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::unique_ptr<Backend> cpu_backend() {
  BackendOptions o;
  o.device = Device::kCpu;
  o.threads = 1;
  return make_backend(o);
}

// Arena contents with distinct values in every tensor (not just the initialisation pattern);
// the padding between tensors stays zero, as training keeps it (Note [Aligned entries]).
void scramble(Model& m, uint64_t seed) {
  m.init_parameters(seed);
  Backend& b = m.backend();
  auto fill = [&](float* arena, const std::vector<ArenaEntry>& entries, uint64_t s) {
    for (const ArenaEntry& e : entries) {
      const std::vector<float> v = test::random_vector(static_cast<size_t>(e.count), ++s, -2, 2);
      b.copy(arena + e.offset, b.device(), v.data(), Device::kCpu, v.size() * sizeof(float));
    }
  };
  fill(m.param_data(), m.params(), seed * 1000 + 1);
  fill(m.momentum_data(), m.params(), seed * 1000 + 500);
  fill(m.buffer_data(), m.buffers(), seed * 1000 + 900);
  b.synchronize();
  m.set_batches_tracked(static_cast<int64_t>(seed % 1000) + 17);
}

std::vector<float> arena(Model& m, float* data, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  if (n > 0) m.backend().copy(v.data(), Device::kCpu, data, m.backend().device(), v.size() * 4);
  m.backend().synchronize();
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

CheckpointMeta sample_meta() {
  CheckpointMeta m;
  m.epoch = 3;
  m.epoch_step = 7;
  m.step = 1234;
  m.seed = 0xFEDCBA9876543210ull;  // above INT64_MAX: stored unsigned
  m.world_size = 2;
  m.global_batch = 256;
  m.rng_state = {1, 0xFFFFFFFFFFFFFFFFull, 3, 0x8000000000000000ull};
  m.options = "model = resnet20\nlr = 0.1\nnote = \"quoted\"\n";
  m.data = "/data/cifar10.h5";
  m.batch_size = 64;
  m.accum_steps = 2;
  m.lr = 0.123456789012;
  m.lr_schedule = "cosine";
  m.warmup_epochs = 0.5;
  m.schedule_steps = 7813;
  return m;
}

int64_t read_i64_scalar(const std::string& file, const std::string& dataset) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  hid_t s = H5Dget_space(d);
  const int rank = H5Sget_simple_extent_ndims(s);
  int64_t v = -1;
  H5Dread(d, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, &v);
  H5Sclose(s);
  H5Dclose(d);
  H5Fclose(f);
  EXPECT_EQ(rank, 0) << dataset << " should be a scalar, like torch's 0-dim tensor";
  return v;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = cpu_backend();
    model_ = make_model("resnet20", *backend_, Shape{32, 32, 3}, 10);
    scramble(*model_, 42);
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  TempDir dir_;
};

TEST_F(CheckpointTest, RoundTripIsBitIdentical) {
  const std::string path = dir_.file("a.h5");
  save_checkpoint(path, *model_, sample_meta());
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  auto other = make_model("resnet20", *backend_, Shape{32, 32, 3}, 10);
  scramble(*other, 7);
  const CheckpointMeta got = load_checkpoint(path, *other);
  Model& a = *model_;
  Model& b = *other;
  EXPECT_TRUE(same_bits(arena(a, a.param_data(), a.param_count()),
                        arena(b, b.param_data(), b.param_count())));
  EXPECT_TRUE(same_bits(arena(a, a.momentum_data(), a.param_count()),
                        arena(b, b.momentum_data(), b.param_count())));
  EXPECT_TRUE(same_bits(arena(a, a.buffer_data(), a.buffer_count()),
                        arena(b, b.buffer_data(), b.buffer_count())));
  EXPECT_EQ(b.batches_tracked(), a.batches_tracked());

  const CheckpointMeta want = sample_meta();
  EXPECT_EQ(got.model, "resnet20");
  EXPECT_EQ(got.height, 32);
  EXPECT_EQ(got.width, 32);
  EXPECT_EQ(got.channels, 3);
  EXPECT_EQ(got.num_classes, 10);
  EXPECT_EQ(got.epoch, want.epoch);
  EXPECT_EQ(got.epoch_step, want.epoch_step);
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.seed, want.seed);
  EXPECT_EQ(got.world_size, want.world_size);
  EXPECT_EQ(got.global_batch, want.global_batch);
  EXPECT_EQ(got.rng_state, want.rng_state);
  EXPECT_EQ(got.options, want.options);
  EXPECT_EQ(got.data, want.data);
  EXPECT_EQ(got.batch_size, want.batch_size);
  EXPECT_EQ(got.accum_steps, want.accum_steps);
  EXPECT_EQ(got.lr, want.lr);  // exact: a float64 attribute
  EXPECT_EQ(got.lr_schedule, want.lr_schedule);
  EXPECT_EQ(got.warmup_epochs, want.warmup_epochs);
  EXPECT_EQ(got.schedule_steps, want.schedule_steps);
  EXPECT_EQ(got.unverified, "");

  const CheckpointMeta meta_only = read_checkpoint_meta(path);
  EXPECT_EQ(meta_only.step, want.step);
  EXPECT_EQ(meta_only.model, "resnet20");
}

// Read back with the plain HDF5 C API: names and shapes are PyTorch's state_dict.
TEST_F(CheckpointTest, LayoutIsPyTorchStateDict) {
  const std::string path = dir_.file("b.h5");
  save_checkpoint(path, *model_, sample_meta());

  std::vector<int64_t> dims;
  const std::vector<float> w = test::h5_read_floats(path, "/params/layer1.0.conv1.weight", &dims);
  EXPECT_EQ(dims, (std::vector<int64_t>{16, 16, 3, 3}));
  EXPECT_TRUE(same_bits(w, model_->get_param("layer1.0.conv1.weight")));
  test::h5_read_floats(path, "/params/fc.weight", &dims);
  EXPECT_EQ(dims, (std::vector<int64_t>{10, 64}));
  test::h5_read_floats(path, "/params/layer2.0.downsample.0.weight", &dims);
  EXPECT_EQ(dims, (std::vector<int64_t>{32, 16, 1, 1}));
  const std::vector<float> rv = test::h5_read_floats(path, "/buffers/bn1.running_var", &dims);
  EXPECT_EQ(dims, (std::vector<int64_t>{16}));
  EXPECT_TRUE(same_bits(rv, model_->get_param("bn1.running_var")));

  // Every model parameter is there exactly once, momentum under the same names.
  std::vector<std::string> want;
  for (const ArenaEntry& e : model_->params()) want.push_back(e.name);
  std::sort(want.begin(), want.end());
  std::vector<std::string> params = test::h5_list(path, "params");
  std::vector<std::string> optim = test::h5_list(path, "optimizer");
  std::sort(params.begin(), params.end());
  std::sort(optim.begin(), optim.end());
  EXPECT_EQ(params, want);
  EXPECT_EQ(optim, want);
  EXPECT_EQ(want.size(), 65u);  // resnet20: 19 conv + 2 downsample conv, 21 BN x 2, fc x 2

  // Buffers: running_mean, running_var and an int64 scalar num_batches_tracked per BatchNorm.
  const std::vector<std::string> buffers = test::h5_list(path, "buffers");
  EXPECT_EQ(buffers.size(), 21u * 3);
  EXPECT_EQ(read_i64_scalar(path, "/buffers/layer3.2.bn2.num_batches_tracked"),
            model_->batches_tracked());
  EXPECT_EQ(read_i64_scalar(path, "/buffers/layer2.0.downsample.1.num_batches_tracked"),
            model_->batches_tracked());
}

TEST_F(CheckpointTest, NonFiniteParametersAreNeverWritten) {
  const std::string path = dir_.file("nan.h5");
  std::vector<float> w = model_->get_param("layer2.1.conv2.weight");
  w[5] = std::numeric_limits<float>::quiet_NaN();
  model_->set_param("layer2.1.conv2.weight", w);
  const std::string msg = test::error_of([&] { save_checkpoint(path, *model_, sample_meta()); });
  EXPECT_NE(msg.find("layer2.1.conv2.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("NaN or Inf"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  // An existing good checkpoint under the same name is left as it was.
  auto good = make_model("resnet20", *backend_, Shape{32, 32, 3}, 10);
  scramble(*good, 5);
  save_checkpoint(path, *good, sample_meta());
  const auto before = fs::file_size(path);
  w[5] = std::numeric_limits<float>::infinity();
  model_->set_param("layer2.1.conv2.weight", w);
  EXPECT_THROW(save_checkpoint(path, *model_, sample_meta()), Error);
  EXPECT_EQ(fs::file_size(path), before);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  auto check = make_model("resnet20", *backend_, Shape{32, 32, 3}, 10);
  load_checkpoint(path, *check);
  EXPECT_TRUE(same_bits(check->get_param("fc.weight"), good->get_param("fc.weight")));
}

TEST_F(CheckpointTest, WrongModelGivesClearError) {
  auto lenet = make_model("lenet", *backend_, Shape{28, 28, 1}, 10);
  scramble(*lenet, 3);
  const std::string path = dir_.file("lenet.h5");
  save_checkpoint(path, *lenet, sample_meta());
  const std::vector<float> before = model_->get_param("fc.weight");
  const std::string msg = test::error_of([&] { load_checkpoint(path, *model_); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("lenet"), std::string::npos) << msg;
  EXPECT_NE(msg.find("resnet20"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_TRUE(same_bits(model_->get_param("fc.weight"), before));  // untouched

  // Same model, other number of classes: the shapes differ, and the error says so.
  auto wide = make_model("resnet20", *backend_, Shape{32, 32, 3}, 100);
  const std::string msg2 = test::error_of([&] { load_checkpoint(dir_.file("lenet.h5"), *wide); });
  EXPECT_NE(msg2.find("lenet"), std::string::npos) << msg2;

  save_checkpoint(dir_.file("r10.h5"), *model_, sample_meta());
  const std::string msg3 = test::error_of([&] { load_checkpoint(dir_.file("r10.h5"), *wide); });
  EXPECT_NE(msg3.find("100 classes"), std::string::npos) << msg3;
}

// A copy of `path` without its user block (the header), as h5unjam or a rewrite by h5py
// leaves it: libhdf5 finds the superblock at offset 0 and reads it the same.
std::string strip_header(const std::string& path, const std::string& out) {
  std::string bytes = test::read_bytes(path);
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t plist = H5Fget_create_plist(f);
  hsize_t userblock = 0;
  H5Pget_userblock(plist, &userblock);
  H5Pclose(plist);
  H5Fclose(f);
  EXPECT_GT(userblock, 0u);
  test::write_bytes(out, bytes.substr(static_cast<size_t>(userblock)));
  return out;
}

TEST_F(CheckpointTest, MissingTensorIsNamed) {
  const std::string path = strip_header(
      [&] {
        save_checkpoint(dir_.file("c.h5"), *model_, sample_meta());
        return dir_.file("c.h5");
      }(),
      dir_.file("plain.h5"));
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(H5Ldelete(f, "/optimizer/layer1.1.bn1.bias", H5P_DEFAULT), 0);
  H5Fclose(f);
  const std::string msg = test::error_of([&] { load_checkpoint(path, *model_); });
  EXPECT_NE(msg.find("/optimizer/layer1.1.bn1.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
}

// Edited in place (h5py "r+"): the bytes no longer match the header, so it is refused, with
// the tensors intact and the metadata named.
TEST_F(CheckpointTest, EditedInPlaceIsRefused) {
  const std::string path = dir_.file("edit.h5");
  save_checkpoint(path, *model_, sample_meta());
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(H5Ldelete(f, "/optimizer/layer1.1.bn1.bias", H5P_DEFAULT), 0);
  H5Fclose(f);
  const std::vector<float> before = model_->get_param("fc.weight");
  EXPECT_THROW(load_checkpoint(path, *model_), CheckpointDamaged);
  const std::string msg = test::error_of([&] { read_checkpoint_meta(path); });
  EXPECT_NE(msg.find("HDF5 metadata"), std::string::npos) << msg;
  EXPECT_TRUE(same_bits(model_->get_param("fc.weight"), before));
}

TEST_F(CheckpointTest, CorruptOrForeignFilesGiveClearErrors) {
  const std::string good = dir_.file("good.h5");
  save_checkpoint(good, *model_, sample_meta());
  const auto size = fs::file_size(good);

  // Truncated: as if the copy to another machine stopped half way.
  const std::string cut = dir_.file("cut.h5");
  fs::copy_file(good, cut);
  fs::resize_file(cut, size / 2);
  std::string msg = test::error_of([&] { load_checkpoint(cut, *model_); });
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;
  EXPECT_NE(msg.find("is truncated: " + std::to_string(size / 2) + " of " + std::to_string(size) +
                     " bytes"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  EXPECT_THROW(load_checkpoint(cut, *model_), CheckpointDamaged);

  // Not HDF5 at all.
  const std::string text = dir_.file("text.h5");
  std::ofstream(text) << "hello\n";
  msg = test::error_of([&] { load_checkpoint(text, *model_); });
  EXPECT_NE(msg.find("neither a ddpvision header nor the HDF5 signature"), std::string::npos)
      << msg;
  EXPECT_THROW(load_checkpoint(text, *model_), CheckpointDamaged);

  // HDF5, but not a checkpoint (e.g. the image store passed by mistake): the user's error.
  const std::string other = dir_.file("other.h5");
  hid_t f = H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Fclose(f);
  msg = test::error_of([&] { read_checkpoint_meta(other); });
  EXPECT_NE(msg.find("not a ddpvision checkpoint"), std::string::npos) << msg;
  try {
    read_checkpoint_meta(other);
  } catch (const CheckpointDamaged&) {
    ADD_FAILURE() << "a foreign HDF5 file is not damage";
  } catch (const Error&) {
  }

  msg = test::error_of([&] { load_checkpoint(dir_.file("absent.h5"), *model_); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

TEST(CheckpointDir, FileNamesLatestAndPrune) {
  auto backend = cpu_backend();
  auto model = make_model("lenet", *backend, Shape{28, 28, 1}, 10);
  scramble(*model, 9);
  TempDir dir;
  const std::string d = dir.path().string();
  EXPECT_EQ(checkpoint_file_name(3, 1200), "ckpt-e0003-s00001200.h5");
  EXPECT_EQ(find_latest(d), "");
  EXPECT_EQ(find_latest(d + "/no-such-dir"), "");

  std::vector<std::string> names;
  for (int e = 1; e <= 4; ++e) {
    names.push_back(checkpoint_file_name(e, e * 100));
    CheckpointMeta meta;
    meta.epoch = e;
    meta.step = e * 100;
    save_checkpoint(dir.file(names.back()), *model, meta);
    update_latest(d, names.back());
    EXPECT_EQ(find_latest(d), dir.file(names.back()));
  }
  EXPECT_FALSE(fs::exists(dir.file("latest.tmp")));
  EXPECT_EQ(read_checkpoint_meta(find_latest(d)).epoch, 4);
  std::ofstream(dir.file("notes.txt")) << "not a checkpoint\n";

  // `latest` points back at epoch 2 (a resumed run): that file survives pruning too.
  update_latest(d, names[1]);
  prune_checkpoints(d, 2);
  EXPECT_FALSE(fs::exists(dir.file(names[0])));
  EXPECT_TRUE(fs::exists(dir.file(names[1])));
  EXPECT_TRUE(fs::exists(dir.file(names[2])));
  EXPECT_TRUE(fs::exists(dir.file(names[3])));
  EXPECT_TRUE(fs::exists(dir.file("notes.txt")));
  update_latest(d, names[3]);
  prune_checkpoints(d, 1);
  EXPECT_FALSE(fs::exists(dir.file(names[1])));
  EXPECT_FALSE(fs::exists(dir.file(names[2])));
  EXPECT_TRUE(fs::exists(dir.file(names[3])));
  prune_checkpoints(d, 0);  // keeps all
  EXPECT_TRUE(fs::exists(dir.file(names[3])));

  // A dangling `latest` is an error that says what to do.
  fs::remove(dir.file(names[3]));
  const std::string msg = test::error_of([&] { find_latest(d); });
  EXPECT_NE(msg.find(names[3]), std::string::npos) << msg;
  EXPECT_NE(msg.find("--resume"), std::string::npos) << msg;

  // LeNet has no BatchNorm: batches_tracked still round-trips (root attribute).
  const std::string p = dir.file("lenet.h5");
  save_checkpoint(p, *model, CheckpointMeta{});
  auto again = make_model("lenet", *backend, Shape{28, 28, 1}, 10);
  load_checkpoint(p, *again);
  EXPECT_EQ(again->batches_tracked(), model->batches_tracked());
  EXPECT_TRUE(same_bits(again->get_param("fc2.bias"), model->get_param("fc2.bias")));
}

// Note [Walk back]: `latest` first, then older files newest first; all files when `latest` is
// missing, empty or dangling, saying which.
TEST(CheckpointDir, ResumeCandidates) {
  TempDir dir;
  const std::string d = dir.path().string();
  std::string why = "stale";
  EXPECT_TRUE(resume_candidates(d, &why).empty());
  EXPECT_EQ(why, "");
  std::vector<std::string> names;
  for (int e = 1; e <= 4; ++e) {
    names.push_back(checkpoint_file_name(e, e * 10));
    std::ofstream(dir.file(names.back())) << "x";
  }
  std::ofstream(dir.file("ckpt-e0009-s00000090.h5.tmp")) << "x";  // never a candidate
  auto full = [&](std::initializer_list<int> idx) {
    std::vector<std::string> out;
    for (int i : idx) out.push_back(dir.file(names[static_cast<size_t>(i)]));
    return out;
  };
  EXPECT_EQ(resume_candidates(d, &why), full({3, 2, 1, 0}));
  EXPECT_NE(why.find("latest is missing"), std::string::npos) << why;
  update_latest(d, names[2]);  // a resumed run went back to epoch 3: epoch 4 is not a way back
  EXPECT_EQ(resume_candidates(d, &why), full({2, 1, 0}));
  EXPECT_EQ(why, "");
  std::ofstream(dir.file("latest"), std::ios::trunc) << "\n";
  EXPECT_EQ(resume_candidates(d, &why), full({3, 2, 1, 0}));
  EXPECT_NE(why.find("is empty"), std::string::npos) << why;
  update_latest(d, "ckpt-e0007-s00000070.h5");
  EXPECT_EQ(resume_candidates(d, &why), full({3, 2, 1, 0}));
  EXPECT_NE(why.find("which does not exist"), std::string::npos) << why;
}

TEST(CheckpointDir, StaleTemporariesAreRemoved) {
  TempDir dir;
  for (const char* n : {"ckpt-e0001-s00000010.h5.tmp", "latest.tmp", "ckpt-e0001-s00000010.h5",
                        "latest", "notes.tmp", "other.h5.tmp"})
    std::ofstream(dir.file(n)) << "x";
  EXPECT_EQ(remove_stale_temporaries(dir.path().string()),
            (std::vector<std::string>{"ckpt-e0001-s00000010.h5.tmp", "latest.tmp"}));
  for (const char* n : {"ckpt-e0001-s00000010.h5", "latest", "notes.tmp", "other.h5.tmp"})
    EXPECT_TRUE(fs::exists(dir.file(n))) << n;
  EXPECT_TRUE(remove_stale_temporaries(dir.file("absent")).empty());
}

// Note [Pruning]: a damaged file does not count among those kept, and a verdict is cached by
// size and mtime (so a run reads a file once).
TEST(CheckpointDir, PruneCountsOnlyCheckpointsThatVerify) {
  auto backend = cpu_backend();
  auto model = make_model("lenet", *backend, Shape{28, 28, 1}, 10);
  TempDir dir;
  const std::string d = dir.path().string();
  std::vector<std::string> names;
  for (int e = 1; e <= 5; ++e) {
    names.push_back(checkpoint_file_name(e, e * 10));
    save_checkpoint(dir.file(names.back()), *model, CheckpointMeta{});
  }
  update_latest(d, names[4]);
  auto flip = [&](const std::string& name) {
    std::fstream f(dir.file(name), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x5a');
  };
  flip(names[4]);  // the newest, bit rot after it was written
  flip(names[2]);
  VerifiedFiles cache;
  prune_checkpoints(d, 2, &cache);
  // Kept: e4 and e2 (the two newest that verify), and the damaged e5 and e3 newer than e2.
  EXPECT_TRUE(fs::exists(dir.file(names[4])));
  EXPECT_TRUE(fs::exists(dir.file(names[3])));
  EXPECT_TRUE(fs::exists(dir.file(names[2])));
  EXPECT_TRUE(fs::exists(dir.file(names[1])));
  EXPECT_FALSE(fs::exists(dir.file(names[0])));
  ASSERT_EQ(cache.size(), 4u);
  EXPECT_NE(cache.at(dir.file(names[4])).damage.find("is damaged"), std::string::npos);
  EXPECT_EQ(cache.at(dir.file(names[3])).damage, "");
  std::string why;
  EXPECT_FALSE(check_checkpoint_file(dir.file(names[2]), nullptr, &why));
  EXPECT_NE(why.find(names[2]), std::string::npos) << why;
  EXPECT_THROW(verify_checkpoint_file(dir.file(names[4]), &cache), CheckpointDamaged);

  // A cached verdict holds while size and mtime do: damage that keeps both is not seen again
  // in this run (the cost of reading each file once), a rewrite is.
  const auto mtime = fs::last_write_time(dir.file(names[3]));
  flip(names[3]);
  fs::last_write_time(dir.file(names[3]), mtime);
  bool cached = false;
  EXPECT_TRUE(check_checkpoint_file(dir.file(names[3]), &cache, &why, &cached));
  EXPECT_TRUE(cached);
  fs::last_write_time(dir.file(names[3]), mtime + std::chrono::seconds(1));
  EXPECT_FALSE(check_checkpoint_file(dir.file(names[3]), &cache, &why, &cached));
  EXPECT_FALSE(cached);
}

TEST(CheckpointDir, UnwritableDirectoryLeavesNothing) {
  auto backend = cpu_backend();
  auto model = make_model("lenet", *backend, Shape{28, 28, 1}, 10);
  TempDir dir;
  const std::string path = dir.file("missing-subdir/x.h5");
  const std::string msg = test::error_of([&] { save_checkpoint(path, *model, CheckpointMeta{}); });
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path + ".tmp"));
}

}  // namespace
}  // namespace ddpv
