// ImageStore and StoreWriter: round trips, statistics, atomic writes, foreign files, bad stores.
#include <hdf5.h>
#include <sys/resource.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <random>

#include "ddpv/h5/h5.hpp"
#include "ddpv/data/image_store.hpp"
#include "ddpv/data/store_writer.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

struct Data {
  int h = 5, w = 4, c = 3;
  std::vector<uint8_t> images;
  std::vector<int32_t> labels;
};

Data random_data(int64_t n, int classes, uint64_t seed, int h = 5, int w = 4, int c = 3) {
  Data d{h, w, c, {}, {}};
  std::mt19937 gen(static_cast<uint32_t>(seed));
  d.images.resize(static_cast<size_t>(n * h * w * c));
  for (auto& v : d.images) v = static_cast<uint8_t>(gen() & 0xff);
  for (int64_t i = 0; i < n; ++i) d.labels.push_back(static_cast<int32_t>(gen() % classes));
  return d;
}

std::vector<std::string> class_names(int k) {
  std::vector<std::string> names;
  for (int i = 0; i < k; ++i) names.push_back("class" + std::to_string(i));
  return names;
}

// Writes train (appended in uneven pieces) and test splits through StoreWriter.
void write_store(const std::string& path, const Data& train, const Data& test, int classes,
                 StoreWriterOptions opt = {}) {
  StoreWriter w(path, train.h, train.w, train.c, class_names(classes), "unit test", opt);
  w.begin_split("train");
  const int64_t n = static_cast<int64_t>(train.labels.size()), img = train.h * train.w * train.c;
  for (int64_t b = 0; b < n;) {
    const int64_t m = std::min<int64_t>(n - b, 7 + b % 5);
    w.append(train.images.data() + b * img, train.labels.data() + b, m);
    b += m;
  }
  w.begin_split("test");
  w.append(test.images.data(), test.labels.data(), static_cast<int64_t>(test.labels.size()));
  w.commit();
}

TEST(DataStore, RoundTripReadRowsAnyOrderWithDuplicates) {
  test::TempDir dir;
  const Data train = random_data(103, 7, 1), test = random_data(20, 7, 2);
  const std::string path = dir.file("s.h5");
  write_store(path, train, test, 7, {.chunk_images = 8, .gzip_level = 3, .checksum = true});
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  ImageStore store(path);
  EXPECT_EQ(store.num_classes(), 7);
  EXPECT_EQ(store.class_names()[3], "class3");
  EXPECT_EQ(store.height(), 5);
  EXPECT_EQ(store.width(), 4);
  EXPECT_EQ(store.channels(), 3);
  EXPECT_EQ(store.source(), "unit test");
  EXPECT_EQ(store.splits(), (std::vector<std::string>{"test", "train"}));
  EXPECT_EQ(store.split_size("train"), 103);
  EXPECT_EQ(store.labels("train"), train.labels);
  EXPECT_EQ(store.labels("test"), test.labels);

  const std::vector<int64_t> idx = {50, 3, 102, 3, 0, 51, 52, 17, 50, 101};
  const size_t img = 60;
  std::vector<uint8_t> out(idx.size() * img);
  store.read_rows("train", idx, out.data());
  for (size_t i = 0; i < idx.size(); ++i)
    for (size_t k = 0; k < img; ++k)
      ASSERT_EQ(out[i * img + k], train.images[static_cast<size_t>(idx[i]) * img + k]) << i;

  std::vector<uint8_t> all(20 * img);
  store.read_range("test", 0, 20, all.data());
  EXPECT_EQ(all, test.images);
  EXPECT_THROW(store.read_rows("train", std::vector<int64_t>{103}, out.data()), Error);
  EXPECT_THROW(store.split_size("val"), Error);
}

TEST(DataStore, MeanAndStdOfTrainSplitMatchNaiveDouble) {
  test::TempDir dir;
  const Data train = random_data(64, 3, 5), test = random_data(4, 3, 6);
  write_store(dir.file("s.h5"), train, test, 3);
  ImageStore store(dir.file("s.h5"));
  for (int c = 0; c < 3; ++c) {
    double s = 0, n = 0;
    for (size_t i = static_cast<size_t>(c); i < train.images.size(); i += 3, ++n)
      s += train.images[i] / 255.0;
    const double mean = s / n;
    double v = 0;
    for (size_t i = static_cast<size_t>(c); i < train.images.size(); i += 3)
      v += (train.images[i] / 255.0 - mean) * (train.images[i] / 255.0 - mean);
    EXPECT_NEAR(store.mean()[static_cast<size_t>(c)], mean, 1e-6);
    EXPECT_NEAR(store.std()[static_cast<size_t>(c)], std::sqrt(v / n), 1e-6);
  }
}

