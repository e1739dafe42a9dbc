// Include doctest after libtorch: libtorch pulls in glog, whose CHECK macros
// would shadow doctest's. Include this last in a test that uses torch.
#pragma once

#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE
#include <doctest/doctest.h>
