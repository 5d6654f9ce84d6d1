"""PyTorch twins of the ddpvision model zoo, with the same state_dict names and shapes.

Used by tests/golden/make_golden.py (golden tensors), scripts/export_torch.py (checkpoint ->
torch) and bench/peer/torch_ddp.py (the PyTorch DDP baseline). Keep in step with src/nn/zoo.cpp.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class LeNet(nn.Module):
    """conv 32 -> pool -> conv 64 -> pool -> fc 128 -> fc classes (5x5 kernels, padding 2)."""

    def __init__(self, in_hwc=(28, 28, 1), classes=10):
        super().__init__()
        h, w, c = in_hwc
        self.conv1 = nn.Conv2d(c, 32, 5, padding=2)
        self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
        self.fc1 = nn.Linear(64 * (h // 4) * (w // 4), 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        return self.fc2(F.relu(self.fc1(x)))


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:  # option B: 1x1 projection + BatchNorm
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        sc = x if self.downsample is None else self.downsample(x)
        return F.relu(out + sc)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.downsample = None
        if stride != 1 or inplanes != planes * 4:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        sc = x if self.downsample is None else self.downsample(x)
        return F.relu(out + sc)


class CifarResNet(nn.Module):
    """He et al. 2016 CIFAR ResNet (6n+2 layers), projection shortcuts (option B)."""

    def __init__(self, depth, in_hwc=(32, 32, 3), classes=10):
        super().__init__()
        n = (depth - 2) // 6
        self.conv1 = nn.Conv2d(in_hwc[2], 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        inplanes = 16
        for i, planes in enumerate([16, 32, 64]):
            blocks = []
            for b in range(n):
                blocks.append(BasicBlock(inplanes, planes, 2 if (i > 0 and b == 0) else 1))
                inplanes = planes
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


class ImageNetResNet(nn.Module):
    """torchvision's ResNet-18 / ResNet-50 layout (v1.5)."""

    def __init__(self, block, layers, in_hwc=(224, 224, 3), classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(in_hwc[2], 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        inplanes = 64
        for i, (planes, n) in enumerate(zip([64, 128, 256, 512], layers)):
            blocks = []
            for b in range(n):
                blocks.append(block(inplanes, planes, 2 if (i > 0 and b == 0) else 1))
                inplanes = planes * block.expansion
            setattr(self, f"layer{i + 1}", nn.Sequential(*blocks))
        self.fc = nn.Linear(512 * block.expansion, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def make_model(name, in_hwc, classes):
    if name == "lenet":
        return LeNet(in_hwc, classes)
    if name == "resnet20":
        return CifarResNet(20, in_hwc, classes)
    if name == "resnet56":
        return CifarResNet(56, in_hwc, classes)
    if name == "resnet18":
        return ImageNetResNet(BasicBlock, [2, 2, 2, 2], in_hwc, classes)
    if name == "resnet50":
        return ImageNetResNet(Bottleneck, [3, 4, 6, 3], in_hwc, classes)
    raise ValueError(f"unknown model {name}")
