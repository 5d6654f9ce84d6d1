// Checkpoint integrity: CRC32C against published vectors, the header read back independently
// of the writer, damage refused and named (flipped tensor bytes, metadata, header, truncation),
// 100 seeded random corruptions all refused, files without a header, a full disk.
#include <hdf5.h>
#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <sstream>

#include "ddpv/core/crc32c.hpp"
#include "ddpv/core/rng.hpp"
#include "ddpv/nn/model.hpp"
#include "ddpv/train/checkpoint.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

using test::read_bytes;
using test::write_bytes;
const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// The kind of exception f throws: "damaged", "error" or "none".
template <typename F>
std::string verdict_of(F&& f) {
  try {
    f();
  } catch (const CheckpointDamaged&) {
    return "damaged";
  } catch (const Error&) {
    return "error";
  }
  return "none";
}

TEST(Crc32c, KnownVectors) {
  // "123456789" is the check value of every CRC catalogue; the 32-byte vectors are RFC 3720's
  // (iSCSI) appendix B.4.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::vector<uint8_t> v(32, 0);
  EXPECT_EQ(crc32c(v.data(), 32), 0x8A9136AAu);
  std::fill(v.begin(), v.end(), 0xFF);
  EXPECT_EQ(crc32c(v.data(), 32), 0x62A8AB43u);
  for (int i = 0; i < 32; ++i) v[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c(v.data(), 32), 0x46DD794Eu);
  for (int i = 0; i < 32; ++i) v[static_cast<size_t>(i)] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c(v.data(), 32), 0x113FDB5Cu);
  EXPECT_EQ(crc32c_portable("123456789", 9), 0xE3069283u);
}

TEST(Crc32c, HardwareAndTableAgreeAtEveryLengthAndAlignment) {
  std::vector<uint8_t> buf(4096 + 16);
  Rng rng(7);
  for (auto& b : buf) b = static_cast<uint8_t>(rng.next_u64());
  for (size_t start = 0; start < 9; ++start)
    for (size_t n : {0, 1, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1000, 4096})
      ASSERT_EQ(crc32c(buf.data() + start, n), crc32c_portable(buf.data() + start, n))
          << "start " << start << " length " << n;
  // Continuing a CRC over a split buffer gives the CRC of the whole.
  for (size_t k : {0, 1, 13, 2048, 4096})
    EXPECT_EQ(crc32c(buf.data() + k, 4096 - k, crc32c(buf.data(), k)), crc32c(buf.data(), 4096));
  std::printf("crc32c: %s\n", crc32c_hardware() ? "SSE4.2 instruction" : "table");
}

std::unique_ptr<Backend> cpu_backend() {
  BackendOptions o;
  o.device = Device::kCpu;
  o.threads = 1;
  return make_backend(o);
}

// The header's lines, read with plain string handling (not the writer's code).
struct Header {
  std::map<std::string, std::string> fields;
  struct Tensor {
    uint32_t crc;
    uint64_t offset, bytes;
    std::string name;
  };
  std::vector<Tensor> tensors;
  size_t text_end = 0;  // just past the '\n' before "header-crc32c"
  uint32_t header_crc = 0;
};

Header parse_header(const std::string& file) {
  Header h;
  std::istringstream in(file.substr(0, file.find('\0')));
  std::string line;
  size_t pos = 0;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "header-crc32c") {
      h.text_end = pos;
      std::string hex;
      ls >> hex;
      h.header_crc = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));
      break;
    }
    if (key.size() == 8 && key.find_first_not_of("0123456789abcdef") == std::string::npos) {
      Header::Tensor t;
      t.crc = static_cast<uint32_t>(std::stoul(key, nullptr, 16));
      ls >> t.offset >> t.bytes >> t.name;
      h.tensors.push_back(t);
    } else if (key != "#") {
      std::string value;
      ls >> value;
      h.fields[key] = value;
    }
    pos += line.size() + 1;
  }
  return h;
}

class VerifyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = cpu_backend();
    model_ = make_model("resnet20", *backend_, Shape{32, 32, 3}, 10);
    model_->init_parameters(3);
    path_ = dir_.file("ckpt.h5");
    CheckpointMeta meta;
    meta.step = 11;
    save_checkpoint(path_, *model_, meta);
    bytes_ = read_bytes(path_);
    header_ = parse_header(bytes_);
    userblock_ = std::stoull(header_.fields.at("userblock"));
  }
  // A fresh model whose parameters differ from the checkpoint's.
  std::unique_ptr<Model> other_model() {
    auto m = make_model("resnet20", *backend_, Shape{32, 32, 3}, 10);
    m->init_parameters(99);
    return m;
  }
  const Header::Tensor& tensor(const std::string& name) {
    for (const Header::Tensor& t : header_.tensors)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  TempDir dir_;
  std::string path_, bytes_;
  Header header_;
  uint64_t userblock_ = 0;
};

// The header says what the bytes are: recomputed here from the file and from libhdf5.
TEST_F(VerifyTest, HeaderDescribesTheFile) {
  ASSERT_EQ(bytes_.rfind("ddpvision-checkpoint 2\n", 0), 0u);
  EXPECT_EQ(std::stoull(header_.fields.at("file-bytes")), bytes_.size());
  EXPECT_GE(userblock_, 512u);
  EXPECT_EQ(userblock_ & (userblock_ - 1), 0u);  // a power of two, as HDF5 requires
  EXPECT_EQ(crc32c_portable(bytes_.data(), header_.text_end), header_.header_crc);
  EXPECT_EQ(std::stoul(header_.fields.at("payload-crc32c"), nullptr, 16),
            crc32c_portable(bytes_.data() + userblock_, bytes_.size() - userblock_));
  // resnet20: 65 parameters, 65 momentum tensors, 63 buffers.
  ASSERT_EQ(header_.tensors.size(), 65u + 65u + 63u);
  EXPECT_EQ(std::stoull(header_.fields.at("tensors")), header_.tensors.size());

  hid_t f = H5Fopen(path_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  for (const Header::Tensor& t : header_.tensors) {
    hid_t d = H5Dopen2(f, t.name.c_str(), H5P_DEFAULT);
    ASSERT_GE(d, 0) << t.name;
    EXPECT_EQ(H5Dget_offset(d), t.offset) << t.name;
    EXPECT_EQ(H5Dget_storage_size(d), t.bytes) << t.name;
    uint32_t attr = 0;
    hid_t a = H5Aopen(d, "crc32c", H5P_DEFAULT);
    H5Aread(a, H5T_NATIVE_UINT32, &attr);
    H5Aclose(a);
    EXPECT_EQ(attr, t.crc) << t.name;
    EXPECT_EQ(crc32c_portable(bytes_.data() + t.offset, t.bytes), t.crc) << t.name;
    H5Dclose(d);
  }
  H5Fclose(f);
}

TEST_F(VerifyTest, FlippedTensorBytesAreRefusedNamingTheTensor) {
  const Header::Tensor& t = tensor("/params/layer2.0.conv1.weight");
  std::string bad = bytes_;
  for (size_t i = 0; i < 100; ++i) bad[t.offset + 40 + i] ^= static_cast<char>(0xFF);
  write_bytes(dir_.file("flip.h5"), bad);
  auto m = other_model();
  const std::vector<float> before = m->get_param("fc.weight");
  const std::string msg = test::error_of([&] { load_checkpoint(dir_.file("flip.h5"), *m); });
  EXPECT_NE(msg.find("tensor /params/layer2.0.conv1.weight fails its checksum"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find(dir_.file("flip.h5")), std::string::npos) << msg;
  EXPECT_EQ(msg.find("more tensors"), std::string::npos) << msg;
  EXPECT_EQ(m->get_param("fc.weight"), before);  // untouched
  EXPECT_EQ(verdict_of([&] { read_checkpoint_meta(dir_.file("flip.h5")); }), "damaged");

  // Two tensors: the first is named, the count of the others given.
  const Header::Tensor& u = tensor("/optimizer/fc.bias");
  bad[u.offset] ^= 1;
  const std::string msg2 =
      test::error_of([&] { verify_checkpoint_bytes(u8(bad), bad.size(), "x"); });
  EXPECT_NE(msg2.find("(and 1 more tensors)"), std::string::npos) << msg2;
}

TEST_F(VerifyTest, DamageOutsideTheTensorsIsNamedAsSuch) {
  // The HDF5 superblock is the first thing after the user block.
  std::string bad = bytes_;
  bad[userblock_ + 20] ^= 0x10;
  std::string msg = test::error_of([&] { verify_checkpoint_bytes(u8(bad), bad.size(), "f.h5"); });
  EXPECT_NE(msg.find("checkpoint f.h5 is damaged: its HDF5 metadata"), std::string::npos) << msg;

  bad = bytes_;
  bad[30] ^= 0x01;  // inside the header text
  msg = test::error_of([&] { verify_checkpoint_bytes(u8(bad), bad.size(), "f.h5"); });
  EXPECT_NE(msg.find("its header fails its checksum"), std::string::npos) << msg;

  bad = bytes_;
  bad[userblock_ - 1] = 'x';  // the zero padding of the user block
  msg = test::error_of([&] { verify_checkpoint_bytes(u8(bad), bad.size(), "f.h5"); });
  EXPECT_NE(msg.find("user block has bytes after the header"), std::string::npos) << msg;

  bad = bytes_ + "appended";
  msg = test::error_of([&] { verify_checkpoint_bytes(u8(bad), bad.size(), "f.h5"); });
  EXPECT_NE(msg.find("bytes appended"), std::string::npos) << msg;

  msg = test::error_of([&] { verify_checkpoint_bytes(u8(bytes_), 100, "f.h5"); });
  EXPECT_NE(msg.find("is truncated"), std::string::npos) << msg;
}

// A header of a newer format (valid CRC) is the user's to fix with a newer build, not damage.
TEST_F(VerifyTest, NewerFormatIsAnErrorNotDamage) {
  std::string newer = bytes_;
  newer[std::strlen("ddpvision-checkpoint ")] = '3';
  const size_t at = newer.find("\nheader-crc32c ");
  char hex[9];
  std::snprintf(hex, sizeof hex, "%08x", crc32c_portable(newer.data(), at + 1));
  newer.replace(at + 15, 8, hex);
  EXPECT_EQ(verdict_of([&] { verify_checkpoint_bytes(u8(newer), newer.size(), "n.h5"); }), "error");
  const std::string msg =
      test::error_of([&] { verify_checkpoint_bytes(u8(newer), newer.size(), "n.h5"); });
  EXPECT_NE(msg.find("format_version 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("newer ddpvision"), std::string::npos) << msg;
}

// Note [Verify before parse]: the target of issue 42, 100 of 100 seeded random corruptions
// refused as damage, never loaded: bytes flipped anywhere (uniformly over the file, and in
// the header and the HDF5 metadata, which a uniform draw rarely hits), and truncations at
// random lengths.
TEST_F(VerifyTest, HundredRandomCorruptionsAreAllRefused) {
  Rng rng(0xC0FFEE);
  auto below = [&](uint64_t n) { return static_cast<size_t>(rng.next_u64() % n); };
  // Payload bytes outside every tensor: HDF5's own structures.
  std::vector<bool> in_tensor(bytes_.size(), false);
  for (const Header::Tensor& t : header_.tensors)
    std::fill(in_tensor.begin() + static_cast<long>(t.offset),
              in_tensor.begin() + static_cast<long>(t.offset + t.bytes), true);
  std::vector<size_t> metadata;
  for (size_t i = userblock_; i < bytes_.size(); ++i)
    if (!in_tensor[i]) metadata.push_back(i);
  ASSERT_GT(metadata.size(), 1000u);

  auto m = other_model();
  const std::vector<float> before = m->get_param("layer3.2.conv2.weight");
  int refused = 0;
  const char* kinds[] = {"truncated", "one byte anywhere", "up to 16 bytes anywhere", "header byte",
                         "HDF5 metadata byte"};
  for (int i = 0; i < 100; ++i) {
    std::string bad = bytes_;
    const int kind = i % 5;
    auto flip = [&](size_t pos) { bad[pos] ^= static_cast<char>(1 + below(255)); };
    if (kind == 0) {
      bad.resize(below(bytes_.size()));
    } else if (kind == 1) {
      flip(below(bad.size()));
    } else if (kind == 2) {
      for (size_t k = 0, n = 1 + below(16); k < n; ++k) flip(below(bad.size()));
    } else if (kind == 3) {
      flip(below(userblock_));
    } else {
      flip(metadata[below(metadata.size())]);
    }
    const std::string v = verdict_of([&] { verify_checkpoint_bytes(u8(bad), bad.size(), "r"); });
    const std::string l = verdict_of([&] { load_checkpoint_bytes(u8(bad), bad.size(), "r", *m); });
    EXPECT_EQ(v, "damaged") << "corruption " << i << " (" << kinds[kind] << ")";
    EXPECT_EQ(l, "damaged") << "corruption " << i << " (" << kinds[kind] << ")";
    refused += v == "damaged" && l == "damaged";
  }
  EXPECT_EQ(refused, 100);
  EXPECT_EQ(m->get_param("layer3.2.conv2.weight"), before);  // no corrupt file reached the model
  // And the untouched bytes load.
  EXPECT_EQ(verdict_of([&] { load_checkpoint_bytes(u8(bytes_), bytes_.size(), "ok", *m); }),
            "none");
}

// Without the header (format 1, or the HDF5 part alone, as h5unjam or a copy by h5py leaves
// it): the per-tensor crc32c attributes are checked; without them it loads, said unverified.
TEST_F(VerifyTest, FilesWithoutHeaderUseTheAttributes) {
  const std::string plain = bytes_.substr(userblock_);
  auto m = other_model();
  CheckpointMeta got = load_checkpoint_bytes(u8(plain), plain.size(), "plain.h5", *m);
  EXPECT_EQ(got.step, 11);
  EXPECT_EQ(got.unverified, "");
  EXPECT_EQ(m->get_param("fc.weight"), model_->get_param("fc.weight"));
  EXPECT_EQ(verify_checkpoint_bytes(u8(plain), plain.size(), "plain.h5").unverified, "");

  std::string bad = plain;
  bad[tensor("/buffers/bn1.running_var").offset - userblock_ + 5] ^= 0x40;
  std::string msg =
      test::error_of([&] { verify_checkpoint_bytes(u8(bad), bad.size(), "plain.h5"); });
  EXPECT_NE(msg.find("tensor /buffers/bn1.running_var fails its crc32c attribute"),
            std::string::npos)
      << msg;
  EXPECT_EQ(verdict_of([&] { load_checkpoint_bytes(u8(bad), bad.size(), "p", *m); }), "damaged");

  // No attributes at all: as a format 1 file.
  const std::string v1 = dir_.file("v1.h5");
  write_bytes(v1, plain);
  hid_t f = H5Fopen(v1.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  for (const Header::Tensor& t : header_.tensors)
    ASSERT_GE(H5Adelete_by_name(f, t.name.c_str(), "crc32c", H5P_DEFAULT), 0) << t.name;
  H5Fclose(f);
  got = load_checkpoint(v1, *m);
  EXPECT_NE(got.unverified.find("no checksums"), std::string::npos) << got.unverified;
}

// A full disk (here: a file-size limit, EFBIG) is one error naming the file; no `.tmp` is left
// and the checkpoint already under that name is intact.
TEST_F(VerifyTest, FailedWriteLeavesTheOldFile) {
  struct rlimit old {};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto* previous = std::signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = old;
  small.rlim_cur = 100000;  // the checkpoint is 2.2 MB
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  auto m = other_model();
  const std::string msg = test::error_of([&] { save_checkpoint(path_, *m, CheckpointMeta{}); });
  setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(msg.find(path_ + ".tmp"), std::string::npos) << msg;
  EXPECT_NE(msg.find("failed after"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(path_ + ".tmp"));
  EXPECT_EQ(read_bytes(path_), bytes_);
}

}  // namespace
}  // namespace ddpv
