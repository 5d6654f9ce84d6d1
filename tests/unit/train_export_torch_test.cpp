// scripts/export_torch.py against our own evaluation: a checkpoint loaded into the PyTorch twin
// must predict what our model predicts, with the same loss (skipped when torch is missing).
#include <hdf5.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "ddpv/data/image_store.hpp"
#include "ddpv/data/store_writer.hpp"
#include "ddpv/nn/model.hpp"
#include "ddpv/train/checkpoint.hpp"
#include "support/test_support.hpp"

namespace ddpv {
namespace {

struct RunResult {
  int rc = -1;
  std::string out;
};

RunResult run(const std::string& cmd) {
  RunResult r;
  std::FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) r.out += buf;
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string python3() {
  const char* env = std::getenv("DDPV_PYTHON3");
  return env && *env ? env : "/usr/bin/python3";
}

// Non-trivial BatchNorm affine parameters and running statistics (refined by training-mode
// forwards later), and a classifier with weights larger than the default initialisation, so
// that the arg-max follows the input rather than the bias.
void randomise(Model& m, uint64_t seed) {
  for (const ArenaEntry& e : m.buffers()) {
    const bool var = e.name.ends_with("running_var");
    m.set_param(e.name, test::random_vector(static_cast<size_t>(e.count), seed++,
                                            var ? 0.5f : -0.3f, var ? 1.5f : 0.3f));
  }
  for (const ArenaEntry& e : m.params()) {
    const bool bn =
        e.name.find("bn") != std::string::npos || e.name.find("downsample.1") != std::string::npos;
    const bool weight = e.name.ends_with("weight");
    if (bn)
      m.set_param(e.name, test::random_vector(static_cast<size_t>(e.count), seed++,
                                              weight ? 0.5f : -0.2f, weight ? 1.5f : 0.2f));
  }
  // Arenas are in reverse layer order: the classifier's weight and bias come first.
  const ArenaEntry& fc = m.params()[m.params()[0].name.ends_with(".weight") ? 0 : 1];
  m.set_param(fc.name, test::random_vector(static_cast<size_t>(fc.count), seed, -2.0f, 2.0f));
  m.set_batches_tracked(11);
}

// Writes a store of random images, labels them partly with our model's own predictions, saves
// a checkpoint, and checks that torch reaches our accuracy and loss.
void check_model(const std::string& name, const Shape& hwc) {
  const int n = 40, classes = 10;
  const int64_t h = hwc[0], w = hwc[1], c = hwc[2], image = h * w * c;
  BackendOptions opt;
  opt.threads = 1;
  auto backend = make_backend(opt);
  auto model = make_model(name, *backend, hwc, classes);
  model->init_parameters(2024);
  randomise(*model, 99);

  test::TempDir dir;
  const std::string store = dir.file("store.h5"), ckpt = dir.file("ckpt.h5");
  std::vector<uint8_t> pixels(static_cast<size_t>(n * image));
  // Images of different brightness and contrast, so that predictions vary across samples.
  const std::vector<float> u = test::random_vector(pixels.size(), 7, 0.0f, 1.0f);
  const std::vector<float> level = test::random_vector(n, 8, 0.0f, 200.0f);
  const std::vector<float> span = test::random_vector(n, 9, 10.0f, 55.0f);
  for (size_t i = 0; i < pixels.size(); ++i) {
    const size_t k = i / static_cast<size_t>(image);
    pixels[i] = static_cast<uint8_t>(std::min(level[k] + span[k] * u[i], 255.0f));
  }
  {
    std::vector<std::string> class_names;
    for (int k = 0; k < classes; ++k) class_names.push_back(std::to_string(k) + "c");
    StoreWriter writer(store, static_cast<int>(h), static_cast<int>(w), static_cast<int>(c),
                       class_names, "export_torch test");
    const std::vector<int32_t> zeros(n, 0);
    for (const char* split : {"train", "test"}) {
      writer.begin_split(split);
      writer.append(pixels.data(), zeros.data(), n);
    }
    writer.commit();
  }

  // Our evaluation, normalised as the loader does: (v / 255 - mean) * (1 / std).
  std::vector<float> mean, inv_std;
  {
    ImageStore s(store);
    mean = s.mean();
    for (float sd : s.std()) inv_std.push_back(1.0f / sd);
  }
  std::vector<float> x(pixels.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t ch = i % static_cast<size_t>(c);
    x[i] = (static_cast<float>(pixels[i]) / 255.0f - mean[ch]) * inv_std[ch];
  }
  const Tensor input = Tensor::wrap(x.data(), Shape{n, h, w, c}, DType::kF32);
  // Running statistics near those of the data (as after training), so that the features,
  // and with them the predictions, vary from image to image.
  for (int i = 0; i < 20; ++i) model->forward(input, /*training=*/true);
  const Tensor& logits = model->forward(input, /*training=*/false);
  std::vector<float> z(static_cast<size_t>(n * classes));
  backend->copy(z.data(), Device::kCpu, logits.data<float>(), backend->device(), z.size() * 4);
  backend->synchronize();
  // Labels: our own prediction for even samples (torch must agree), a random class for odd
  // ones (their loss depends on every logit, not just the largest).
  const std::vector<float> pick = test::random_vector(n, 10, 0.0f, static_cast<float>(classes));
  std::vector<int32_t> labels(n);
  double loss = 0;
  int correct = 0;
  for (int i = 0; i < n; ++i) {
    const float* zi = z.data() + i * classes;
    int best = 0;
    double mx = zi[0], sum = 0;
    for (int k = 1; k < classes; ++k) {
      if (zi[k] > zi[best]) best = k;
      mx = std::max(mx, static_cast<double>(zi[k]));
    }
    for (int k = 0; k < classes; ++k) sum += std::exp(zi[k] - mx);
    labels[i] = i % 2 == 0 ? best : std::min(static_cast<int>(pick[i]), classes - 1);
    correct += labels[i] == best;
    loss += -(zi[labels[i]] - mx - std::log(sum));
  }
  loss /= n;
  const double accuracy = static_cast<double>(correct) / n;
  {  // relabel the test split with our predictions
    hid_t f = H5Fopen(store.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "/test/labels", H5P_DEFAULT);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, labels.data()), 0);
    H5Dclose(d);
    H5Fclose(f);
  }
  save_checkpoint(ckpt, *model, CheckpointMeta{});

