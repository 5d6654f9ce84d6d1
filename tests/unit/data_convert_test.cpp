// ddpv-convert end to end on generated IDX, CIFAR and image-folder inputs, and on bad inputs.
#include <zlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "data/image_codec.hpp"
#include "ddpv/data/image_store.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {
namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

std::string convert_binary() {
  if (const char* dir = std::getenv("DDPV_BIN_DIR")) return std::string(dir) + "/ddpv-convert";
  return (fs::read_symlink("/proc/self/exe").parent_path() / "ddpv-convert").string();
}

struct Result {
  int code;
  std::string out, err;
};

Result run(const test::TempDir& dir, const std::string& args) {
  const std::string o = dir.file("stdout.txt"), e = dir.file("stderr.txt");
  const int status = std::system((convert_binary() + " " + args + " >" + o + " 2>" + e).c_str());
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(o), slurp(e)};
}

void write(const std::string& path, const Bytes& b) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}
void write_gz(const std::string& path, const Bytes& b) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, b.data(), static_cast<unsigned>(b.size()));
  gzclose(f);
}
Bytes read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

void put_be32(Bytes& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(v >> s));
}
Bytes idx_images(const Bytes& pixels, uint32_t n, uint32_t h, uint32_t w) {
  Bytes b{0, 0, 8, 3};
  put_be32(b, n), put_be32(b, h), put_be32(b, w);
  b.insert(b.end(), pixels.begin(), pixels.end());
  return b;
}
Bytes idx_labels(const Bytes& labels) {
  Bytes b{0, 0, 8, 1};
  put_be32(b, static_cast<uint32_t>(labels.size()));
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}
Bytes random_bytes(size_t n, uint32_t seed, int mod = 256) {
  std::mt19937 gen(seed);
  Bytes b(n);
  for (auto& v : b) v = static_cast<uint8_t>(gen() % mod);
  return b;
}

bool binary_missing() { return !fs::exists(convert_binary()); }
#define SKIP_WITHOUT_BINARY() \
  if (binary_missing()) GTEST_SKIP() << convert_binary() << " not built"

TEST(DataConvert, IdxGzipAndRawRoundTripExactly) {
  SKIP_WITHOUT_BINARY();
  test::TempDir dir;
  const Bytes train_px = random_bytes(37 * 5 * 6, 1), test_px = random_bytes(11 * 5 * 6, 2);
  const Bytes train_l = random_bytes(37, 3, 10), test_l = random_bytes(11, 4, 10);
  write_gz(dir.file("tri.gz"), idx_images(train_px, 37, 5, 6));
  write_gz(dir.file("trl.gz"), idx_labels(train_l));
  write(dir.file("tei"), idx_images(test_px, 11, 5, 6));
  write(dir.file("tel"), idx_labels(test_l));
  for (const std::string extra : {"", " --compress gzip:5 --checksum --chunk-images 8"}) {
    const std::string out = dir.file("m.h5");
    const Result r =
        run(dir, "idx --preset mnist --train-images " + dir.file("tri.gz") + " --train-labels " +
                     dir.file("trl.gz") + " --test-images " + dir.file("tei") + " --test-labels " +
                     dir.file("tel") + " --out " + out + extra);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_NE(r.out.find("train 37, test 11 images of 5x6x1, 10 classes"), std::string::npos)
        << r.out;
    EXPECT_FALSE(fs::exists(out + ".tmp"));
    ImageStore store(out);
    EXPECT_EQ(store.class_names()[7], "7");
    for (auto [split, px, labels] :
         {std::tuple{"train", &train_px, &train_l}, std::tuple{"test", &test_px, &test_l}}) {
      Bytes got(px->size());
      store.read_range(split, 0, store.split_size(split), got.data());
      EXPECT_EQ(got, *px) << split;
      ASSERT_EQ(store.labels(split).size(), labels->size());
      for (size_t i = 0; i < labels->size(); ++i) EXPECT_EQ(store.labels(split)[i], (*labels)[i]);
    }
    const Result inspect = run(dir, "inspect " + out + " --read-all");
    EXPECT_EQ(inspect.code, 0) << inspect.err;
    EXPECT_NE(inspect.out.find("OK:"), std::string::npos);
    if (std::system("command -v h5dump >/dev/null 2>&1") == 0) {
      ASSERT_EQ(std::system(("h5dump -H " + out + " >" + dir.file("dump.txt")).c_str()), 0);
      const std::string dump = [&] {
        std::ifstream in(dir.file("dump.txt"));
        std::stringstream s;
        s << in.rdbuf();
        return s.str();
      }();
      EXPECT_NE(dump.find("( 37, 5, 6, 1 )"), std::string::npos) << dump;
      EXPECT_NE(dump.find("ATTRIBUTE \"format_version\""), std::string::npos);
    }
    fs::remove(out);
  }
}