TEST(DataStore, WriterOptionsShowInTheLayout) {
  test::TempDir dir;
  const Data train = random_data(30, 2, 1), test = random_data(3, 2, 2);
  write_store(dir.file("s.h5"), train, test, 2,
              {.chunk_images = 4, .gzip_level = 6, .checksum = true});
  h5::Handle f = h5::open_file(dir.file("s.h5"));
  h5::Handle ds = h5::open_dataset(f.get(), "train/images");
  const h5::Layout layout = h5::dataset_layout(ds.get());
  EXPECT_TRUE(layout.chunked);
  EXPECT_EQ(layout.chunk_dims, (std::vector<int64_t>{4, 5, 4, 3}));
  EXPECT_EQ(layout.filters, (std::vector<std::string>{"fletcher32", "shuffle", "deflate(6)"}));
  EXPECT_EQ(parse_compression("none"), -1);
  EXPECT_EQ(parse_compression("gzip:9"), 9);
  EXPECT_THROW(parse_compression("lz4"), Error);
}

TEST(DataStore, FailedWriteLeavesNothingBehind) {
  test::TempDir dir;
  const std::string path = dir.file("s.h5");
  const Data d = random_data(10, 3, 1);
  {
    StoreWriter w(path, 5, 4, 3, class_names(2), "x");  // labels go up to 2: out of range
    w.begin_split("train");
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
    EXPECT_THROW(w.append(d.images.data(), std::vector<int32_t>(10, 2).data(), 10), Error);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  {
    StoreWriter w(path, 5, 4, 3, class_names(2), "x");
    w.begin_split("test");
    w.append(d.images.data(), std::vector<int32_t>(10, 1).data(), 10);
    EXPECT_THROW(w.commit(), Error);  // no train split: no mean/std
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// Under a file-size limit (ulimit -f) the writer stops before a write would pass it: one line
// naming the temporary, no file left, no HDF5 object left open (one left open is closed by
// HDF5's exit handler after its file was freed: a segfault at exit, Note [Abandoning a file]),
// the previous store as it was. A full disk, which needs a small file system to try, is covered
// by tests/e2e/convert_failures_test.sh.
TEST(DataStore, AFileSizeLimitStopsTheWriterCleanly) {
  test::TempDir dir;
  const std::string path = dir.file("s.h5");
  const Data old = random_data(10, 3, 7), train = random_data(4000, 3, 1);  // 240 KB of images
  write_store(path, old, old, 3);
  const std::vector<int32_t> old_labels = ImageStore(path).labels("train");
  const auto previous_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto write_under = [&](rlim_t limit) {
    rlimit low = saved;
    low.rlim_cur = limit;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &low), 0);
    std::string message;
    try {
      write_store(path, train, old, 3, {.chunk_images = 64});
    } catch (const Error& e) {
      message = e.message();
    }
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);
    return message;
  };
  for (rlim_t limit : {rlim_t{4096}, rlim_t{200000}, rlim_t{1100000}}) {
    const std::string message = write_under(limit);
    EXPECT_EQ(message.rfind(path + ".tmp: ", 0), 0u) << message;
    EXPECT_NE(message.find("file-size limit of " + std::to_string(limit) + " bytes (ulimit -f)"),
              std::string::npos)
        << message;
    EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 0) << "after: " << message;
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp")) << limit;
    EXPECT_EQ(ImageStore(path).labels("train"), old_labels) << limit;
  }
  EXPECT_EQ(write_under(2 << 20), "");  // 240 KB fit under 2 MiB, metadata margin included
  EXPECT_EQ(ImageStore(path).labels("train"), train.labels);
  std::signal(SIGXFSZ, previous_handler);
}

