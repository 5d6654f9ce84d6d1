// The model zoo: LeNet-style CNN, CIFAR ResNets (20, 56) and ImageNet ResNets (18, 50).
#include <algorithm>

#include "ddpv/nn/layers.hpp"
#include "ddpv/nn/model.hpp"

namespace ddpv {
namespace {

using Layers = std::vector<std::unique_ptr<Layer>>;

// conv 32 -> pool -> conv 64 -> pool -> fc 128 -> fc classes (5x5 convolutions, padding 2).
Layers lenet(int classes) {
  Layers l;
  l.push_back(make_conv2d("conv1", 32, 5, 1, 2, true, false));
  l.push_back(make_relu("relu1"));
  l.push_back(make_maxpool2d("pool1", 2, 2, 0));
  l.push_back(make_conv2d("conv2", 64, 5, 1, 2, true, false));
  l.push_back(make_relu("relu2"));
  l.push_back(make_maxpool2d("pool2", 2, 2, 0));
  l.push_back(make_flatten("flatten"));
  l.push_back(make_linear("fc1", 128, true));
  l.push_back(make_relu("relu3"));
  l.push_back(make_linear("fc2", classes, true));
  return l;
}

// He et al. 2016, section 4.2: 6n+2 layers, stages of 16, 32, 64 channels.
Layers cifar_resnet(int depth, int classes) {
  const int n = (depth - 2) / 6;
  Layers l;
  l.push_back(make_conv2d("conv1", 16, 3, 1, 1, false, true));
  l.push_back(make_batchnorm2d("bn1"));
  l.push_back(make_relu("relu"));
  const int planes[3] = {16, 32, 64};
  for (int stage = 0; stage < 3; ++stage) {
    for (int b = 0; b < n; ++b) {
      const std::string name = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
      l.push_back(make_basic_block(name, planes[stage], (stage > 0 && b == 0) ? 2 : 1));
    }
  }
  l.push_back(make_global_avgpool("avgpool"));
  l.push_back(make_flatten("flatten"));
  l.push_back(make_linear("fc", classes, true));
  return l;
}

// torchvision's ResNet-18 / ResNet-50 (v1.5: the stride sits in the 3x3 convolution).
Layers imagenet_resnet(bool bottleneck, const int (&blocks)[4], int classes) {
  Layers l;
  l.push_back(make_conv2d("conv1", 64, 7, 2, 3, false, true));
  l.push_back(make_batchnorm2d("bn1"));
  l.push_back(make_relu("relu"));
  l.push_back(make_maxpool2d("maxpool", 3, 2, 1));
  const int planes[4] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    for (int b = 0; b < blocks[stage]; ++b) {
      const std::string name = "layer" + std::to_string(stage + 1) + "." + std::to_string(b);
      const int stride = (stage > 0 && b == 0) ? 2 : 1;
      l.push_back(bottleneck ? make_bottleneck(name, planes[stage], stride)
                             : make_basic_block(name, planes[stage], stride));
    }
  }
  l.push_back(make_global_avgpool("avgpool"));
  l.push_back(make_flatten("flatten"));
  l.push_back(make_linear("fc", classes, true));
  return l;
}

}  // namespace

std::vector<std::string> model_names() {
  return {"lenet", "resnet20", "resnet56", "resnet18", "resnet50"};
}

std::unique_ptr<Model> make_model(const std::string& name, Backend& backend, const Shape& input_hwc,
                                  int num_classes) {
  DDPV_CHECK(input_hwc.rank() == 3 && input_hwc.numel() > 0, "model input must be (H, W, C), got ",
             input_hwc.str());
  DDPV_CHECK(num_classes >= 2, "a classifier needs at least 2 classes, got ", num_classes);
  Layers layers;
  if (name == "lenet") {
    layers = lenet(num_classes);
  } else if (name == "resnet20") {
    layers = cifar_resnet(20, num_classes);
  } else if (name == "resnet56") {
    layers = cifar_resnet(56, num_classes);
  } else if (name == "resnet18") {
    const int blocks[4] = {2, 2, 2, 2};
    layers = imagenet_resnet(false, blocks, num_classes);
  } else if (name == "resnet50") {
    const int blocks[4] = {3, 4, 6, 3};
    layers = imagenet_resnet(true, blocks, num_classes);
  } else {
    std::string known;
    for (const auto& m : model_names()) known += (known.empty() ? "" : ", ") + m;
    DDPV_FAIL("unknown model '", name, "': choose one of ", known);
  }
  return std::make_unique<Model>(name, backend, std::move(layers), input_hwc, num_classes);
}

}  // namespace ddpv