// CIFAR record: label byte(s), then R, G and B planes of 32x32.
TEST(DataConvert, CifarTenAndHundredRoundTripToHwc) {
  SKIP_WITHOUT_BINARY();
  test::TempDir dir;
  for (int variant : {10, 100}) {
    for (const std::string label : {"fine", "coarse"}) {
      if (variant == 10 && label == "coarse") continue;
      const int header = variant == 10 ? 1 : 2, n = 6;
      Bytes file;
      std::vector<int> labels;
      const Bytes planes = random_bytes(static_cast<size_t>(n) * 3072, 9);
      for (int i = 0; i < n; ++i) {
        const int coarse = (i * 7) % 20, fine = (i * 13) % 100;
        if (variant == 10) {
          file.push_back(static_cast<uint8_t>(i % 10));
          labels.push_back(i % 10);
        } else {
          file.push_back(static_cast<uint8_t>(coarse));
          file.push_back(static_cast<uint8_t>(fine));
          labels.push_back(label == "fine" ? fine : coarse);
        }
        file.insert(file.end(), planes.begin() + i * 3072, planes.begin() + (i + 1) * 3072);
      }
      write(dir.file("b1.bin"), Bytes(file.begin(), file.begin() + 4 * (header + 3072)));
      write(dir.file("b2.bin"), Bytes(file.begin() + 4 * (header + 3072), file.end()));
      write(dir.file("t.bin"), Bytes(file.begin(), file.begin() + (header + 3072)));
      const std::string out = dir.file("c.h5");
      const Result r = run(dir, "cifar --variant " + std::to_string(variant) + " --label " + label +
                                    " --train " + dir.file("b1.bin") + " " + dir.file("b2.bin") +
                                    " --test " + dir.file("t.bin") + " --out " + out);
      ASSERT_EQ(r.code, 0) << r.err;
      ImageStore store(out);
      EXPECT_EQ(store.num_classes(), variant == 10 ? 10 : (label == "fine" ? 100 : 20));
      if (variant == 10) {
        EXPECT_EQ(store.class_names()[0], "airplane");
      }
      ASSERT_EQ(store.split_size("train"), n);
      Bytes got(static_cast<size_t>(n) * 3072);
      store.read_range("train", 0, n, got.data());
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(store.labels("train")[static_cast<size_t>(i)], labels[static_cast<size_t>(i)]);
        for (int y = 0; y < 32; ++y)
          for (int x = 0; x < 32; ++x)
            for (int c = 0; c < 3; ++c)
              ASSERT_EQ(got[static_cast<size_t>(i * 3072 + (y * 32 + x) * 3 + c)],
                        planes[static_cast<size_t>(i * 3072 + c * 1024 + y * 32 + x)]);
      }
      fs::remove(out);
    }
  }
}

// root/cat: JPEGs of three sizes; root/dog: PNGs (one grayscale), each of one flat colour.
void make_folder(const std::string& root) {
  fs::create_directories(root + "/cat");
  fs::create_directories(root + "/dog");
  const int sizes[3][2] = {{40, 30}, {20, 50}, {32, 32}};
  for (int i = 0; i < 3; ++i) {
    const int h = sizes[i][0], w = sizes[i][1];
    codec::Image im{h, w, 3,
                    Bytes(static_cast<size_t>(h * w * 3), static_cast<uint8_t>(60 + i * 50))};
    write(root + "/cat/" + std::to_string(i) + ".jpg", codec::encode_jpeg(im));
    codec::Image pn{
        w, h, i == 2 ? 1 : 3,
        Bytes(static_cast<size_t>(h * w * (i == 2 ? 1 : 3)), static_cast<uint8_t>(10 + i * 100))};
    write(root + "/dog/" + std::to_string(i) + ".png", codec::encode_png(pn));
  }
  write(root + "/dog/notes.txt", Bytes{'h', 'i'});  // ignored: not an image name
}