  const RunResult r = run(python3() + " " + test::source_path("scripts/export_torch.py") +
                          " --threads 1 --checkpoint " + ckpt + " --data " + store +
                          " --split test --save " + dir.file("model.pt"));
  if (r.rc == 77 || r.rc == 127) GTEST_SKIP() << "python3 with torch not available: " << r.out;
  ASSERT_EQ(r.rc, 0) << r.out;
  const size_t at = r.out.rfind("accuracy=");
  ASSERT_NE(at, std::string::npos) << r.out;
  double acc = -1, torch_loss = -1;
  long samples = -1;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, "accuracy=%lf loss=%lf samples=%ld", &acc, &torch_loss,
                        &samples),
            3)
      << r.out;
  EXPECT_EQ(samples, n);
  // A near-tie of the two best logits may flip under float rounding: allow one sample.
  EXPECT_NEAR(acc, accuracy, 1.5 / n) << r.out;
  EXPECT_NEAR(torch_loss, loss, 1e-4 * std::max(1.0, loss) + 2e-6) << r.out;
}

TEST(ExportTorch, LeNetMatchesOurEvaluation) { check_model("lenet", Shape{28, 28, 1}); }
TEST(ExportTorch, ResNet20MatchesOurEvaluation) { check_model("resnet20", Shape{32, 32, 3}); }

TEST(ExportTorch, ErrorsAreOneLineWithExitCodes) {
  const std::string script = python3() + " " + test::source_path("scripts/export_torch.py");
  test::TempDir dir;
  RunResult r = run(script + " --checkpoint " + dir.file("absent.h5") + " --data x.h5");
  if (r.rc == 77 || r.rc == 127) GTEST_SKIP() << "python3 with torch not available: " << r.out;
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_NE(r.out.find("absent.h5 does not exist"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  r = run(script);
  EXPECT_EQ(r.rc, 2) << r.out;  // usage
  r = run(script + " --checkpoint " + dir.file("absent.h5"));
  EXPECT_EQ(r.rc, 2) << r.out;  // nothing to do
}

}  // namespace
}  // namespace ddpv
