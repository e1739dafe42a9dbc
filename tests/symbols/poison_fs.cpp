// Test-only stand-in for PyTorch's libtorch (tests/symbols/CMakeLists.txt):
// it EXPORTS the std::filesystem symbols that distopt's binaries used to
// import, as libtorch exports its statically linked copies of them
// (pytorch/pytorch issue 133437), and each one says which it is and aborts.
// Preloaded (LD_PRELOAD) ahead of libstdc++, it receives every such call a
// process makes, as libtorch's copies did on the GPU machine, where
// std::filesystem::remove_all jumped to address 0.
//
// The functions are defined by their mangled names (asm labels), so this
// file needs no <filesystem> and imports nothing of it itself. An
// unversioned definition satisfies the versioned (@GLIBCXX_3.4.26)
// references. The list is what `nm -D --undefined-only` showed in the build
// of commit 6453ff9 (libdistopt_core, bin/distopt, the tests) plus a few
// neighbours (create_symlink, relative, current_path).
#include <cstdio>
#include <cstdlib>

#define DISTOPT_POISON(n, mangled, name)                                                  \
  extern "C" __attribute__((visibility("default"))) void poisoned_##n() __asm__(mangled); \
  extern "C" void poisoned_##n() {                                                        \
    std::fputs("poisoned std::filesystem::" name " called\n", stderr);                    \
    std::fflush(stderr);                                                                  \
    std::abort();                                                                         \
  }

DISTOPT_POISON(0, "_ZNKSt10filesystem7__cxx1118directory_iteratordeEv",
               "directory_iterator::operator*() const")
DISTOPT_POISON(1, "_ZNKSt10filesystem7__cxx1128recursive_directory_iteratordeEv",
               "recursive_directory_iterator::operator*() const")
DISTOPT_POISON(2, "_ZNKSt10filesystem7__cxx114path11parent_pathEv", "path::parent_path() const")
DISTOPT_POISON(3, "_ZNKSt10filesystem7__cxx114path16lexically_normalEv",
               "path::lexically_normal() const")
DISTOPT_POISON(4, "_ZNKSt10filesystem7__cxx114path17_M_find_extensionEv",
               "path::_M_find_extension() const")
DISTOPT_POISON(5, "_ZNKSt10filesystem7__cxx114path18has_root_directoryEv",
               "path::has_root_directory() const")
DISTOPT_POISON(6, "_ZNKSt10filesystem7__cxx114path5_List13_Impl_deleterclEPNS2_5_ImplE",
               "path::_List::_Impl_deleter::operator()(path::_List::_Impl*) const")
DISTOPT_POISON(7, "_ZNKSt10filesystem7__cxx114path5_List3endEv", "path::_List::end() const")
DISTOPT_POISON(8, "_ZNKSt10filesystem7__cxx114path7compareERKS1_",
               "path::compare(path const&) const")
DISTOPT_POISON(9, "_ZNSt10filesystem10equivalentERKNS_7__cxx114pathES3_RSt10error_code",
               "equivalent(path const&, path const&, error_code&)")
DISTOPT_POISON(10, "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathE", "remove_all(path const&)")
DISTOPT_POISON(11, "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathERSt10error_code",
               "remove_all(path const&, error_code&)")
DISTOPT_POISON(12, "_ZNSt10filesystem12current_pathB5cxx11Ev", "current_path[abi:cxx11]()")
DISTOPT_POISON(13, "_ZNSt10filesystem14create_symlinkERKNS_7__cxx114pathES3_",
               "create_symlink(path const&, path const&)")
DISTOPT_POISON(14, "_ZNSt10filesystem18create_directoriesERKNS_7__cxx114pathE",
               "create_directories(path const&)")
DISTOPT_POISON(15, "_ZNSt10filesystem19temp_directory_pathB5cxx11Ev",
               "temp_directory_path[abi:cxx11]()")
DISTOPT_POISON(16, "_ZNSt10filesystem6removeERKNS_7__cxx114pathE", "remove(path const&)")
DISTOPT_POISON(17, "_ZNSt10filesystem6statusERKNS_7__cxx114pathE", "status(path const&)")
DISTOPT_POISON(18, "_ZNSt10filesystem6statusERKNS_7__cxx114pathERSt10error_code",
               "status(path const&, error_code&)")
DISTOPT_POISON(19, "_ZNSt10filesystem7__cxx1118directory_iterator9incrementERSt10error_code",
               "directory_iterator::increment(error_code&)")
DISTOPT_POISON(
    20,
    "_ZNSt10filesystem7__cxx1118directory_iteratorC1ERKNS0_4pathENS_17directory_optionsEPSt10error_"
    "code",
    "directory_iterator::directory_iterator(path const&, directory_options, error_code*)")
DISTOPT_POISON(21, "_ZNSt10filesystem7__cxx1118directory_iteratorppEv",
               "directory_iterator::operator++()")
DISTOPT_POISON(22,
               "_ZNSt10filesystem7__cxx1128recursive_directory_iteratorC1ERKNS0_4pathENS_"
               "17directory_optionsEPSt10error_code",
               "recursive_directory_iterator::recursive_directory_iterator(path const&, "
               "directory_options, error_code*)")
DISTOPT_POISON(23, "_ZNSt10filesystem7__cxx1128recursive_directory_iteratorD1Ev",
               "recursive_directory_iterator::~recursive_directory_iterator()")
DISTOPT_POISON(24, "_ZNSt10filesystem7__cxx1128recursive_directory_iteratorppEv",
               "recursive_directory_iterator::operator++()")
DISTOPT_POISON(25, "_ZNSt10filesystem7__cxx114path14_M_split_cmptsEv", "path::_M_split_cmpts()")
DISTOPT_POISON(26, "_ZNSt10filesystem7__cxx114path5_ListC1ERKS2_",
               "path::_List::_List(path::_List const&)")
DISTOPT_POISON(27, "_ZNSt10filesystem7__cxx114path5_ListC1Ev", "path::_List::_List()")
DISTOPT_POISON(28, "_ZNSt10filesystem7__cxx114pathdVERKS1_", "path::operator/=(path const&)")
DISTOPT_POISON(29, "_ZNSt10filesystem8absoluteERKNS_7__cxx114pathE", "absolute(path const&)")
DISTOPT_POISON(30, "_ZNSt10filesystem8absoluteERKNS_7__cxx114pathERSt10error_code",
               "absolute(path const&, error_code&)")
DISTOPT_POISON(31, "_ZNSt10filesystem8relativeERKNS_7__cxx114pathES3_",
               "relative(path const&, path const&)")
DISTOPT_POISON(32, "_ZNSt10filesystem9copy_fileERKNS_7__cxx114pathES3_NS_12copy_optionsE",
               "copy_file(path const&, path const&, copy_options)")
