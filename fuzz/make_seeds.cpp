// ddpv-fuzz-seeds DIR: writes the seed inputs of the targets that parse files of a simple
// kind (images, IDX, CIFAR, config files) under DIR/<target>/; fuzz/make_seeds.sh adds the
// store and checkpoint seeds made by the real tools. Each seed starts with the target's
// choice byte (fuzz/targets/*.cpp say what it picks).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/image_codec.hpp"

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

void put(const fs::path& dir, const std::string& name, uint8_t choice, const Bytes& body) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.put(static_cast<char>(choice));
  out.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
}

ddpv::codec::Image gradient(int h, int w, int c) {
  ddpv::codec::Image im{h, w, c, Bytes(static_cast<size_t>(h) * w * c)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k)
        im.pixels[(static_cast<size_t>(y) * w + x) * c + k] =
            static_cast<uint8_t>((x * 7 + y * 13 + k * 60) ^ (x * y));
  return im;
}

Bytes idx(const std::vector<uint32_t>& dims, int fill_seed) {
  Bytes b = {0, 0, 0x08, static_cast<uint8_t>(dims.size())};
  size_t n = 1;
  for (uint32_t d : dims) {
    for (int s = 24; s >= 0; s -= 8) b.push_back(static_cast<uint8_t>(d >> s));
    n *= d;
  }
  for (size_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>((i * 31 + fill_seed) % 10));
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ddpv-fuzz-seeds DIR\n");
    return 2;
  }
  const fs::path dir = argv[1];
  using namespace ddpv::codec;
  // image_codec: byte 0 odd = 3 channels.
  put(dir / "image_codec", "gray.png", 0, encode_png(gradient(9, 7, 1)));
  put(dir / "image_codec", "rgb.png", 1, encode_png(gradient(6, 11, 3)));
  put(dir / "image_codec", "gray.jpg", 0, encode_jpeg(gradient(16, 8, 1), 90));
  put(dir / "image_codec", "rgb.jpg", 1, encode_jpeg(gradient(12, 20, 3), 75));
  put(dir / "image_codec", "rgb-as-gray.jpg", 0, encode_jpeg(gradient(8, 8, 3), 50));
  put(dir / "image_codec", "wide.png", 1, encode_png(gradient(1, 300, 3)));
  // idx: byte 0 odd = images (rank 3), even = labels (rank 1).
  put(dir / "idx", "images", 1, idx({3, 4, 5}, 0));
  put(dir / "idx", "labels", 0, idx({6}, 1));
  put(dir / "idx", "empty-images", 1, idx({0, 28, 28}, 0));
  // cifar: byte 0 % 3 = CIFAR-10, CIFAR-100 fine, CIFAR-100 coarse.
  for (int v = 0; v < 3; ++v) {
    const size_t record = (v == 0 ? 1 : 2) + 32 * 32 * 3;
    Bytes b(2 * record);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 17 % 251);
    b[0] = 3;
    b[record] = 9;
    put(dir / "cifar", "two-records-" + std::to_string(v), static_cast<uint8_t>(v), b);
  }
  // config: the whole input is the file; no choice byte is read, so the seeds are plain text.
  const char* configs[] = {
      "synthetic = true\nmodel = lenet\nepochs = 2\nbatch-size = 32\nlr = 0.05\n",
      "# a run\ndata = /data/fashion.h5\nmodel = resnet20\nlr-schedule = cosine\n"
      "warmup-epochs = 0.5\nmomentum = 0.9\nweight-decay = 5e-4\nnesterov = true\n"
      "checkpoint-dir = ckpt\nkeep-checkpoints = 3\nbatch-split = 40/24\n",
      "synthetic = 1\naccum-steps = 4\nbucket-mb = 25\nreduce-dtype = bf16\ncomm-timeout = 60\n"
      "mpi-progress = thread\nthreads = 1\nseed = 7\ndeterministic = true\n",
  };
  for (size_t i = 0; i < std::size(configs); ++i) {
    fs::create_directories(dir / "config");
    std::ofstream(dir / "config" / ("run" + std::to_string(i) + ".cfg")) << configs[i];
  }
  return 0;
}
