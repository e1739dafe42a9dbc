// OpenBLAS kernel-set detection and the OPENBLAS_CORETYPE fix (see blas.hpp).
#include "distopt/blas.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "base/services.hpp"

namespace distopt {

std::string openblas_core_name() {
  using CoreName = char* (*)();
  auto fn = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!fn) return "";
  const char* name = fn();
  return name ? name : "";
}

std::string best_openblas_coretype() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return "";
}

std::string openblas_coretype_rule(const std::string& current, const std::string& best) {
  if (current.empty() || best.empty() || strcasecmp(current.c_str(), best.c_str()) == 0) return "";
  // Only the generic fallbacks are replaced: a kernel set OpenBLAS picked on
  // purpose for a CPU it recognised is left alone.
  for (const char* generic : {"Prescott", "Core2", "Nehalem", "Sandybridge", "Katmai", "Coppermine",
                              "Northwood", "Banias", "Atom", "Penryn", "Dunnington"}) {
    if (strcasecmp(current.c_str(), generic) == 0) return best;
  }
  // OpenBLAS 0.3.21 falls back to Haswell for AVX-512 CPUs of models it does
  // not know (hypervisors that hide the model).
  if (best == "SkylakeX" && strcasecmp(current.c_str(), "Haswell") == 0) return best;
  return "";
}

std::string openblas_coretype_fix() {
  if (std::getenv("OPENBLAS_CORETYPE")) return "";
  const char* autotune = std::getenv("DISTOPT_BLAS_AUTOTUNE");
  if (autotune && std::strcmp(autotune, "0") == 0) return "";
  return openblas_coretype_rule(openblas_core_name(), best_openblas_coretype());
}

std::string openblas_threading() {
  using GetParallel = int (*)();
  auto fn = reinterpret_cast<GetParallel>(dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  if (!fn) return "";
  switch (fn()) {
    case 0:
      return "sequential";
    case 1:
      return "pthreads";
    case 2:
      return "OpenMP";
    default:
      return "unknown";
  }
}

std::string blas_description() {
  const std::string core = openblas_core_name();
  if (core.empty()) return "not OpenBLAS";
  std::string s = "OpenBLAS, " + core + " kernels, " + openblas_threading() + " threading";
  if (std::string was = openblas_replaced_core(); !was.empty())
    s += " (OpenBLAS chose " + was + "; OPENBLAS_CORETYPE set by distopt)";
  return s;
}

std::string openblas_replaced_core() {
  const char* v = std::getenv("DISTOPT_BLAS_REEXEC");
  return v ? v : "";
}

void reexec_with_better_blas(char** argv) {
  std::string fix = openblas_coretype_fix();
  if (fix.empty()) return;
  std::string current = openblas_core_name();
  setenv("OPENBLAS_CORETYPE", fix.c_str(), 1);
  // Marker so a BLAS that ignores OPENBLAS_CORETYPE cannot cause a loop.
  if (std::getenv("DISTOPT_BLAS_REEXEC")) return;
  setenv("DISTOPT_BLAS_REEXEC", current.c_str(), 1);
  execv("/proc/self/exe", argv);
  log(DOPT_LOG_WARN, "blas",
      "could not re-execute with OPENBLAS_CORETYPE=" + fix + ": " + std::strerror(errno));
}

}  // namespace distopt