// A store made with the HDF5 C API alone, as another tool would: int32 attributes, fixed-length
// strings, contiguous datasets.
void write_foreign(const std::string& path, const std::string& format = kStoreFormat,
                   hid_t label_type = H5T_STD_I32LE, int64_t n_labels = 6, int label_value = 1,
                   bool with_images = true, int image_rank = 4) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  auto int_attr = [&](const char* name, int v) {
    hid_t s = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(f, name, H5T_STD_I32LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_INT, &v);
    H5Aclose(a), H5Sclose(s);
  };
  auto fixed_strings = [&](const char* name, const std::vector<std::string>& v, bool scalar) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, 32);
    std::vector<char> buf(32 * v.size(), 0);
    for (size_t i = 0; i < v.size(); ++i) v[i].copy(buf.data() + 32 * i, 32);
    const hsize_t n = v.size();
    hid_t s = scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, &n, nullptr);
    hid_t a = H5Acreate2(f, name, t, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, t, buf.data());
    H5Aclose(a), H5Sclose(s), H5Tclose(t);
  };
  fixed_strings("format", {format}, true);
  int_attr("format_version", 1);
  int_attr("num_classes", 2);
  fixed_strings("class_names", {"cat", "dog"}, false);
  int_attr("height", 2), int_attr("width", 3), int_attr("channels", 1);
  const double ms[1] = {0.5};
  const hsize_t one = 1;
  for (const char* name : {"mean", "std"}) {
    hid_t s = H5Screate_simple(1, &one, nullptr);
    hid_t a = H5Acreate2(f, name, H5T_IEEE_F64LE, s, H5P_DEFAULT, H5P_DEFAULT);
    H5Awrite(a, H5T_NATIVE_DOUBLE, ms);
    H5Aclose(a), H5Sclose(s);
  }
  hid_t g = H5Gcreate2(f, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (with_images) {
    const hsize_t dims[4] = {6, 2, 3, 1};
    std::vector<uint8_t> px(36);
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 7);
    hid_t s = H5Screate_simple(image_rank, dims, nullptr);
    hid_t d = H5Dcreate2(g, "images", H5T_STD_U8LE, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, px.data());
    H5Dclose(d), H5Sclose(s);
  }
  const hsize_t nl = static_cast<hsize_t>(n_labels);
  std::vector<int32_t> labels(static_cast<size_t>(n_labels), 0);
  if (n_labels > 0) labels.back() = label_value;
  hid_t s = H5Screate_simple(1, &nl, nullptr);
  hid_t d = H5Dcreate2(g, "labels", label_type, s, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data());
  H5Dclose(d), H5Sclose(s), H5Gclose(g), H5Fclose(f);
}

TEST(DataStore, ReadsAStoreWrittenWithTheHdf5CApi) {
  test::TempDir dir;
  write_foreign(dir.file("f.h5"));
  ImageStore store(dir.file("f.h5"));
  EXPECT_EQ(store.class_names(), (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(store.split_size("train"), 6);
  EXPECT_FLOAT_EQ(store.std()[0], 0.5f);
  std::vector<uint8_t> row(6);
  store.read_rows("train", std::vector<int64_t>{4}, row.data());
  for (size_t k = 0; k < 6; ++k) EXPECT_EQ(row[k], static_cast<uint8_t>((24 + k) * 7));
  EXPECT_EQ(store.labels("train")[5], 1);
}

// Expects ImageStore(path) to fail with a message naming the file and containing `what`.
void expect_rejected(const std::string& path, const std::string& what) {
  try {
    ImageStore store(path);
    ADD_FAILURE() << "accepted a bad store; expected: " << what;
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(path), std::string::npos) << e.message();
    EXPECT_NE(e.message().find(what), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find('\n'), std::string::npos) << e.message();
  }
}

TEST(DataStore, RejectsFilesThatAreNotValidStores) {
  test::TempDir dir;
  expect_rejected(dir.file("missing.h5"), "not an HDF5 file");
  {
    std::FILE* f = std::fopen(dir.file("text.h5").c_str(), "w");
    std::fputs("hello", f);
    std::fclose(f);
  }
  expect_rejected(dir.file("text.h5"), "not an HDF5 file");
  write_foreign(dir.file("a.h5"), "something-else");
  expect_rejected(dir.file("a.h5"), "format attribute is 'something-else'");
  write_foreign(dir.file("b.h5"), kStoreFormat, H5T_IEEE_F32LE);
  expect_rejected(dir.file("b.h5"), "/train/labels is float32, expected int32");
  write_foreign(dir.file("c.h5"), kStoreFormat, H5T_STD_I32LE, 5);
  expect_rejected(dir.file("c.h5"), "has 6 images but 5 labels");
  write_foreign(dir.file("d.h5"), kStoreFormat, H5T_STD_I32LE, 6, 2);
  expect_rejected(dir.file("d.h5"), "/train/labels[5] is 2, outside [0, 2)");
  write_foreign(dir.file("e.h5"), kStoreFormat, H5T_STD_I32LE, 6, 1, false);
  expect_rejected(dir.file("e.h5"), "split 'train' has no dataset 'images'");
  write_foreign(dir.file("g.h5"), kStoreFormat, H5T_STD_I32LE, 6, 1, true, 3);
  expect_rejected(dir.file("g.h5"), "has rank 3, expected 4");
  // Statistics that would normalise every pixel to NaN, 0 or Inf (and a double beyond
  // float's range, whose conversion is undefined behaviour).
  for (const double bad : {std::nan(""), HUGE_VAL, -HUGE_VAL, 1e39}) {
    for (const char* attr : {"mean", "std"}) {
      write_foreign(dir.file("s.h5"));
      h5::Handle f = h5::open_file(dir.file("s.h5"), true);
      H5Adelete(f.get(), attr);
      const hsize_t one = 1;
      hid_t space = H5Screate_simple(1, &one, nullptr);
      hid_t a = H5Acreate2(f.get(), attr, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(a, H5T_NATIVE_DOUBLE, &bad);
      H5Aclose(a), H5Sclose(space);
      f.reset();
      expect_rejected(dir.file("s.h5"), std::string("attribute '") + attr + "' holds");
    }
  }
  {  // a plain HDF5 file without the attributes
    h5::Handle f = h5::create_file(dir.file("h.h5"));
  }
  expect_rejected(dir.file("h.h5"), "attribute 'format' is missing");
}

}  // namespace
}  // namespace ddpv