TEST(DataConvert, FolderOfJpegAndPngResizesAndSplitsDeterministically) {
  SKIP_WITHOUT_BINARY();
  test::TempDir dir;
  make_folder(dir.file("root"));
  Bytes first;
  for (int rep = 0; rep < 2; ++rep) {
    const std::string out = dir.file("f" + std::to_string(rep) + ".h5");
    const Result r =
        run(dir, "folder --root " + dir.file("root") +
                     " --size 16x12 --val-fraction 0.34 --seed 4 --threads 2 --out " + out);
    ASSERT_EQ(r.code, 0) << r.err;
    ImageStore store(out);
    EXPECT_EQ(store.class_names(), (std::vector<std::string>{"cat", "dog"}));
    EXPECT_EQ(store.height(), 16);
    EXPECT_EQ(store.width(), 12);
    EXPECT_EQ(store.channels(), 3);
    ASSERT_EQ(store.split_size("train"), 4);
    ASSERT_EQ(store.split_size("val"), 2);
    EXPECT_EQ(store.labels("val"), (std::vector<int32_t>{0, 1}));
    Bytes all(6 * 16 * 12 * 3);
    store.read_range("train", 0, 4, all.data());
    store.read_range("val", 0, 2, all.data() + 4 * 576);
    if (rep == 0) {
      first = all;
    } else {
      EXPECT_EQ(all, first) << "same seed, same store";
    }
    // Flat images stay flat through resize; PNG colours are exact, JPEG ones close.
    const auto& lt = store.labels("train");
    for (int i = 0; i < 6; ++i) {
      const bool dog = i < 4 ? lt[static_cast<size_t>(i)] == 1 : i == 5;
      const uint8_t v = all[static_cast<size_t>(i * 576)];
      for (int k = 0; k < 576; ++k)
        ASSERT_NEAR(all[static_cast<size_t>(i * 576 + k)], v, dog ? 0 : 2);
      if (dog) {
        EXPECT_TRUE(v == 10 || v == 110 || v == 210) << int{v};
      }
    }
  }
}

// Runs a failing conversion and checks: exit code, one line on stderr naming the fault, and
// nothing at OUT or OUT.tmp.
void expect_failure(const test::TempDir& dir, const std::string& args, int code,
                    const std::string& what) {
  const std::string out = dir.file("bad.h5");
  const Result r = run(dir, args + " --out " + out);
  EXPECT_EQ(r.code, code) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(what), std::string::npos) << args << "\nstderr: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_FALSE(fs::exists(out)) << args;
  EXPECT_FALSE(fs::exists(out + ".tmp")) << args;
}

