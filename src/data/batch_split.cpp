// Balanced batches: splits of a step's global batch, and the queue of the splits to come.
#include "ddpv/data/batch_split.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ddpv/core/error.hpp"

namespace ddpv {

SplitBounds split_bounds(int64_t batch, int world) {
  DDPV_CHECK(world > 0 && batch > 0, "bad split: ", world, " ranks of ", batch);
  SplitBounds b;
  while (b.quantum * 2 <= batch / 16 && batch % (b.quantum * 2) == 0) b.quantum *= 2;
  b.lo = std::max(b.quantum, batch / 4 / b.quantum * b.quantum);
  b.hi = std::min(2 * batch, world * batch - (world - 1) * b.lo);
  return b;
}

std::vector<int64_t> equal_split(int world, int64_t batch) {
  DDPV_CHECK(world > 0 && batch > 0, "bad split: ", world, " ranks of ", batch);
  return std::vector<int64_t>(static_cast<size_t>(world), batch);
}

std::vector<int64_t> first_split(const std::vector<int64_t>& given, int world, int64_t batch) {
  if (given.empty()) return equal_split(world, batch);
  check_split(given, world, batch);
  return given;
}

int64_t split_capacity(const std::vector<int64_t>& first, int world, int64_t batch) {
  return std::max(split_bounds(batch, world).hi, *std::max_element(first.begin(), first.end()));
}

int64_t split_offset(const std::vector<int64_t>& sizes, int rank) {
  return std::accumulate(sizes.begin(), sizes.begin() + rank, int64_t{0});
}

int64_t split_total(const std::vector<int64_t>& sizes) {
  return std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
}

std::string split_text(const std::vector<int64_t>& sizes) {
  std::string out;
  for (int64_t n : sizes) {
    if (!out.empty()) out += '/';
    out += std::to_string(n);
  }
  return out;
}

std::string speeds_text(const std::vector<double>& speeds) {
  std::vector<int64_t> rounded;
  for (double v : speeds) rounded.push_back(std::llround(v));
  return split_text(rounded);
}

void check_split(const std::vector<int64_t>& sizes, int world, int64_t batch, const char* what) {
  const bool positive = std::all_of(sizes.begin(), sizes.end(), [](int64_t n) { return n >= 1; });
  DDPV_CHECK(
      static_cast<int>(sizes.size()) == world && positive && split_total(sizes) == batch * world,
      what, " ", split_text(sizes), ": give one size per rank (", world,
      "), each at least 1, summing to ", batch * world, " (", world, " x --batch-size ", batch,
      ")");
}

namespace {
// Hands `units` more to the entries with the largest fractional parts of ideal - base (the
// lower index on a tie), none beyond cap[i].
void give_largest_remainders(std::vector<int64_t>& base, const std::vector<double>& ideal,
                             const std::vector<int64_t>& cap, int64_t units) {
  std::vector<size_t> order(base.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ideal[a] - static_cast<double>(base[a]) > ideal[b] - static_cast<double>(base[b]);
  });
  while (units > 0) {
    bool gave = false;
    for (size_t i : order) {
      if (units == 0) break;
      if (base[i] < cap[i]) {
        ++base[i];
        --units;
        gave = true;
      }
    }
    DDPV_CHECK(gave, "balanced split: nowhere to put ", units, " more (internal)");
  }
}
}  // namespace

std::vector<int64_t> shrink_split(const std::vector<int64_t>& sizes, int64_t total) {
  const auto w = static_cast<int64_t>(sizes.size());
  const int64_t full = split_total(sizes);
  DDPV_CHECK(total >= w && total <= full, "an epoch's last step of ", total, " samples for ", w,
             " ranks (internal)");
  std::vector<int64_t> out(sizes.size());
  std::vector<double> ideal(sizes.size());
  const int64_t rest = total - w;
  for (size_t r = 0; r < sizes.size(); ++r) {
    ideal[r] =
        static_cast<double>(rest) * static_cast<double>(sizes[r]) / static_cast<double>(full);
    out[r] = static_cast<int64_t>(std::floor(ideal[r]));
  }
  const int64_t left = rest - split_total(out);
  give_largest_remainders(out, ideal, std::vector<int64_t>(sizes.size(), rest), left);
  for (int64_t& n : out) ++n;
  return out;
}

