// The libtorch headers most of distopt's translation units include,
// precompiled once per kind of target (core, plugins, executables: see
// distopt_use_torch_pch in the top-level CMakeLists.txt). Parsing them
// costs about 6 s per translation unit on the 2-core CI machine; loading the
// precompiled form about 2 s. Only headers every such unit may see: no
// project header (a change there would rebuild everything).
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
