// ImageStore against stores whose dims claim more than the file holds (Note [Claimed rows]):
// each is refused at open with one line naming the file and the dataset, before any allocation.
#include <hdf5.h>

#include <filesystem>
#include <limits>
#include <numeric>

#include "ddpv/h5/h5.hpp"
#include "ddpv/data/image_store.hpp"
#include "ddpv/data/loader.hpp"
#include "ddpv/data/store_writer.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

constexpr int64_t kHuge = int64_t{1} << 40;

// How one dataset of a hand-made split is laid out and which of its rows are written.
struct Claim {
  int64_t rows;
  int64_t chunk_rows;  // 0: contiguous
  bool gzip;
  std::vector<int64_t> written;
};
Claim claim(int64_t rows, int64_t chunk_rows = 0, bool gzip = false,
            std::vector<int64_t> written = {}) {
  return Claim{rows, chunk_rows, gzip, std::move(written)};
}

// A store of 2x3x1 images, two classes, whose train split is laid out as `images` and `labels`
// say, written with the HDF5 C API as another tool would.
void write_claiming(const std::string& path, const Claim& images, const Claim& labels) {
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  {
    h5::Handle f = h5::create_file(path);
    h5::write_attr_string(f.get(), "format", kStoreFormat);
    h5::write_attr_i64(f.get(), "format_version", kStoreFormatVersion);
    h5::write_attr_i64(f.get(), "num_classes", 2);
    h5::write_attr_strings(f.get(), "class_names", {"cat", "dog"});
    h5::write_attr_i64(f.get(), "height", 2);
    h5::write_attr_i64(f.get(), "width", 3);
    h5::write_attr_i64(f.get(), "channels", 1);
    h5::write_attr_f32s(f.get(), "mean", {0.5f});
    h5::write_attr_f32s(f.get(), "std", {0.25f});
  }
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t g = H5Gcreate2(f, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  auto make = [&](const char* name, const Claim& c, std::vector<hsize_t> row, hid_t type) {
    std::vector<hsize_t> dims{static_cast<hsize_t>(c.rows)},
        chunk{static_cast<hsize_t>(c.chunk_rows)};
    dims.insert(dims.end(), row.begin(), row.end());
    chunk.insert(chunk.end(), row.begin(), row.end());
    hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    hid_t plist = H5Pcreate(H5P_DATASET_CREATE);
    if (c.chunk_rows > 0) H5Pset_chunk(plist, static_cast<int>(chunk.size()), chunk.data());
    if (c.gzip) H5Pset_deflate(plist, 4);
    hid_t d = H5Dcreate2(g, name, type, space, H5P_DEFAULT, plist, H5P_DEFAULT);
    ASSERT_GE(d, 0) << name;
    const size_t row_elems = std::accumulate(row.begin(), row.end(), size_t{1},
                                             [](size_t a, hsize_t b) { return a * b; });
    std::vector<int32_t> zeros(row_elems, 0);  // label 0; pixels 0
    for (int64_t r : c.written) {
      std::vector<hsize_t> start(dims.size(), 0), count = dims;
      start[0] = static_cast<hsize_t>(r);
      count[0] = 1;
      hid_t fs = H5Dget_space(d);
      H5Sselect_hyperslab(fs, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
      hid_t ms = H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr);
      ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT32, ms, fs, H5P_DEFAULT, zeros.data()), 0) << name;
      H5Sclose(ms), H5Sclose(fs);
    }
    H5Dclose(d), H5Pclose(plist), H5Sclose(space);
  };
  make("images", images, {2, 3, 1}, H5T_STD_U8LE);
  make("labels", labels, {}, H5T_STD_I32LE);
  H5Gclose(g), H5Fclose(f);
}

std::vector<int64_t> rows(int64_t from, int64_t to) {
  std::vector<int64_t> r(static_cast<size_t>(to - from));
  std::iota(r.begin(), r.end(), from);
  return r;
}