std::vector<int64_t> balanced_split(const std::vector<double>& rates, int64_t global,
                                    int64_t quantum, int64_t lo, int64_t hi) {
  const size_t w = rates.size();
  const auto wi = static_cast<int64_t>(w);
  DDPV_CHECK(w > 0 && quantum > 0 && global % quantum == 0 && lo % quantum == 0 &&
                 hi % quantum == 0 && lo > 0 && wi * lo <= global && global <= wi * hi,
             "balanced split: bad bounds (internal)");
  for (double v : rates) DDPV_CHECK(std::isfinite(v) && v > 0, "balanced split: rate ", v);
  // Proportional shares, with the ranks that fall outside [lo, hi] pinned to the bound and the
  // rest shared again among the others, until no share moves.
  std::vector<double> x(w);
  std::vector<char> pinned(w, 0);
  for (bool moved = true; moved;) {
    moved = false;
    double free_rate = 0, free_global = static_cast<double>(global);
    for (size_t r = 0; r < w; ++r) {
      if (pinned[r])
        free_global -= x[r];
      else
        free_rate += rates[r];
    }
    for (size_t r = 0; r < w; ++r) {
      if (pinned[r]) continue;
      x[r] = free_global * rates[r] / free_rate;
      if (x[r] < static_cast<double>(lo) || x[r] > static_cast<double>(hi)) {
        x[r] = std::clamp(x[r], static_cast<double>(lo), static_cast<double>(hi));
        pinned[r] = 1;
        moved = true;
      }
    }
  }
  // Whole quanta: the floors, then the leftover ones to the largest remainders.
  std::vector<int64_t> units(w);
  std::vector<double> ideal(w);
  for (size_t r = 0; r < w; ++r) {
    ideal[r] = x[r] / static_cast<double>(quantum);
    units[r] =
        std::clamp(static_cast<int64_t>(std::floor(ideal[r] + 1e-9)), lo / quantum, hi / quantum);
  }
  int64_t left = global / quantum - split_total(units);
  // Pinning leaves the shares summing to global up to rounding, so this trims at most one
  // quantum per rank of float error.
  for (size_t r = w; left < 0 && r-- > 0;) {
    if (units[r] > lo / quantum) {
      --units[r];
      ++left;
    }
  }
  give_largest_remainders(units, ideal, std::vector<int64_t>(w, hi / quantum), left);
  for (int64_t& u : units) u *= quantum;
  return units;
}

double split_step_time(const std::vector<int64_t>& sizes, const std::vector<double>& rates) {
  double t = 0;
  for (size_t r = 0; r < sizes.size(); ++r)
    t = std::max(t, static_cast<double>(sizes[r]) / rates[r]);
  return t;
}

SplitQueue::SplitQueue(const std::vector<int64_t>& first, int lookahead) {
  DDPV_CHECK(lookahead >= 1, "split queue: lookahead ", lookahead);
  for (int k = 0; k < lookahead; ++k) q_.push_back(first);
}

void SplitQueue::push(std::vector<int64_t> sizes) { q_.push_back(std::move(sizes)); }

const std::vector<int64_t>& SplitQueue::at(int64_t seq) const {
  DDPV_CHECK(seq >= base_ && has(seq), "split of batch ", seq, " not known (queue holds ", base_,
             "..", pushed() - 1, "; internal)");
  return q_[static_cast<size_t>(seq - base_)];
}

void SplitQueue::forget_before(int64_t seq) {
  while (base_ < seq && !q_.empty()) {
    q_.pop_front();
    ++base_;
  }
}

}  // namespace ddpv
