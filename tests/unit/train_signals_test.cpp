// Stop signals: collected by the watcher thread, never delivered on a compute thread
// (Note [No signal on a compute thread]). A storm of SIGUSR1 while the main thread runs
// oneDNN's JIT GEMM must neither crash nor change a result.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "support/test_support.hpp"
#include "train/signals.hpp"

namespace ddpv {
namespace {

TEST(StopSignals, StormDuringGemmIsCollectedAndHarmless) {
  block_stop_signals();
  StopSignalWatcher watcher;
  auto be = make_backend(BackendOptions{});
  LinearConfig cfg;
  cfg.in_features = 512;
  cfg.out_features = 256;
  auto op = be->linear(cfg);
  const int n = 128;
  const auto x = test::random_vector(n * 512, 1), w = test::random_vector(256 * 512, 2),
             b = test::random_vector(256, 3), dy = test::random_vector(n * 256, 4);
  std::vector<float> y(n * 256), dx(n * 512), dw(256 * 512), db(256);
  op->forward(n, x.data(), w.data(), b.data(), y.data());
  op->backward(n, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), false);
  const auto y0 = y, dx0 = dx, dw0 = dw;

  std::atomic<bool> done{false};
  std::thread storm([&] {
    while (!done.load()) {
      kill(getpid(), SIGUSR1);
      usleep(200);
    }
  });
  for (int i = 0; i < 300; ++i) {
    op->forward(n, x.data(), w.data(), b.data(), y.data());
    op->backward(n, x.data(), w.data(), dy.data(), dx.data(), dw.data(), db.data(), false);
    ASSERT_EQ(y, y0);
    ASSERT_EQ(dx, dx0);
    ASSERT_EQ(dw, dw0);
  }
  done.store(true);
  storm.join();
  usleep(300 * 1000);  // the watcher polls every 100 ms
  EXPECT_EQ(stop_signal_received(), SIGUSR1);
  EXPECT_STREQ(signal_name(SIGUSR1), "SIGUSR1");
}

}  // namespace
}  // namespace ddpv