// Expects ImageStore(path) to fail with one line naming the file and containing each of `what`.
void expect_rejected(const std::string& path, std::initializer_list<std::string> what) {
  try {
    ImageStore store(path);
    ADD_FAILURE() << "accepted " << path;
  } catch (const Error& e) {
    EXPECT_EQ(e.message().rfind(path + ": ", 0), 0u) << e.message();
    for (const std::string& w : what)
      EXPECT_NE(e.message().find(w), std::string::npos) << e.message();
    EXPECT_EQ(e.message().find('\n'), std::string::npos) << e.message();
  }
}

TEST(DataStoreClaims, WhatTheFileHoldsIsAccepted) {
  test::TempDir dir;
  // Contiguous, chunked, and compressed with 1000 images to the kilobyte: all written.
  write_claiming(dir.file("a.h5"), claim(6, 0, false, {0}), claim(6, 0, false, {0}));
  EXPECT_EQ(ImageStore(dir.file("a.h5")).split_size("train"), 6);
  write_claiming(dir.file("b.h5"), claim(10, 4, false, rows(0, 10)),
                 claim(10, 3, false, rows(0, 10)));
  EXPECT_EQ(ImageStore(dir.file("b.h5")).split_size("train"), 10);
  const int64_t n = 200000;  // 1.2 MB of zero images and 0.8 MB of labels, compressed
  write_claiming(dir.file("c.h5"), claim(n, 50000, true, {0, 50000, 100000, n - 1}),
                 claim(n, 50000, true, {0, 50000, 100000, n - 1}));
  EXPECT_LT(std::filesystem::file_size(dir.file("c.h5")), 100000u);
  ImageStore c(dir.file("c.h5"));
  EXPECT_EQ(c.labels("train").size(), static_cast<size_t>(n));
  // An empty split is a valid store; the loader names it (below).
  write_claiming(dir.file("d.h5"), claim(0, 4), claim(0, 4));
  EXPECT_EQ(ImageStore(dir.file("d.h5")).split_size("train"), 0);
}

TEST(DataStoreClaims, MoreRowsThanTheFileHoldsAreRefusedBeforeAllocation) {
  test::TempDir dir;
  const std::string huge = std::to_string(kHuge);
  // 2^40 rows declared, chunked, nothing written: 17.6 TB of images in a file of a few KB.
  write_claiming(dir.file("a.h5"), claim(kHuge, 1024), claim(kHuge, 4096));
  expect_rejected(dir.file("a.h5"), {"/train/images claims " + huge + " rows", "the file has"});
  // The same, contiguous (allocated late, so nothing is stored).
  write_claiming(dir.file("b.h5"), claim(kHuge), claim(kHuge));
  expect_rejected(dir.file("b.h5"), {"/train/images claims " + huge + " rows"});
  // Small enough for the file size, but never written.
  write_claiming(dir.file("c.h5"), claim(6), claim(6, 0, false, {0}));
  expect_rejected(dir.file("c.h5"), {"/train/images claims 6 rows", "but stores 0 bytes"});
  // Compressed, so the file size says nothing: the chunks decide. Images: the last row's chunk.
  write_claiming(dir.file("d.h5"), claim(kHuge, 1024, true, {0}), claim(kHuge, 4096, true, {0}));
  expect_rejected(dir.file("d.h5"), {"/train/images claims " + huge, "chunk of its last row"});
  // Labels: every chunk (the labels are read whole, so their index is walked anyway).
  write_claiming(dir.file("e.h5"), claim(kHuge, 1024, true, {kHuge - 1}),
                 claim(kHuge, 4096, true, {0, kHuge - 1}));
  expect_rejected(dir.file("e.h5"),
                  {"/train/labels claims " + huge, "only 2 of the 268435456 chunks"});
  // A hole in the middle of the labels is caught too.
  write_claiming(dir.file("f.h5"), claim(10, 2, false, rows(0, 10)),
                 claim(10, 2, true, {0, 1, 2, 3, 8, 9}));
  expect_rejected(dir.file("f.h5"), {"/train/labels claims 10 rows", "only 3 of the 5 chunks"});
  // Dims whose byte count overflows: 2^62 x 2 x 3 x 1.
  write_claiming(dir.file("g.h5"), claim(int64_t{1} << 62, 1), claim(int64_t{1} << 62, 4096));
  expect_rejected(dir.file("g.h5"), {"/train/images declares dims (4611686018427387904, 2, 3, 1)"});
  // Counts that differ are still named as such.
  write_claiming(dir.file("h.h5"), claim(6, 0, false, {0}), claim(5, 0, false, {0}));
  expect_rejected(dir.file("h.h5"), {"split 'train' has 6 images but 5 labels"});
}

