// The JPEG input pipeline's throughput: images/s a Loader delivers from an encoded store with
// `--threads` decode threads, for the train transform (RandomResizedCrop + flip + normalise) or
// the eval one (resize + centre crop + normalise). Run by scripts/bench-data.sh beside
// torchvision's DataLoader on the same JPEGs; prints one JSON line last.
//   data_bench --store S.h5 [--split train|val] [--threads 1] [--batch 64] [--crop 224]
//              [--batches 40] [--warmup 2] [--cold]
// --cold: the caller dropped the page cache first; the loader then gets no byte cache either
// (--cache-mb 0), so every batch is read from the file.
//   data_bench --layouts --store S.h5 [--split train] [--batch 256] [--batches 50]
// compares, in C++ through the same libhdf5, the store's layout of an encoded split (one byte
// dataset + offsets: ImageStore::read_encoded) with an HDF5 variable-length uint8 dataset of the
// same images written to a temporary file, reading the same random batches (warm page cache),
// and prints the median milliseconds a batch for each.
//   data_bench --resize
// times our antialiased resize (codec::resize_region, Note [Resize]) of random RGB images to
// 224x224 from the sizes bench/data/resize_peer.py gives OpenCV, one thread.
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "data/image_codec.hpp"
#include "ddpv/core/error.hpp"
#include "ddpv/data/loader.hpp"

namespace {

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "data_bench: %s\nusage: data_bench --store S.h5 [--split train|val] [--threads N] "
               "[--batch B] [--crop C] [--batches K] [--warmup W] [--cold]\n",
               why.c_str());
  std::exit(2);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Note [Encoded layout]: see docs/data-format.md, "Why one byte dataset and offsets".