namespace ddpv {
namespace {

TEST(DataStore, Hdf5ErrorsBecomeOneLineWithTheLibraryCause) {
  test::TempDir dir;
  h5::Handle f = h5::create_file(dir.file("x.h5"));
  try {
    h5::open_dataset(f.get(), "nope");
    FAIL() << "opened a missing dataset";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cannot open dataset 'nope'"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("H5Dopen2"), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find('\n'), std::string::npos) << e.message();
  }
  EXPECT_THROW(StoreWriter(dir.file("no/such/dir/s.h5"), 2, 2, 1, {"a"}, "x"), Error);
  // Round trip of the general helpers the checkpoint code uses.
  const std::vector<float> v{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  h5::write_f32(f.get(), "w", {2, 3}, v.data());
  std::vector<int64_t> dims;
  EXPECT_EQ(h5::read_f32(f.get(), "w", &dims), v);
  EXPECT_EQ(dims, (std::vector<int64_t>{2, 3}));
  h5::write_attr_strings(f.get(), "names", {"x", "yy"});
  EXPECT_EQ(h5::read_attr_strings(f.get(), "names"), (std::vector<std::string>{"x", "yy"}));
  h5::write_attr_i64(f.get(), "n", 5);
  h5::write_attr_i64(f.get(), "n", 6);  // rewritten, not duplicated
  EXPECT_EQ(h5::read_attr_i64(f.get(), "n"), 6);
  EXPECT_THROW(h5::read_attr_string(f.get(), "n"), Error);
}

// A variable-length string whose stored base type claims characters of 1 GiB each (as a
// damaged datatype message can): libhdf5 would size its conversion buffer by that claim.
TEST(DataStore, VariableLengthStringsWithWideCharactersAreRefused) {
  test::TempDir dir;
  const std::string path = dir.file("v.h5");
  {
    h5::Handle f = h5::create_file(path);
    h5::write_attr_strings(f.get(), "names", {"abc"});
  }
  std::string bytes = test::read_bytes(path);
  // Datatype message: version 1 class 9 (variable length), type 1 (string), two bit-field
  // bytes, size 16; then the base type: version 1 class 0 (integer), three bit-field bytes,
  // size (4 bytes, 1 as written).
  size_t at = std::string::npos;
  for (size_t i = 0; i + 16 <= bytes.size(); ++i) {
    if (static_cast<uint8_t>(bytes[i]) == 0x19 && bytes[i + 1] == 1 && bytes[i + 4] == 16 &&
        bytes[i + 5] == 0 && bytes[i + 8] == 0x10 && bytes[i + 12] == 1) {
      at = i + 12;
      break;
    }
  }
  ASSERT_NE(at, std::string::npos) << "no variable-length string datatype in " << path;
  const uint32_t claim = uint32_t{1} << 30;
  std::memcpy(bytes.data() + at, &claim, 4);
  test::write_bytes(path, bytes);
  h5::Handle f = h5::open_file(path, false);
  const std::string error = test::error_of([&] { h5::read_attr_strings(f.get(), "names"); });
  EXPECT_NE(error.find("attribute 'names' is a variable-length string whose characters are not "
                       "one byte"),
            std::string::npos)
      << error;
}

}  // namespace
}  // namespace ddpv
