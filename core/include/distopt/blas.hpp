// The BLAS libtorch runs on decides CPU training speed (share/doc/distopt/DESIGN.md,
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

/// distopt's rule, as a pure function of OpenBLAS's own choice `current` and
/// best_openblas_coretype() `best`: "" (keep `current`) unless `current` is a
/// generic fallback (Prescott, Core2, Nehalem, Sandybridge, ... as OpenBLAS
/// picks for a CPU model it does not recognise, e.g. a virtual CPU) or
/// Haswell where the CPU has AVX-512; then `best`. A kernel set OpenBLAS
/// chose for a CPU it recognised (Cooperlake, SkylakeX, Zen, ...) is kept.
/// Case-insensitive. Thread-safe.
std::string openblas_coretype_rule(const std::string& current, const std::string& best);

/// The OPENBLAS_CORETYPE to set for processes started from here, or "" when
/// nothing should change: the user set OPENBLAS_CORETYPE already, the BLAS is
/// not OpenBLAS, or openblas_coretype_rule() keeps OpenBLAS's choice.
/// $DISTOPT_BLAS_AUTOTUNE=0 turns the fix off.
std::string openblas_coretype_fix();

/// If openblas_coretype_fix() names a kernel set, set OPENBLAS_CORETYPE and
/// re-execute this program (/proc/self/exe) with the same argv, so the BLAS
/// is initialised anew; returns only if no re-exec was needed or it failed.
/// The re-executed process finds OpenBLAS's own choice in
/// $DISTOPT_BLAS_REEXEC (see openblas_replaced_core()).
/// Call first thing in main(), before any thread starts.
void reexec_with_better_blas(char** argv);

/// How OpenBLAS runs its threads: "OpenMP", "pthreads", "sequential", or ""
/// if the process's BLAS is not OpenBLAS. The pthread build keeps a pool of
/// its own that spins against libtorch's OpenMP pool (2 threads 2.4x
/// slower than 1); tools/setup.sh selects the OpenMP build. Thread-safe.
std::string openblas_threading();

/// One line for logs: "OpenBLAS, SkylakeX kernels, OpenMP threading" plus,
/// when distopt replaced OpenBLAS's own choice, "(OpenBLAS chose Prescott;
/// OPENBLAS_CORETYPE set by distopt)"; "not OpenBLAS" otherwise.
std::string blas_description();

/// The kernel set OpenBLAS chose by itself before reexec_with_better_blas()
/// replaced it in this process, or "" if it was not replaced. Thread-safe.
std::string openblas_replaced_core();

}  // namespace distopt