int compare_layouts(const ddpv::ImageStore& store, const std::string& split, int64_t batch,
                    int64_t reads) {
  const int64_t n = store.split_size(split);
  batch = std::min(batch, n);
  std::vector<int64_t> all(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  ddpv::EncodedBatch whole;
  store.read_encoded(split, all.data(), all.size(), &whole);
  const std::string tmp = (std::filesystem::temp_directory_path() /
                           ("ddpv-layout-" + std::to_string(getpid()) + ".h5"))
                              .string();
  const hid_t vtype = H5Tvlen_create(H5T_NATIVE_UINT8);
  hid_t file = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  const hsize_t dims = static_cast<hsize_t>(n);
  hid_t space = H5Screate_simple(1, &dims, nullptr);
  hid_t dset = H5Dcreate2(file, "images", vtype, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  std::vector<hvl_t> blobs(static_cast<size_t>(n));
  for (size_t i = 0; i < blobs.size(); ++i)
    blobs[i] = hvl_t{static_cast<size_t>(whole.size[i]), whole.bytes.data() + whole.begin[i]};
  const auto w0 = std::chrono::steady_clock::now();
  DDPV_CHECK(H5Dwrite(dset, vtype, H5S_ALL, H5S_ALL, H5P_DEFAULT, blobs.data()) >= 0,
             "cannot write the variable-length dataset");
  H5Dclose(dset);
  H5Sclose(space);
  H5Fclose(file);
  const double write_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  const double vlen_mb = static_cast<double>(std::filesystem::file_size(tmp)) / (1 << 20);
  file = H5Fopen(tmp.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  dset = H5Dopen2(file, "images", H5P_DEFAULT);
  std::mt19937_64 gen(1);
  std::vector<double> flat_ms, vlen_ms;
  ddpv::EncodedBatch b;
  std::vector<hvl_t> out(static_cast<size_t>(batch));
  for (int64_t r = 0; r < reads + 1; ++r) {  // the first round warms both
    std::shuffle(all.begin(), all.end(), gen);
    std::vector<int64_t> idx(all.begin(), all.begin() + batch);
    std::sort(idx.begin(), idx.end());
    std::vector<hsize_t> points(idx.begin(), idx.end());
    auto flat = [&] {
      const auto t = std::chrono::steady_clock::now();
      store.read_encoded(split, idx.data(), idx.size(), &b);
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t)
          .count();
    };
    auto vlen = [&] {
      const auto t = std::chrono::steady_clock::now();
      hid_t fs = H5Dget_space(dset);
      H5Sselect_elements(fs, H5S_SELECT_SET, points.size(), points.data());
      const hsize_t m = points.size();
      hid_t ms = H5Screate_simple(1, &m, nullptr);
      DDPV_CHECK(H5Dread(dset, vtype, ms, fs, H5P_DEFAULT, out.data()) >= 0,
                 "cannot read the variable-length dataset");
      H5Dvlen_reclaim(vtype, ms, H5P_DEFAULT, out.data());
      H5Sclose(ms);
      H5Sclose(fs);
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t)
          .count();
    };
    double a, c;
    if (r % 2 == 0) {
      a = flat(), c = vlen();
    } else {
      c = vlen(), a = flat();
    }
    if (r > 0) flat_ms.push_back(a), vlen_ms.push_back(c);
  }
  H5Dclose(dset);
  H5Fclose(file);
  H5Tclose(vtype);
  std::filesystem::remove(tmp);
  const double flat_mb = static_cast<double>(store.offsets(split).back()) / (1 << 20);
  std::printf("layouts: %lld images (%.1f MiB), batches of %lld: bytes + offsets %.2f ms, "
              "variable-length %.2f ms (%.2fx); vlen file %.1f MiB, written in %.2f s\n",
              static_cast<long long>(n), flat_mb, static_cast<long long>(batch), median(flat_ms),
              median(vlen_ms), median(vlen_ms) / median(flat_ms), vlen_mb, write_s);
  std::printf("{\"bench\":\"layouts\",\"images\":%lld,\"batch\":%lld,\"flat_ms\":%.3f,"
              "\"vlen_ms\":%.3f,\"vlen_file_mb\":%.1f,\"data_mb\":%.1f}\n",
              static_cast<long long>(n), static_cast<long long>(batch), median(flat_ms),
              median(vlen_ms), vlen_mb, flat_mb);
  return 0;
}

int time_resize() {
  std::mt19937 gen(0);
  std::string json = "{\"bench\":\"resize\"";
  for (const auto& [sh, sw] : {std::pair{328, 328}, std::pair{300, 400}, std::pair{160, 200}}) {
    std::vector<uint8_t> src(static_cast<size_t>(sh) * sw * 3), dst(224 * 224 * 3);
    for (auto& v : src) v = static_cast<uint8_t>(gen());
    std::vector<float> scratch;
    const ddpv::codec::Region whole{0, 0, static_cast<double>(sh), static_cast<double>(sw)};
    for (int i = 0; i < 20; ++i)
      ddpv::codec::resize_region(src.data(), sh, sw, 3, whole, true, dst.data(), 224, 224, &scratch);
    const int n = 2000;
    const auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i)
      ddpv::codec::resize_region(src.data(), sh, sw, 3, whole, true, dst.data(), 224, 224, &scratch);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count() / n;
    std::printf("%dx%d -> 224 ours (antialiased triangle): %.0f us\n", sh, sw, us);
    json += ",\"" + std::to_string(sh) + "x" + std::to_string(sw) + "_us\":" + std::to_string(us);
  }
  std::printf("%s}\n", json.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string store_path, split = "train";
  int threads = 1, crop = 224;
  int64_t batch = 64, batches = 40, warmup = 2;
  bool cold = false, layouts = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--store")
      store_path = value();
    else if (a == "--split")
      split = value();
    else if (a == "--threads")
      threads = std::atoi(value().c_str());
    else if (a == "--batch")
      batch = std::atoll(value().c_str());
    else if (a == "--crop")
      crop = std::atoi(value().c_str());
    else if (a == "--batches")
      batches = std::atoll(value().c_str());
    else if (a == "--warmup")
      warmup = std::atoll(value().c_str());
    else if (a == "--cold")
      cold = true;
    else if (a == "--layouts")
      layouts = true;
    else if (a == "--resize")
      return time_resize();
    else
      usage("unknown argument '" + a + "'");
  }
  if (store_path.empty()) usage("--store is required");
  if (threads < 1 || batch < 1 || crop < 1 || batches < 1 || warmup < 0)
    usage("--threads, --batch, --crop and --batches must be positive");
  try {
    const ddpv::ImageStore store(store_path);
    DDPV_CHECK(store.encoding(split) != ddpv::SplitEncoding::kRaw, store_path, ": split '", split,
               "' is not a JPEG split");
    if (layouts) return compare_layouts(store, split, batch, batches);
    ddpv::LoaderOptions o;
    o.split = split;
    o.batch_size = batch;
    o.threads = threads;
    o.crop_h = o.crop_w = crop;
    o.augment = split == "train";
    o.shuffle = o.augment;  // evaluation reads in order, as torchvision's val loader
    o.cache_mb = cold ? 0 : 2048;
    ddpv::Loader loader(store, o);
    int64_t images = 0, taken = 0;
    auto start = std::chrono::steady_clock::now();
    for (int64_t epoch = 0; taken < warmup + batches; ++epoch) {
      loader.start_epoch(epoch);
      while (taken < warmup + batches) {
        std::optional<ddpv::Batch> b = loader.next();
        if (!b) break;
        if (++taken == warmup) {
          start = std::chrono::steady_clock::now();
        } else if (taken > warmup) {
          images += b->size;
        }
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "{\"bench\":\"data\",\"split\":\"%s\",\"transform\":\"%s\",\"threads\":%d,\"batch\":%lld,"
        "\"crop\":%d,\"cold\":%s,\"images\":%lld,\"seconds\":%.4f,\"images_per_s\":%.1f,"
        "\"images_per_s_per_thread\":%.1f}\n",
        split.c_str(), o.augment ? "random-resized-crop" : "resize-centre-crop", threads,
        static_cast<long long>(batch), crop, cold ? "true" : "false",
        static_cast<long long>(images), seconds, images / seconds, images / seconds / threads);
    return 0;
  } catch (const ddpv::Error& e) {
    std::fprintf(stderr, "data_bench: error: %s\n", e.what());
    return 1;
  }
}
