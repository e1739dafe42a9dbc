// The BLAS libtorch runs on decides CPU training speed (DESIGN.md,
// "Performance notes"). Debian's libtorch calls libblas.so.3; with OpenBLAS
// built for DYNAMIC_ARCH, the kernel set is chosen from CPUID at load time,
// and on virtual CPUs that report a generic model name it falls back to the
// SSE3 "Prescott" kernels even when the CPU has AVX2/AVX-512 (measured on
// this project's 2-core VMs: MLP training 11k -> 29k samples/s per core with
// OPENBLAS_CORETYPE=SkylakeX). These helpers detect that and name the fix.
#pragma once

#include <string>

namespace distopt {

/// The OpenBLAS kernel set in use ("Prescott", "Haswell", "SkylakeX"), or ""
/// if the process's BLAS is not OpenBLAS. Thread-safe.
std::string openblas_core_name();

/// The OPENBLAS_CORETYPE this CPU supports best ("SkylakeX" with
/// AVX-512F/BW/VL/DQ, "Haswell" with AVX2+FMA), or "" if none of those.
std::string best_openblas_coretype();

/// The OPENBLAS_CORETYPE to set for processes started from here, or "" when
/// nothing should change: the user set OPENBLAS_CORETYPE already, the BLAS is
/// not OpenBLAS, or OpenBLAS already uses at least the best kernel set.
/// $DISTOPT_BLAS_AUTOTUNE=0 turns the fix off.
std::string openblas_coretype_fix();

/// If openblas_coretype_fix() names a kernel set, set OPENBLAS_CORETYPE and
/// re-execute this program (/proc/self/exe) with the same argv, so the BLAS
/// is initialised anew; returns only if no re-exec was needed or it failed.
/// Call first thing in main(), before any thread starts.
void reexec_with_better_blas(char** argv);

}  // namespace distopt