// The whole-dataset readers the checkpoint code uses check the same before allocating.
TEST(DataStoreClaims, WholeDatasetReadersCheckTheClaimToo) {
  test::TempDir dir;
  h5::Handle f = h5::create_file(dir.file("c.h5"));
  const hsize_t dims[2] = {static_cast<hsize_t>(kHuge), 4}, chunk[2] = {1024, 4};
  h5::Handle space(H5Screate_simple(2, dims, nullptr), H5Sclose);
  h5::Handle plist(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
  H5Pset_chunk(plist.get(), 2, chunk);
  h5::Handle(
      H5Dcreate2(f.get(), "w", H5T_IEEE_F32LE, space.get(), H5P_DEFAULT, plist.get(), H5P_DEFAULT),
      H5Dclose);
  try {
    h5::read_f32(f.get(), "w", nullptr);
    ADD_FAILURE() << "read 2^42 floats";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("dataset 'w' claims " + std::to_string(kHuge) + " rows"),
              std::string::npos)
        << e.message();
  }
  const std::vector<float> v{1, 2, 3, 4, 5, 6};
  h5::write_f32(f.get(), "ok", {2, 3}, v.data());
  EXPECT_EQ(h5::read_f32(f.get(), "ok", nullptr), v);
}

TEST(DataStoreClaims, TheLoaderNamesAnEmptySplitAndSizesItCannotHold) {
  test::TempDir dir;
  const std::string path = dir.file("s.h5");
  {
    StoreWriter w(path, 2, 3, 1, {"cat", "dog"}, "test");
    w.begin_split("train");
    const std::vector<uint8_t> px(4 * 6, 9);
    w.append(px.data(), std::vector<int32_t>{0, 1, 0, 1}.data(), 4);
    w.begin_split("test");  // no image
    w.commit();
  }
  ImageStore store(path);
  auto message = [&](const LoaderOptions& o) {
    try {
      Loader loader(store, o);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  LoaderOptions eval;
  eval.split = "test";
  eval.unpadded = true;
  EXPECT_EQ(
      message(eval).rfind("store " + path + ": split 'test' is empty: nothing to evaluate", 0), 0u)
      << message(eval);
  LoaderOptions train;
  train.split = "test";
  EXPECT_NE(message(train).find("split 'test' is empty: nothing to train on"), std::string::npos);
  // A cache size that is not a number would cache any split, whatever its size.
  LoaderOptions inf;
  inf.cache_mb = std::numeric_limits<double>::infinity();
  EXPECT_NE(message(inf).find("cache size must be a finite number"), std::string::npos);
  inf.cache_mb = 1;
  EXPECT_EQ(message(inf), "no error");
  // The batch pool is checked against the node's memory before it is allocated.
  LoaderOptions big;
  big.batch_size = int64_t{1} << 40;
  const std::string m = message(big);
  EXPECT_EQ(m.rfind("store " + path + ": 6 batches of 1099511627776 images of 2x3x1 need ", 0), 0u)
      << m;
  EXPECT_NE(m.find("GiB of this node: use a smaller --batch-size"), std::string::npos) << m;
}

}  // namespace
}  // namespace ddpv
