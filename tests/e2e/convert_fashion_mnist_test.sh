#!/usr/bin/env bash
# The real Fashion-MNIST of the Debian package dataset-fashion-mnist converts to a store that
# inspect validates: 60000 train and 10000 test images of 28x28x1, 10 classes; h5dump reads it.
set -uo pipefail
convert="${DDPV_BIN_DIR:?}/ddpv-convert"
src=/usr/share/datasets/fashion-mnist
[[ -x "$convert" ]] || { echo "skip: $convert not built"; exit 77; }
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
         t10k-labels-idx1-ubyte.gz; do
  [[ -f "$src/$f" ]] || { echo "skip: $src/$f missing (apt-get install dataset-fashion-mnist)"; exit 77; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

start=$(date +%s%N)
"$convert" idx --preset fashion-mnist \
  --train-images "$src/train-images-idx3-ubyte.gz" --train-labels "$src/train-labels-idx1-ubyte.gz" \
  --test-images "$src/t10k-images-idx3-ubyte.gz" --test-labels "$src/t10k-labels-idx1-ubyte.gz" \
  --out "$work/fashion.h5" || fail "conversion exited $?"
end=$(date +%s%N)
echo "conversion took $(( (end - start) / 1000000 )) ms"
[[ -f "$work/fashion.h5" && ! -e "$work/fashion.h5.tmp" ]] || fail "store missing or .tmp left"

"$convert" inspect "$work/fashion.h5" --read-all >"$work/inspect.txt" || fail "inspect exited $?"
cat "$work/inspect.txt"
grep -q "^split train  60000 images" "$work/inspect.txt" || fail "train split is not 60000 images"
grep -q "^split test   10000 images" "$work/inspect.txt" || fail "test split is not 10000 images"
grep -q "^images      28x28x1" "$work/inspect.txt" || fail "images are not 28x28x1"
grep -q "^classes     10$" "$work/inspect.txt" || fail "not 10 classes"
grep -q "Ankle boot: 6000" "$work/inspect.txt" || fail "class names or counts wrong"
# Fashion-MNIST's published statistics: mean 0.2860, std 0.3530.
grep -q "^mean        \[0.2860\]" "$work/inspect.txt" || fail "train mean is not 0.2860"
grep -q "^std         \[0.3530\]" "$work/inspect.txt" || fail "train std is not 0.3530"

if command -v h5dump >/dev/null; then
  h5dump -H "$work/fashion.h5" >"$work/dump.txt" || fail "h5dump -H failed"
  grep -q "DATASPACE  SIMPLE { ( 60000, 28, 28, 1 )" "$work/dump.txt" || fail "h5dump: train images"
  grep -q "DATASPACE  SIMPLE { ( 10000 )" "$work/dump.txt" || fail "h5dump: test labels"
  h5dump -a /format "$work/fashion.h5" | grep -q '"ddpvision-image-store"' || fail "h5dump: format"
fi
echo "ok"