TEST(DataConvert, BadIdxAndCifarInputsFailWithOneLineAndWriteNothing) {
  SKIP_WITHOUT_BINARY();
  test::TempDir dir;
  const Bytes px = random_bytes(10 * 4 * 4, 1), lb = random_bytes(10, 2, 10);
  const Bytes good_images = idx_images(px, 10, 4, 4);
  write(dir.file("img"), good_images);
  write(dir.file("lab"), idx_labels(lb));
  write(dir.file("lab9"), idx_labels(Bytes(lb.begin(), lb.begin() + 9)));
  Bytes zip = good_images;
  zip[0] = 'P', zip[1] = 'K';
  write(dir.file("magic"), zip);
  write(dir.file("rank"), idx_labels(px));  // a labels file given as images
  write(dir.file("short"), Bytes(good_images.begin(), good_images.end() - 16));
  write_gz(dir.file("img.gz"), good_images);
  const Bytes gz = read(dir.file("img.gz"));
  write(dir.file("trunc.gz"), Bytes(gz.begin(), gz.end() - 12));
  Bytes bad_gz = gz;
  for (size_t i = 12; i < bad_gz.size() - 8; ++i) bad_gz[i] ^= 0x5a;
  write(dir.file("corrupt.gz"), bad_gz);
  std::ofstream(dir.file("three.txt")) << "a\nb\nc\n";
  const std::string labels = " --train-labels " + dir.file("lab");
  auto idx = [&](const std::string& images) {
    return "idx --train-images " + dir.file(images) + labels;
  };
  expect_failure(dir, idx("magic"), 1, "not an IDX file (bad magic");
  expect_failure(dir, idx("rank"), 1, "IDX file has 1 dimensions, expected 3");
  expect_failure(dir, idx("short"), 1, "the header declares 160 bytes of data");
  // Dims whose product wraps 2^64 to 0, the size of a file that is only its header: were the
  // product formed, the file would pass and the reader would run 2^31 images past its end.
  write(dir.file("wrap"), Bytes{0, 0, 8, 3, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 4});
  expect_failure(dir, idx("wrap"), 1, "declares dims 2147483648x2147483648x4, more bytes than 64 bits");
  expect_failure(dir, idx("trunc.gz"), 1, "truncated or corrupt gzip");
  expect_failure(dir, idx("corrupt.gz"), 1, "truncated or corrupt gzip");
  expect_failure(dir, idx("missing"), 1, "no such file");
  expect_failure(dir,
                 "idx --train-images " + dir.file("img") + " --train-labels " + dir.file("lab9"), 1,
                 "holds 10 images but");
  expect_failure(dir, idx("img") + " --class-names " + dir.file("three.txt"), 1, "outside [0, 3)");
  expect_failure(dir, idx("img") + " --bogus", 2, "unrecognised option '--bogus'");
  expect_failure(dir, idx("img") + " --compress lz4", 2, "--compress 'lz4'");
  expect_failure(dir, "idx --train-images " + dir.file("img"), 2, "train-labels");

  Bytes rec(2 * 3073, 7);
  write(dir.file("c.bin"), Bytes(rec.begin(), rec.end() - 5));
  expect_failure(dir, "cifar --train " + dir.file("c.bin"), 1,
                 "is not a multiple of the 3073-byte record");
  rec[3073] = 10;  // second record labelled 10 in CIFAR-10
  write(dir.file("c10.bin"), rec);
  expect_failure(dir, "cifar --train " + dir.file("c10.bin"), 1, "outside [0, 10)");

  // A failed conversion leaves an existing store alone.
  write(dir.file("bad.h5"), Bytes{'o', 'l', 'd'});
  const Result r = run(dir, idx("short") + " --out " + dir.file("bad.h5"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(read(dir.file("bad.h5")), (Bytes{'o', 'l', 'd'}));
}

TEST(DataConvert, CorruptOversizedImagesAreSkippedOrFatalAndEmptyClassesRejected) {
  SKIP_WITHOUT_BINARY();
  test::TempDir dir;
  const std::string root = dir.file("root");
  make_folder(root);
  const Bytes jpg = read(root + "/cat/0.jpg"), png = read(root + "/dog/0.png");
  write(root + "/cat/broken.jpg",
        Bytes(jpg.begin(), jpg.begin() + static_cast<long>(jpg.size() / 2)));
  write(root + "/dog/broken.png",
        Bytes(png.begin(), png.begin() + static_cast<long>(png.size() / 2)));
  const std::string base = "folder --root " + root + " --size 8 --val-fraction 0 ";
  const Result r = run(dir, base + "--out " + dir.file("ok.h5"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("skipped 2 files: 2 corrupt or unreadable images"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("broken.jpg"), std::string::npos) << r.err;
  EXPECT_EQ(ImageStore(dir.file("ok.h5")).split_size("train"), 6);
  expect_failure(dir, base + "--strict", 1, "broken.jpg: corrupt JPEG");
  // The two 40x30 images (1200 pixels) exceed a cap of 1100: skipped, or fatal with --strict.
  const Result capped = run(dir, base + "--max-pixels 1100 --out " + dir.file("cap.h5"));
  ASSERT_EQ(capped.code, 0) << capped.err;
  EXPECT_NE(capped.err.find("over the cap of 1100"), std::string::npos) << capped.err;
  EXPECT_EQ(ImageStore(dir.file("cap.h5")).split_size("train"), 4);
  expect_failure(dir, base + "--max-pixels 1100 --strict", 1, "over the cap of 1100");
  fs::create_directories(root + "/empty");
  expect_failure(dir, base, 1, "empty class folder");
  expect_failure(dir, "folder --root " + dir.file("nope") + " --size 8", 1, "not a directory");
  expect_failure(dir, "folder --root " + root + " --size 0x8", 2, "--size '0x8'");
}

}  // namespace
}  // namespace ddpv
